package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// hostileV2 is the hostile example with the prefix its event export and
// its shape method answer changed from "EVENT:" to "V2EVT:" in the
// module's data: other code, the same length, a new digest.
func hostileV2(t testing.TB) []byte {
	t.Helper()
	v1 := vmtest.Wasm(t, "hostile")
	if bytes.Count(v1, []byte("EVENT:")) == 0 {
		t.Fatal(`the hostile example has no "EVENT:" in its data to change`)
	}
	return bytes.ReplaceAll(v1, []byte("EVENT:"), []byte("V2EVT:"))
}

// An upload makes the new version current for every object of the
// program at its next call boundary, on every node: 100 sockets on two
// nodes, attached to objects whose program shapes their frames, get the
// next event in v2's shape, none closed and none missing an event, while
// calls keep flowing; a call in the middle of running finishes on v1; an
// object nobody calls moves too. A rollback does the same back to v1.
func TestHotUpdateReachesEveryWatcherWithoutClosingOne(t *testing.T) {
	t.Parallel()
	// Leases as long as the binary's: this test is about versions, and
	// under the race detector a hundred sockets, the flowing calls and
	// the modules' transfers can hold a renewal past the 4 s test leases.
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: clusterPrograms, Configure: func(c *host.Config) {
		c.LeaseTTL, c.Heartbeat = host.DefaultLeaseTTL, time.Second
	}})
	ctx := context.Background()
	cs := []*hclient.Client{{Base: nodes[0].URL()}, {Base: nodes[1].URL()}}
	// Node 0 hears of new versions only from the node that took them:
	// the registry's watch there lags far behind.
	host.DelayProgramWatch(nodes[0], time.Minute)
	dcall(t, cs[0], "chat/room1", "post", `{"author":"zero","text":"m0"}`) // homed on node 0
	// Attached to ten objects, ten sockets each: an event is shaped once
	// per (version, object) on a node, so ten objects test that as well
	// as a hundred, at a tenth of the VM's work.
	const sockets = 100
	ws := make([]*watcher, sockets)
	for i := range ws {
		ws[i] = follow(t, cs[i%2], fmt.Sprintf("hostile/w%02d", i%10), "chat/room1", "messages", "")
	}
	// shaped waits until every socket has n frames and checks the last
	// is message text in prefix's shape.
	shaped := func(n int, prefix, text string) {
		t.Helper()
		defer func() {
			if t.Failed() {
				short := map[int]int{}
				for i, w := range ws {
					if len(w.got()) < n {
						short[i%2]++
					}
				}
				t.Logf("sockets short of %d frames, by node: %v; the room's edges: %d", n, short, len(edges(t, cs[0], "chat/room1")))
			}
		}()
		waitUntil(t, fmt.Sprintf("%d frames on every socket", n), 30*time.Second, func() bool {
			for _, w := range ws {
				if len(w.got()) < n {
					return false
				}
			}
			return true
		})
		for i, w := range ws {
			got := w.got()
			if len(got) != n {
				t.Fatalf("socket %d has %d frames, want %d: %q", i, len(got), n, got)
			}
			if f := got[n-1]; !strings.HasPrefix(f, prefix+"{") || !strings.Contains(f, `"`+text+`"`) {
				t.Fatalf("socket %d (node %d) got %q for %s, want it in the shape %q", i, i%2, f, text, prefix)
			}
		}
	}
	dcall(t, cs[0], "chat/room1", "post", `{"author":"ann","text":"m1"}`)
	shaped(1, "EVENT:", "m1")

	// Calls keep flowing through both nodes, on objects homed on each, at
	// a pace that leaves the machine to the nodes (a flood under the race
	// detector starves their lease renewals, which is not this test's
	// subject).
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var flowing sync.WaitGroup
	for g := range 4 {
		flowing.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cs[g%2].Call(ctx, fmt.Sprintf("hostile/busy%d", g), "shape", nil); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				calls.Add(1)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	// An object called once and then left alone, and one in the middle of
	// a call while the update lands.
	if got := dcall(t, cs[0], "hostile/idle", "shape", ""); got != "EVENT:" {
		t.Fatalf("v1's shape answered %q", got)
	}
	slow := make(chan string, 1)
	go func() {
		out, err := cs[0].Call(ctx, "hostile/slow", "shape", []byte("1500"))
		if err != nil {
			slow <- err.Error()
		}
		slow <- string(out)
	}()
	waitUntil(t, "the slow call runs", 10*time.Second, func() bool { return host.Busy(nodes[0], "hostile/slow") })

	// The update goes through the node that homes none of the room, the
	// slow object or the idle one.
	pr, err := cs[1].Upload(ctx, "hostile", hostileV2(t))
	if err != nil || pr.Version != 2 {
		t.Fatalf("upload v2: %+v, %v", pr, err)
	}
	dcall(t, cs[0], "chat/room1", "post", `{"author":"ann","text":"m2"}`)
	shaped(2, "V2EVT:", "m2")
	if got := <-slow; got != "EVENT:" {
		t.Fatalf("the call running when v2 landed answered %q: it should finish on v1", got)
	}
	for i, c := range cs {
		if got := dcall(t, c, "hostile/slow", "shape", ""); got != "V2EVT:" {
			t.Fatalf("the next call through node %d answered %q, want v2's", i, got)
		}
	}
	// Objects nobody calls move too.
	running := func(version int) bool {
		var p host.ObjectPage
		if err := cs[1].Objects(ctx, "hostile", hclient.Page{}, &p); err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, o := range p.Objects {
			if o.Object == "hostile/idle" || o.Object == "hostile/slow" || strings.HasPrefix(o.Object, "hostile/busy") {
				if !o.Active || o.Version != version {
					return false
				}
				seen++
			}
		}
		return seen == 6
	}
	waitUntil(t, "every active object runs v2", 20*time.Second, func() bool { return running(2) })

	// Back to v1.
	back, err := cs[0].Rollback(ctx, "hostile", 0)
	if err != nil || back.Version != 3 || back.RollbackOf != 1 || back.Digest == pr.Digest {
		t.Fatalf("rollback: %+v, %v; want version 3 running version 1's module", back, err)
	}
	dcall(t, cs[0], "chat/room1", "post", `{"author":"ann","text":"m3"}`)
	shaped(3, "EVENT:", "m3")
	if got := dcall(t, cs[1], "hostile/slow", "shape", ""); got != "EVENT:" {
		t.Fatalf("after the rollback a call answered %q, want v1's", got)
	}
	waitUntil(t, "every active object runs version 3", 20*time.Second, func() bool { return running(3) })

	close(stop)
	flowing.Wait()
	if failed.Load() != 0 || calls.Load() < 20 {
		t.Fatalf("%d of %d calls failed during the updates (first: %v)", failed.Load(), calls.Load(), firstErr.Load())
	}
	for i, w := range ws {
		select {
		case <-w.done:
			t.Fatalf("socket %d closed during the updates", i)
		default:
		}
	}
}

