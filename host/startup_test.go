package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// A starting node prunes nothing until it has read the live set: a node
// restarted while the store is slow to answer its lease watch does not take
// a live peer for a dead one and prune the edges of its connections. (That
// a node not heard of yet is live until the store says it is gone is
// package cluster's test.)
func TestStartingNodeReadsTheLiveSetBeforePruning(t *testing.T) {
	// Three nodes, so the cluster's JetStream keeps its quorum while one
	// restarts.
	nodes, cfgs := hosttest.Cluster(t, 3, hosttest.Options{Configure: func(c *host.Config) {
		c.Heartbeat = 300 * time.Millisecond
		// No copies: the restarted node takes its publisher back itself.
		c.Replicas = 0
	}})
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	start := time.Now()
	defer func() { t.Logf("took %v", time.Since(start)) }()
	if _, _, err := a.Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	pub := host.ObjectID{Program: "chat", ID: "room1"}
	if _, err := a.Call(ctx, pub, "post", []byte(`{"text":"home on a"}`)); err != nil {
		t.Fatal(err)
	}
	// A connection edge recorded by b, as b's sockets' follows are.
	if _, err := b.Follow(ctx, pub, abi.FollowRequest{Kind: abi.FollowerConnection, Follower: b.ID() + ".1", Topic: "messages"}); err != nil {
		t.Fatal(err)
	}

	t.Logf("followed at %v", time.Since(start))
	// Restart a while its lease watch is slow to start.
	a.Shutdown(ctx)
	restore := host.SlowLeaseWatch(func() { time.Sleep(2 * time.Second) })
	t.Cleanup(restore)
	a2 := hosttest.New(t, cfgs[0])
	restore()
	if !host.KnowsNode(a2, b.ID()) {
		t.Fatal("the node started before it read the live set: it has not heard of its live peer")
	}
	t.Logf("restarted at %v", time.Since(start))
	a2.Start()
	// The resumed pump runs a round over the edges; wait for it to end.
	hosttest.WaitFor(t, "the restarted node to resume the publisher's pump", 30*time.Second, func() bool { return host.PumpIdle(a2, pub) })
	es, err := a2.Edges(ctx, pub)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Node != b.ID() {
		t.Fatalf("after the restart the publisher has edges %+v: the live peer's connection edge was pruned", es)
	}
}
