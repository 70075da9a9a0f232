package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/store"
)

// Calls queued at an object while it is busy run as one batch (group
// commit): each in its own savepoint, so a call that fails, panics or
// traps (breaking the instance) rolls back alone and gets its own error,
// while the others commit together. Followers and stream subscribers see
// the committed calls' events once each, in order, and nothing of the
// failed ones.
//
// Under --sync full the batch's commit is made durable by the object's
// output gate, after the commit: the same holds.
func TestGroupCommitFailingCallRollsBackAlone(t *testing.T) {
	t.Parallel()
	for _, mode := range []store.Sync{store.SyncNormal, store.SyncFull} {
		t.Run("sync="+string(mode), func(t *testing.T) {
			t.Parallel()
			groupCommitFailingCall(t, mode)
		})
	}
}

func groupCommitFailingCall(t *testing.T, mode store.Sync) {
	n, c := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) { c.Sync = mode }})
	ctx := context.Background()
	g := host.ObjectID{Program: "hostile", ID: "g"}
	if _, err := c.Call(ctx, "hostile/f", "follow", []byte(`{"publisher":"hostile/g","topic":"t"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Call(ctx, g, "publish", []byte(`"a0"`)); err != nil {
		t.Fatal(err)
	}
	// Each failing method once, so the object knows them as quick (a
	// method never seen starts a batch of its own); they commit nothing.
	for _, m := range []string{"publish_then_fail", "trap", "panic"} {
		if _, err := n.Call(ctx, g, m, nil); err == nil {
			t.Fatalf("%s succeeded", m)
		}
	}

	// A subscriber from after a0.
	var (
		mu     sync.Mutex
		stream []string
	)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	after := uint64(1)
	go c.Subscribe(sctx, "hostile/g", hclient.SubscribeOptions{Topic: "t", After: &after}, func(data []byte) bool {
		var ev struct {
			Seq     uint64          `json:"seq"`
			Payload json.RawMessage `json:"payload"`
		}
		json.Unmarshal(data, &ev)
		mu.Lock()
		stream = append(stream, fmt.Sprintf("%d %s", ev.Seq, ev.Payload))
		mu.Unlock()
		return true
	})

	commits0 := metric(t, c, "host_commit_calls_count")
	calls0 := metric(t, c, "host_commit_calls_sum")

	// Hold the object while the calls queue up, in this order.
	calls := []struct{ method, payload, wantErr string }{
		{"publish", `"a1"`, ""},
		{"publish_then_fail", "", "failed after publishing"},
		{"trap", "", "trap"},
		{"publish", `"a2"`, ""},
		{"panic", "", "on purpose"},
		{"publish", `"a3"`, ""},
	}
	release := host.HoldObject(t, n, g)
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.Call(ctx, g, call.method, []byte(call.payload))
		}()
		waitUntil(t, fmt.Sprintf("call %d queued", i), 10*time.Second, func() bool { return host.QueuedCalls(n, g) == i+1 })
	}
	release()
	wg.Wait()

	for i, call := range calls {
		switch {
		case call.wantErr == "" && errs[i] != nil:
			t.Errorf("%s %s: %v, want success", call.method, call.payload, errs[i])
		case call.wantErr != "" && (errs[i] == nil || !strings.Contains(strings.ToLower(errs[i].Error()), call.wantErr)):
			t.Errorf("%s: %v, want an error with %q", call.method, errs[i], call.wantErr)
		}
	}
	// One commit covered the three calls that succeeded.
	if d, s := metric(t, c, "host_commit_calls_count")-commits0, metric(t, c, "host_commit_calls_sum")-calls0; d != 1 || s != 3 {
		t.Errorf("%v commits covering %v calls, want 1 covering 3", d, s)
	}
	// The failed calls' writes are gone ("touched" is what each wrote).
	if v, err := n.Call(ctx, g, "get", nil); err != nil || len(v) != 0 {
		t.Errorf("touched = %q (%v): a failed call's write committed", v, err)
	}
	want := []string{`2 "a1"`, `3 "a2"`, `4 "a3"`}
	waitUntil(t, "the subscriber has a1..a3", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(stream) >= len(want)
	})
	time.Sleep(50 * time.Millisecond) // anything after them would show now
	mu.Lock()
	if !slices.Equal(stream, want) {
		t.Errorf("stream %q, want %q", stream, want)
	}
	mu.Unlock()
	var got []string
	waitUntil(t, "the follower has received a0..a3", 10*time.Second, func() bool {
		out, err := n.Call(ctx, host.ObjectID{Program: "hostile", ID: "f"}, "received", nil)
		got = nil
		return err == nil && json.Unmarshal(out, &got) == nil && len(got) >= 4
	})
	wantF := []string{`hostile/g t 1 "a0"`, `hostile/g t 2 "a1"`, `hostile/g t 3 "a2"`, `hostile/g t 4 "a3"`}
	if !slices.Equal(got, wantF) {
		t.Errorf("follower received %q, want %q", got, wantF)
	}
}

// A call whose caller gives up while it waits in the queue is withdrawn
// and never runs; the others still run.
func TestGroupCommitWithdrawnCallNeverRuns(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"counter"}})
	ctx := context.Background()
	id := host.ObjectID{Program: "counter", ID: "w"}
	release := host.HoldObject(t, n, id)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := n.Call(cctx, id, "inc", nil)
		done <- err
	}()
	waitUntil(t, "the call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 1 })
	other := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "inc", nil)
		other <- err
	}()
	waitUntil(t, "the second call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 2 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the withdrawn call succeeded")
	}
	if q := host.QueuedCalls(n, id); q != 1 {
		t.Fatalf("%d calls queued after one was withdrawn, want 1", q)
	}
	release()
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	if v, err := n.Call(ctx, id, "get", nil); err != nil || string(v) != "1" {
		t.Fatalf("value %q (%v), want 1: only the call not withdrawn ran", v, err)
	}
}

// With copies, a batch stops growing before its change set gets too large
// to ship as one: the call that takes it past the bound is rolled back and
// runs first in the next batch. Every call succeeds once, in order.
// Under --sync full, so the output gate releases the batches' replies and
// the events after the batches' fsyncs, with a rolled back call's event
// seq taken again by the next.
func TestGroupCommitBoundsTheChangeSet(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 3, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) {
		c.Replicas, c.Sync = 1, store.SyncFull
	}})
	n := nodes[0]
	c := &hclient.Client{Base: n.URL()}
	ctx := context.Background()
	id := host.ObjectID{Program: "hostile", ID: "big"}
	if _, err := n.Call(ctx, id, "ok", nil); err != nil { // its home is node 0
		t.Fatal(err)
	}
	commits0 := metric(t, c, "host_commit_calls_count")
	calls0 := metric(t, c, "host_commit_calls_sum")
	release := host.HoldObject(t, n, id)
	const k = 4 // 100 KB each: the third takes the batch past 256 KB
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.Call(ctx, id, "publish", []byte(fmt.Sprintf(`{"topic":"t%d","size":100000}`, i)))
		}()
		waitUntil(t, fmt.Sprintf("call %d queued", i), 10*time.Second, func() bool { return host.QueuedCalls(n, id) == i+1 })
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if d, s := metric(t, c, "host_commit_calls_count")-commits0, metric(t, c, "host_commit_calls_sum")-calls0; d != 2 || s != k {
		t.Errorf("%v commits covering %v calls, want 2 covering %d", d, s, k)
	}
	var topics []string
	after := uint64(0)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c.Subscribe(sctx, "hostile/big", hclient.SubscribeOptions{After: &after}, func(data []byte) bool {
		var ev struct {
			Seq   uint64 `json:"seq"`
			Topic string `json:"topic"`
		}
		json.Unmarshal(data, &ev)
		topics = append(topics, fmt.Sprintf("%d %s", ev.Seq, ev.Topic))
		return len(topics) < k
	})
	if want := []string{"1 t0", "2 t1", "3 t2", "4 t3"}; !slices.Equal(topics, want) {
		t.Fatalf("events %q, want %q: each call once, in order", topics, want)
	}
}

// A call a batch took and then gave back unrun (the batch stopped
// growing) whose caller gave up meanwhile still gets its answer: the
// caller competes for the object again rather than waiting for a batch
// that will not come.
func TestGroupCommitCallGivenBackAfterItsCallerGaveUp(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) { c.VM.Budget = time.Second }})
	ctx := context.Background()
	id := host.ObjectID{Program: "hostile", ID: "back"}
	release := host.HoldObjectBatching(t, n, id, 10*time.Millisecond)
	loop := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "loop", nil) // runs out its 1 s budget
		loop <- err
	}()
	waitUntil(t, "the loop queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 1 })
	short := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := n.Call(cctx, id, "ok", nil)
		short <- err
	}()
	waitUntil(t, "the short call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 2 })
	release() // one batch takes both, runs the loop past 10 ms, gives the short call back
	select {
	case err := <-short:
		if err == nil {
			t.Fatal("the short call succeeded after its caller gave up")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the short call never got an answer")
	}
	if err := <-loop; err == nil {
		t.Fatal("the loop succeeded")
	}
	if v, err := n.Call(ctx, id, "ok", nil); err != nil || string(v) != "ok" {
		t.Fatalf("after: %q %v", v, err)
	}
}

// A quick call queued ahead of a slow one (or of one never seen on the
// object) is answered without waiting for it: the slow call starts a
// batch of its own instead of holding the quick call's reply until their
// shared commit.
func TestGroupCommitSlowCallDoesNotHoldBackTheBatch(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) { c.VM.Budget = 2 * time.Second }})
	ctx := context.Background()
	id := host.ObjectID{Program: "hostile", ID: "slow"}
	for range 3 {
		if _, err := n.Call(ctx, id, "ok", nil); err != nil { // known to be quick
			t.Fatal(err)
		}
	}
	release := host.HoldObjectAsIs(t, n, id)
	quick := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "ok", nil)
		quick <- err
	}()
	waitUntil(t, "the quick call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 1 })
	loop := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "loop", nil) // runs out its 2 s budget
		loop <- err
	}()
	waitUntil(t, "the slow call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 2 })
	released := time.Now()
	release()
	if err := <-quick; err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	<-loop
	if loopTook := time.Since(released); took > loopTook/2 {
		t.Fatalf("the quick call was answered %v after the object was free, the slow call behind it %v: it waited for the slow one", took, loopTook)
	}
}

// A method seen calling another object does not join a batch: the quick
// call queued before it is answered without waiting for its callee, even
// with every method counted quick.
func TestGroupCommitCallingMethodRunsInABatchOfItsOwn(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"ledger"}})
	ctx := context.Background()
	id := host.ObjectID{Program: "ledger", ID: "caller"}
	for _, m := range []struct{ method, payload string }{{"total", ""}, {"call", callPayload("ledger/callee", "total", "", "", "")}} {
		if _, err := n.Call(ctx, id, m.method, []byte(m.payload)); err != nil {
			t.Fatal(err)
		}
	}
	release := host.HoldObjectBatching(t, n, id, time.Hour)
	quick := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "total", nil)
		quick <- err
	}()
	waitUntil(t, "the quick call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 1 })
	calling := make(chan error, 1)
	go func() {
		_, err := n.Call(ctx, id, "call", []byte(callPayload("ledger/callee", "spin", "", "", "1000")))
		calling <- err
	}()
	waitUntil(t, "the calling call queued", 10*time.Second, func() bool { return host.QueuedCalls(n, id) == 2 })
	released := time.Now()
	release()
	if err := <-quick; err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	if err := <-calling; err != nil {
		t.Fatal(err)
	}
	if callTook := time.Since(released); took > callTook/2 {
		t.Fatalf("the quick call was answered %v after the object was free, the calling one behind it %v: it waited for the callee", took, callTook)
	}
}

// A batch's state writes and events wait in memory for its commit
// (store.Tx.Defer), so a write that does not fit the object's storage
// limit shows only at the commit. The batch then runs again writing
// through: the posts that fit commit, those past the limit fail with the
// storage limit's error, each its own, and the history holds exactly the
// acknowledged posts, by identity. Without the rerun every post of the
// batch would fail.
func TestGroupCommitPastTheStorageLimitFailsOnlyThePostsThatDoNotFit(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	tok := mkTenant(t, n, op, "full", `{"object_bytes":262144}`)
	wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
	room := host.ObjectID{Program: "full.chat", ID: "r"} // the tenant's namespace
	post := func(text string) response {
		return as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"a","text":"`+text+`"}`))
	}
	// Known as quick, so posts join batches.
	wantStatus(t, post("first"), http.StatusOK, "the first post")

	const k = 60 // 60 posts of 4 KB: about 240 KB, past the limit with the file's own pages
	hold := host.HoldObjectBatching(t, n, room, time.Minute)
	var once sync.Once
	release := func() { once.Do(hold) }
	defer release()
	res := make([]response, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = post(fmt.Sprintf("%03d%s", i, strings.Repeat("x", 4000)))
		}()
	}
	waitUntil(t, "the posts queued", 30*time.Second, func() bool { return host.QueuedCalls(n, room) == k })
	release()
	wg.Wait()

	var acked []string
	refused := 0
	for i, r := range res {
		switch r.status {
		case http.StatusOK:
			acked = append(acked, fmt.Sprintf("%03d", i))
		case http.StatusRequestEntityTooLarge:
			wantError(t, r, http.StatusRequestEntityTooLarge, "object storage limit")
			refused++
		default:
			t.Fatalf("post %d: HTTP %d %s", i, r.status, r.body)
		}
	}
	if len(acked) == 0 || refused == 0 {
		t.Fatalf("%d posts acknowledged and %d refused, want some of each: the limit falls inside the batch", len(acked), refused)
	}
	h := as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/history", []byte(`{"limit":1000}`))
	var got []string
	for _, m := range regexp.MustCompile(`"text":"(\d{3})x`).FindAllSubmatch(h.body, -1) {
		got = append(got, string(m[1]))
	}
	slices.Sort(got)
	if !slices.Equal(got, acked) {
		t.Fatalf("history has posts %v, want the acknowledged %v", got, acked)
	}
}
