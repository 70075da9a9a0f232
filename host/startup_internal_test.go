package host

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
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
	routes := []string{freeRoute(t), freeRoute(t), freeRoute(t)}
	name := fmt.Sprintf("startup-%d", os.Getpid())
	cfgs := make([]Config, 3)
	nodes := make([]*Node, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range cfgs {
		cfg := DefaultConfig()
		cfg.DataDir = t.TempDir()
		cfg.Listen = "127.0.0.1:0"
		cfg.VM.CacheDir = vmtest.CacheDir()
		cfg.Logger = quietLog()
		cfg.LeaseTTL, cfg.Heartbeat = 4*time.Second, 300*time.Millisecond
		// No copies: the restarted node takes its publisher back itself.
		cfg.Replicas = 0
		cfg.NATS.Cluster, cfg.NATS.ClusterName = routes[i], name
		for j, r := range routes {
			if j != i {
				cfg.NATS.Routes = append(cfg.NATS.Routes, "nats://"+r)
			}
		}
		cfgs[i] = cfg
		wg.Go(func() { nodes[i], errs[i] = New(context.Background(), cfg) })
	}
	wg.Wait()
	for i, n := range nodes {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		n.Start()
		t.Cleanup(func() { n.Shutdown(context.Background()) })
	}
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	start := time.Now()
	defer func() { t.Logf("took %v", time.Since(start)) }()
	if _, _, err := a.Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	pub := ObjectID{"chat", "room1"}
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
	slow := func() { time.Sleep(2 * time.Second) }
	beforeLeaseWatch.Store(&slow)
	t.Cleanup(func() { beforeLeaseWatch.Store(nil) })
	a2, err := New(ctx, cfgs[0])
	beforeLeaseWatch.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a2.Shutdown(context.Background()) })
	heard := false
	for _, info := range a2.cluster.Nodes() {
		heard = heard || info.ID == b.ID()
	}
	if !heard {
		t.Fatal("the node started before it read the live set: it has not heard of its live peer")
	}
	t.Logf("restarted at %v", time.Since(start))
	a2.Start()
	// The resumed pump runs a round over the edges; wait for it to end.
	deadline := time.Now().Add(30 * time.Second)
	for {
		a2.objects.mu.Lock()
		o := a2.objects.active[pub]
		a2.objects.mu.Unlock()
		if o != nil && !o.pump.running.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not resume the publisher's pump")
		}
		time.Sleep(10 * time.Millisecond)
	}
	es, err := a2.Edges(ctx, pub)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Node != b.ID() {
		t.Fatalf("after the restart the publisher has edges %+v: the live peer's connection edge was pruned", es)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
