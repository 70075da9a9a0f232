package host_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

// sseEvent is one server-sent event of a stream.
type sseEvent struct {
	id    string
	event string
	data  string
}

// envelope is a stream event's data.
type envelope struct {
	Publisher string          `json:"publisher"`
	Topic     string          `json:"topic"`
	Seq       uint64          `json:"seq"`
	Payload   json.RawMessage `json:"payload"`
}

// streamClient is a real HTTP client reading a stream.
type streamClient struct {
	t      *testing.T
	mu     sync.Mutex
	evs    []sseEvent
	ended  chan struct{}
	cancel context.CancelFunc
	status int
}

func openStream(t *testing.T, base, object, query, token string) *streamClient {
	t.Helper()
	prog, id, _ := strings.Cut(object, "/")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/objects/"+prog+"/"+id+"/stream?"+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("stream %s: %v", object, err)
	}
	c := &streamClient{t: t, ended: make(chan struct{}), cancel: cancel, status: resp.StatusCode}
	t.Cleanup(cancel)
	go func() {
		defer close(c.ended)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				c.mu.Lock()
				c.evs = append(c.evs, cur)
				c.mu.Unlock()
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				cur.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
			}
		}
	}()
	return c
}

func (c *streamClient) events() []envelope {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []envelope
	for _, e := range c.evs {
		if e.event != "event" {
			continue
		}
		var env envelope
		if err := json.Unmarshal([]byte(e.data), &env); err != nil {
			c.t.Fatalf("event data %q: %v", e.data, err)
		}
		if e.id != strconv.FormatUint(env.Seq, 10) {
			c.t.Fatalf("event id %q, seq %d", e.id, env.Seq)
		}
		out = append(out, env)
	}
	return out
}

// others are the events that are not stream events (errors).
func (c *streamClient) others() []sseEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sseEvent
	for _, e := range c.evs {
		if e.event != "event" {
			out = append(out, e)
		}
	}
	return out
}

func (c *streamClient) seqs() []uint64 {
	var out []uint64
	for _, e := range c.events() {
		out = append(out, e.Seq)
	}
	return out
}

func (c *streamClient) waitSeqs(want ...uint64) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := c.seqs()
		if slices.Equal(got, want) {
			return
		}
		if len(got) > len(want) || time.Now().After(deadline) {
			c.t.Fatalf("stream sent seqs %v, want %v (HTTP %d; other events: %v)", got, want, c.status, c.others())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func publishTo(t *testing.T, n *host.Node, object, topic, payload string) {
	t.Helper()
	dcall(t, client(n), object, "publish", fmt.Sprintf(`{"topic":%q,"payload":%s}`, topic, payload))
}

func streamNode(t *testing.T) *host.Node {
	n, _ := hosttest.Start(t, hosttest.Options{})
	upload(t, n, "hostile", "hostile")
	upload(t, n, "chat", "chat")
	return n
}

// S01: every stream event is read from storage; hints are empty. Hints
// carrying data, or sent with nothing new, deliver nothing.
func TestS01_EventsComeFromStorageHintsAreEmpty(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	var mu sync.Mutex
	var hints []*nats.Msg
	sub, err := n.NATSConn().Subscribe("HOST_NOTIFICATIONS.>", func(m *nats.Msg) {
		mu.Lock()
		hints = append(hints, m)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	s := openStream(t, n.URL(), "chat/r", "after=0", "")
	for i := range 3 {
		dcall(t, client(n), "chat/r", "post", fmt.Sprintf(`{"author":"a","text":"m%d"}`, i))
	}
	s.waitSeqs(1, 2, 3)
	// A hint that carries an event of its own is not delivered: only the
	// log is.
	subject := host.HintSubject(host.ObjectID{Program: "chat", ID: "r"})
	n.NATSConn().Publish(subject, []byte(`{"seq":99,"payload":"forged"}`))
	n.NATSConn().Flush()
	time.Sleep(200 * time.Millisecond)
	s.waitSeqs(1, 2, 3)
	mu.Lock()
	defer mu.Unlock()
	own := 0
	for _, m := range hints {
		if len(m.Data) > 0 {
			continue // the forged one above
		}
		if len(m.Header) != 0 {
			t.Fatalf("a hint with headers %v", m.Header)
		}
		if m.Subject != subject {
			t.Fatalf("hint on %s, want %s", m.Subject, subject)
		}
		own++
	}
	if own < 3 {
		t.Fatalf("%d empty hints for 3 commits", own)
	}
	for _, e := range s.events() {
		if !strings.Contains(string(e.Payload), `"text":"m`) || e.Publisher != "chat/r" || e.Topic != "messages" {
			t.Fatalf("event %+v", e)
		}
	}
}

// S02: hints go out only after a commit: a method that publishes and then
// fails sends none, and its event is never streamed.
func TestS02_HintsOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	obj := host.ObjectID{Program: "hostile", ID: "h"}
	got := make(chan *nats.Msg, 100)
	sub, err := n.NATSConn().ChanSubscribe(host.HintSubject(obj), got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	n.NATSConn().Flush()
	s := openStream(t, n.URL(), "hostile/h", "after=0", "")
	time.Sleep(100 * time.Millisecond)
	for len(got) > 0 {
		<-got // the subscription's startup hint
	}
	for range 3 {
		if _, err := client(n).Call(context.Background(), "hostile/h", "publish_then_fail", nil); err == nil {
			t.Fatal("publish_then_fail succeeded")
		}
	}
	publishTo(t, n, "hostile/h", "t", `"committed"`)
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no hint after the commit")
	}
	// NATS keeps one publisher's order: a hint from a failed call would
	// have come first.
	if len(got) != 0 {
		t.Fatalf("%d more hints: the failed calls sent hints", len(got))
	}
	s.waitSeqs(1)
	if e := s.events()[0]; string(e.Payload) != `"committed"` {
		t.Fatalf("streamed %s", e.Payload)
	}
}

// S11: after is exclusive.
func TestS11_AfterIsExclusive(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	for i := range 5 {
		publishTo(t, n, "hostile/a", "t", strconv.Itoa(i))
	}
	s := openStream(t, n.URL(), "hostile/a", "after=2", "")
	s.waitSeqs(3, 4, 5)
	// Last-Event-ID, what a browser's EventSource sends on reconnect,
	// means the same.
	req, _ := http.NewRequest(http.MethodGet, n.URL()+"/v1/objects/hostile/a/stream", nil)
	req.Header.Set("Last-Event-ID", "4")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "id: ") {
			if id := sc.Text()[4:]; id != "5" {
				t.Fatalf("after Last-Event-ID 4 the first event is %s", id)
			}
			break
		}
	}
	if r := do(t, n, http.MethodGet, "/v1/objects/hostile/a/stream?after=-1", nil); r.status != http.StatusBadRequest {
		t.Fatalf("after=-1: HTTP %d %s", r.status, r.body)
	}
}

