package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/store"
)

// Under --sync full, a batch's calls commit without an fsync and the
// object's output gate holds everything they did until an fsync that
// began after the commit is done: their replies, a later call's reply
// (it may have seen their writes), and stream reads of their events. Once
// the fsync returns, all of it goes out.
func TestOutputGateHoldsEverythingUntilDurable(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"counter"}, Configure: func(c *host.Config) {
		c.Sync = store.SyncFull
	}})
	ctx := context.Background()
	id := host.ObjectID{Program: "counter", ID: "gate"}
	// Both methods seen once, so they join batches (a method never seen
	// starts one of its own). A lone call on an idle gate fsyncs in its
	// own commit: these are durable at once.
	for _, m := range []string{"inc", "get"} {
		if _, err := n.Call(ctx, id, m, nil); err != nil {
			t.Fatal(err)
		}
	}
	if evs, err := host.StreamAfter(n, id.String(), "changes", 0, 0, 0); err != nil || len(evs) != 1 {
		t.Fatalf("stream before: %d events (%v), want 1", len(evs), err)
	}

	type result struct {
		method string
		out    string
		err    error
	}
	results := make(chan result, 3)
	call := func(m string) {
		out, err := n.Call(ctx, id, m, nil)
		results <- result{m, string(out), err}
	}
	hold := host.HoldObject(t, n, id)
	unhold, syncs := host.HoldSyncs(n)
	defer unhold()
	for i := range 2 {
		go call("inc")
		waitUntil(t, fmt.Sprintf("inc %d queued", i), 10*time.Second, func() bool { return host.QueuedCalls(n, id) == i+1 })
	}
	hold()
	// The gate's fsync begins after the batch's commit: the two incs are
	// in the file, and held.
	waitUntil(t, "the batch's fsync began", 10*time.Second, func() bool { return syncs() >= 1 })
	go call("get") // it would see value 3, not yet durable
	held := time.After(300 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case r := <-results:
			t.Fatalf("%s answered %q (%v) before its commit was durable", r.method, r.out, r.err)
		case <-held:
			waiting = false
		}
	}
	if evs, err := host.StreamAfter(n, id.String(), "changes", 1, 0, 0); err != nil || len(evs) != 0 {
		t.Errorf("stream read while the fsync is held: %d events (%v), want none", len(evs), err)
	}
	if c, ok := host.DurableCap(n, id); !ok || c != 1 {
		t.Errorf("durable cap %d %v, want 1 true", c, ok)
	}

	unhold()
	got := map[string]bool{}
	for range 3 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("%s: %v", r.method, r.err)
			}
			got[r.method+" "+r.out] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("released: only %v answered", got)
		}
	}
	for _, want := range []string{"inc 2", "inc 3", "get 3"} {
		if !got[want] {
			t.Errorf("answers %v, want %q among them", got, want)
		}
	}
	waitUntil(t, "the stream shows both events", 10*time.Second, func() bool {
		evs, err := host.StreamAfter(n, id.String(), "changes", 1, 0, 0)
		return err == nil && len(evs) == 2 && evs[0].Seq == 2 && evs[1].Seq == 3
	})
	if _, ok := host.DurableCap(n, id); ok {
		t.Error("a cap remains once everything is durable")
	}
}
