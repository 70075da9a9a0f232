package host_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// A node whose lease is gone for good shuts down and says so through
// LeaseLost: `host serve` then starts a new node under a new id. (The
// lease's lapse, refusal and "ids never return" are package cluster's
// tests.)
//
// conformance: D21
func TestLeaseLostNodeShutsDown(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) {
		c.LeaseTTL, c.Heartbeat = 3*time.Second, 300*time.Millisecond
	}})
	ctx := context.Background()

	if _, _, err := n.Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	room := host.ObjectID{Program: "chat", ID: "room1"}
	if _, err := n.Call(ctx, room, "post", []byte(`{"text":"hi"}`)); err != nil {
		t.Fatal(err)
	}

	// The lease changes hands behind the node's back.
	js, err := jetstream.New(n.NATSConn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, cluster.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "n."+n.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.LeaseLost():
	case <-time.After(30 * time.Second):
		t.Fatal("the node kept running without its lease")
	}
	if _, err := n.Call(ctx, room, "post", []byte(`{"text":"hi"}`)); err == nil {
		t.Fatal("a node that lost its lease still serves calls")
	}
}

// A call that only read the object ships nothing, so nothing fences it:
// if its lease ran out while it waited or ran, a successor may have taken
// the object over and acknowledged a newer value meanwhile. Its reply is
// not sent then; the caller gets 503 and may try again elsewhere.
func TestReadRepliesOnlyWhileTheLeaseHolds(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Programs: []string{"ledger"}, Configure: func(c *host.Config) {
		c.LeaseTTL, c.Heartbeat = 2*time.Second, 250*time.Millisecond
	}})
	ctx := context.Background()
	id := host.ObjectID{Program: "ledger", ID: "slow"}
	if out, err := n.Call(ctx, id, "spin", []byte("10")); err != nil || string(out) != "done" {
		t.Fatalf("spin with the lease held: %q %v", out, err)
	}
	// The lease (valid 1.75 s after its last renewal) runs out while the
	// handler spins for 2.5 s.
	host.PauseLease(n, true)
	out, err := n.Call(ctx, id, "spin", []byte("2500"))
	if !errors.Is(err, host.ErrUnavailable) {
		t.Fatalf("a reply computed while the lease ran out was sent: %q %v", out, err)
	}
}