// S12: without after, the latest stored matching event once, then newer
// ones ascending; with none stored, future matches ascending.
func TestS12_AfterOmittedLatestThenNewer(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	for i := range 4 {
		publishTo(t, n, "hostile/b", "t", strconv.Itoa(i))
	}
	s := openStream(t, n.URL(), "hostile/b", "", "")
	s.waitSeqs(4)
	publishTo(t, n, "hostile/b", "t", `"new"`)
	publishTo(t, n, "hostile/b", "t", `"newer"`)
	s.waitSeqs(4, 5, 6)

	empty := openStream(t, n.URL(), "hostile/fresh", "topic=t", "")
	time.Sleep(200 * time.Millisecond)
	publishTo(t, n, "hostile/fresh", "t", `1`)
	publishTo(t, n, "hostile/fresh", "t", `2`)
	empty.waitSeqs(1, 2)
}

// S13: a filtered subscription reads only matching events; its cursor (the
// event ids) is the last delivered match, never a skipped event.
func TestS13_FilteredCursorIsTheLastMatch(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	publishTo(t, n, "hostile/c", "t", `{"kind":"a","n":1}`)     // 1
	publishTo(t, n, "hostile/c", "other", `{"kind":"a","n":2}`) // 2: other topic
	publishTo(t, n, "hostile/c", "t", `{"kind":"b","n":3}`)     // 3: filtered out
	publishTo(t, n, "hostile/c", "t", `{"kind":"a","n":4}`)     // 4
	s := openStream(t, n.URL(), "hostile/c", "after=0&topic=t&filter=kind=a", "")
	s.waitSeqs(1, 4)
	publishTo(t, n, "hostile/c", "t", `{"kind":"b","n":5}`) // 5
	publishTo(t, n, "hostile/c", "t", `{"kind":"a","n":6}`) // 6
	s.waitSeqs(1, 4, 6)
	// Without after: the latest match, 6, not the latest event.
	publishTo(t, n, "hostile/c", "t", `{"kind":"b","n":7}`)
	latest := openStream(t, n.URL(), "hostile/c", "topic=t&filter=kind=a", "")
	latest.waitSeqs(6)
	if r := do(t, n, http.MethodGet, "/v1/objects/hostile/c/stream?filter=nonsense", nil); r.status != http.StatusBadRequest {
		t.Fatalf("bad filter: HTTP %d", r.status)
	}
}

// S10 end to end: a consumer that goes away and comes back with its
// checkpoint gets everything after it, replaying what it had not
// checkpointed. S09: extra hints deliver nothing twice.
func TestS09_S10_ResumeFromCheckpointNoDuplicates(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	s := openStream(t, n.URL(), "hostile/d", "after=0", "")
	for i := range 3 {
		publishTo(t, n, "hostile/d", "t", strconv.Itoa(i))
	}
	s.waitSeqs(1, 2, 3)
	subject := host.HintSubject(host.ObjectID{Program: "hostile", ID: "d"})
	for range 50 {
		n.NATSConn().Publish(subject, nil)
	}
	n.NATSConn().Flush()
	time.Sleep(200 * time.Millisecond)
	s.waitSeqs(1, 2, 3)
	s.cancel()
	<-s.ended
	for i := range 3 {
		publishTo(t, n, "hostile/d", "t", strconv.Itoa(10+i))
	}
	// The consumer had checkpointed 2 only.
	again := openStream(t, n.URL(), "hostile/d", "after=2", "")
	again.waitSeqs(3, 4, 5, 6)
}