// A rollback names a version the program has and whose module is not the
// one it runs; the history only grows.
func TestRollbackRefusesWhatItCannotDo(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}})
	ctx := context.Background()
	status := func(err error) int {
		var ae *hclient.APIError
		if errors.As(err, &ae) {
			return ae.Status
		}
		return 0
	}
	if _, err := c.Rollback(ctx, "hostile", 0); status(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "one version") {
		t.Fatalf("rollback of a program with one version: %v", err)
	}
	if _, err := c.Rollback(ctx, "nosuch", 0); status(err) != http.StatusNotFound {
		t.Fatalf("rollback of an unknown program: %v", err)
	}
	if _, err := c.Upload(ctx, "hostile", hostileV2(t)); err != nil {
		t.Fatal(err)
	}
	for _, to := range []int{3, 2, -1} {
		if _, err := c.Rollback(ctx, "hostile", to); status(err) != http.StatusBadRequest {
			t.Fatalf("rollback to %d: %v, want a 400", to, err)
		}
	}
	body, err := c.Do(ctx, http.MethodPost, "/v1/programs/hostile/rollback", strings.NewReader(`{"version":1}`))
	if status(err) != http.StatusBadRequest {
		t.Fatalf("a body with an unknown field: %s, %v", body, err)
	}
	pr, err := c.Rollback(ctx, "hostile", 1)
	if err != nil || pr.Version != 3 || pr.RollbackOf != 1 {
		t.Fatalf("rollback to 1: %+v, %v", pr, err)
	}
	var v struct {
		Versions []hclient.Program `json:"versions"`
	}
	if err := c.Programs(ctx, "hostile", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Versions) != 3 || v.Versions[2].Digest != v.Versions[0].Digest || v.Versions[1].Digest == v.Versions[0].Digest {
		b, _ := json.Marshal(v.Versions)
		t.Fatalf("history %s: want v1, v2, then v3 running v1's module", b)
	}
	if got := dcall(t, c, "hostile/x", "shape", ""); got != "EVENT:" {
		t.Fatalf("after rolling back to v1: %q", got)
	}
}
