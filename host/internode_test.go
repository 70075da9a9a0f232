package host_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm"
)

// A forwarded call carries its caller's deadline: the home stops waiting
// for the object's lock when the caller has given up, so the call does not
// run later behind the caller's back.
func TestForwardedCallCarriesItsDeadline(t *testing.T) {
	t.Parallel()
	// The loop holds the lock for its whole budget, far longer than the
	// caller waits, so the lock is never free before the caller's
	// deadline however late the probe sees it held.
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: clusterPrograms, Configure: func(c *host.Config) { c.VM.Budget = 8 * time.Second }})
	home := &hclient.Client{Base: nodes[0].URL()}
	obj := host.ObjectID{Program: "hostile", ID: "h1"}
	dcall(t, home, "hostile/h1", "ok", "") // the home is node 0
	loopDone := make(chan struct{})
	loopStart := time.Now()
	go func() {
		defer close(loopDone)
		home.Call(context.Background(), "hostile/h1", "loop", nil) // holds the lock for the budget
	}()
	// Seen in the object's own state, not by probe calls that a loaded
	// machine can slow past the loop's budget.
	waitUntil(t, "the loop holds the object", 10*time.Second, func() bool { return host.Busy(nodes[0], "hostile/h1") })
	okBefore := metric(t, home, `host_calls_total{result="ok"}`)
	if held := time.Since(loopStart); held > 6*time.Second {
		t.Fatalf("the loop held the object only %v after it was sent, into an 8 s budget: too late to test a 500 ms deadline", held)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := nodes[1].Call(ctx, obj, "ok", nil); err == nil {
		t.Fatal("a call behind an 8 s loop answered within its 500 ms deadline")
	}
	<-loopDone
	// Had the home kept waiting, the call would run now that the lock is
	// free.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := metric(t, home, `host_calls_total{result="ok"}`); got != okBefore {
			t.Fatalf("the forwarded call ran on the home after its caller gave up (%v ok calls, want %v)", got, okBefore)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A follow refused by a hook on another node is a refusal with the hook's
// own reason, from a handler (the guest sees it refused) and from a socket.
func TestRefusedFollowAcrossNodesKeepsItsReason(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: clusterPrograms})
	home := &hclient.Client{Base: nodes[0].URL()}
	away := &hclient.Client{Base: nodes[1].URL()}
	dcall(t, home, "chat/locked", "set_key", `{"key":"k1"}`) // the room homes on node 0
	_, err := nodes[1].Follow(context.Background(), host.ObjectID{Program: "chat", ID: "locked"},
		abi.FollowRequest{Kind: abi.FollowerObject, Follower: "tally/t1", Topic: "messages"})
	var re *vm.RefusedError
	if !errors.As(err, &re) || re.Reason != "this room needs its key" {
		t.Fatalf("a refused follow through another node: %v, want a refusal saying \"this room needs its key\"", err)
	}
	ws := dial(t, away, "chat/w")
	send(t, ws, map[string]string{"type": "follow", "object": "chat/locked", "topic": "messages"})
	f := readUntil(t, ws, "error")
	if msg, _ := f["error"].(string); msg != "follow refused by chat/locked: this room needs its key" {
		t.Fatalf("a socket's refused follow across nodes: %q", msg)
	}
}

// BenchmarkForwardedCall is a warm call made on a node that is not the
// object's home: the request and reply cross NATS through the embedded
// servers' route on loopback, on top of what BenchmarkNodeCall measures.
func BenchmarkForwardedCall(b *testing.B) {
	// The product's lease timing, not the cluster tests' shorter one.
	nodes, _ := hosttest.Cluster(b, 2, hosttest.Options{Programs: []string{"counter"}, Configure: func(c *host.Config) {
		c.LeaseTTL, c.Heartbeat = host.DefaultLeaseTTL, host.DefaultHeartbeat
	}})
	ctx := context.Background()
	id := host.ObjectID{Program: "counter", ID: "b"}
	if _, err := nodes[0].Call(ctx, id, "get", nil); err != nil { // the home is node 0
		b.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := nodes[1].Call(ctx, id, "get", nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("node 1 never reached the home: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if nodes[1].ActiveObjects() != 0 {
		b.Fatal("the object is active on the calling node: the call is not forwarded")
	}
	for _, method := range []string{"get", "inc"} {
		b.Run(method, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := nodes[1].Call(ctx, id, method, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