// S14 end to end: each subscription is ordered within its object;
// different objects progress independently.
func TestS14_OrderPerObject(t *testing.T) {
	t.Parallel()
	n := streamNode(t)
	a := openStream(t, n.URL(), "hostile/x", "after=0", "")
	b := openStream(t, n.URL(), "hostile/y", "after=0", "")
	var want []uint64
	for i := range 20 {
		publishTo(t, n, "hostile/x", "t", strconv.Itoa(i))
		want = append(want, uint64(i+1))
	}
	publishTo(t, n, "hostile/y", "t", `"y"`)
	a.waitSeqs(want...)
	b.waitSeqs(1)
}

// Streams are tenant-scoped like every route: another tenant's object is a
// 404 that names nothing.
func TestStreamsAreTenantScoped(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	a := mkTenant(t, n, op, "sa", "")
	b := mkTenant(t, n, op, "sb", "")
	wantStatus(t, tenantUpload(t, n, a, "chat", "chat-rust"), http.StatusCreated, "upload")
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"a","text":"secret"}`)), http.StatusOK, "post")
	own := openStream(t, n.URL(), "chat/r", "after=0", a)
	own.waitSeqs(1)
	if p := own.events()[0].Publisher; p != "chat/r" {
		t.Fatalf("publisher shown as %q", p)
	}
	other := openStream(t, n.URL(), "chat/r", "after=0", b)
	if other.status != http.StatusNotFound {
		t.Fatalf("tenant sb streaming sa's chat/r: HTTP %d", other.status)
	}
	anon := openStream(t, n.URL(), "chat/r", "after=0", "")
	if anon.status != http.StatusUnauthorized {
		t.Fatalf("no token: HTTP %d", anon.status)
	}
}

// A stream on any node of a cluster reads the object's log on its home,
// over NATS, and hears the home's hints.
func TestS01_StreamOnAnotherNodeReadsTheHome(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: clusterPrograms})
	home, other := nodes[0], nodes[1]
	dcall(t, client(home), "chat/far", "post", `{"author":"a","text":"first"}`)
	if home.ActiveObjects() != 1 {
		t.Fatal("chat/far is not on node 0")
	}
	s := openStream(t, other.URL(), "chat/far", "after=0", "")
	s.waitSeqs(1)
	dcall(t, client(home), "chat/far", "post", `{"author":"a","text":"second"}`)
	dcall(t, client(other), "chat/far", "post", `{"author":"b","text":"third"}`)
	s.waitSeqs(1, 2, 3)
	if other.ActiveObjects() != 0 {
		t.Fatal("the stream activated the object on the other node")
	}
}

// S04: after the node's NATS connection reconnects, every subscription
// publishes an empty hint (and drains on its receipt): with the idle
// watchdog set to an hour, only the reconnect can send it. The stream is
// still live afterwards.
func TestS04_ReconnectPublishesAHint(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.Streams.Idle = time.Hour }})
	upload(t, n, "chat", "chat")
	obj := host.ObjectID{Program: "chat", ID: "rc"}
	got := make(chan *nats.Msg, 100)
	sub, err := n.NATSConn().ChanSubscribe(host.HintSubject(obj), got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	n.NATSConn().Flush()
	s := openStream(t, n.URL(), "chat/rc", "after=0", "")
	dcall(t, client(n), "chat/rc", "post", `{"author":"a","text":"before"}`)
	s.waitSeqs(1)
	time.Sleep(100 * time.Millisecond)
	for len(got) > 0 {
		<-got // the startup hint and the commit's
	}
	t0 := time.Now()
	if err := n.NATSConn().ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if len(m.Data) != 0 {
			t.Fatalf("reconnect hint carries %q", m.Data)
		}
		t.Logf("hint %v after the forced reconnect", time.Since(t0))
	case <-time.After(20 * time.Second):
		t.Fatal("no hint after NATS reconnected")
	}
	dcall(t, client(n), "chat/rc", "post", `{"author":"a","text":"after"}`)
	s.waitSeqs(1, 2)
}

// S03 on the node: a stream's hint listener is registered at the NATS
// server (flushed) by the time Listen returns, before the first read.
func TestS03_HintListenerFlushedBeforeFirstRead(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	for i := 0; i < 50; i++ {
		ok, err := host.HintListenerRegistered(n, fmt.Sprintf("chat/s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("listener %d: the server had no interest when Listen returned: it was not flushed", i)
		}
	}
}
