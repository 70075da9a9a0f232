package host

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/vm/vmtest"
)

func freeRoute(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestLeaseLostNodeIsGoneForGood: a node that stops renewing its lease is
// dropped by its peers; when it comes back it is refused under its old id
// (its renewal fails, it shuts down, and peers never count the old id live
// again, even if the id's key reappears).
func TestLeaseLostNodeIsGoneForGood(t *testing.T) {
	t.Parallel()
	// Three nodes: the cluster's buckets keep three replicas and survive
	// one node leaving.
	routes := []string{freeRoute(t), freeRoute(t), freeRoute(t)}
	name := fmt.Sprintf("lease-%d", os.Getpid())
	nodes := make([]*Node, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		cfg := DefaultConfig()
		cfg.DataDir = t.TempDir()
		cfg.Listen = "127.0.0.1:0"
		cfg.VM.CacheDir = vmtest.CacheDir()
		cfg.LeaseTTL, cfg.Heartbeat = 3*time.Second, 300*time.Millisecond
		cfg.NATS.Cluster, cfg.NATS.ClusterName = routes[i], name
		for j, r := range routes {
			if j != i {
				cfg.NATS.Routes = append(cfg.NATS.Routes, "nats://"+r)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = New(context.Background(), cfg)
		}()
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
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("a sees b", func() bool { return a.cluster.Live(b.ID()) })

	b.cluster.mu.Lock()
	b.cluster.paused = true
	b.cluster.mu.Unlock()
	wait("a drops b", func() bool { return !a.cluster.Live(b.ID()) })

	// b comes back: its renewal is refused and it leaves for good.
	b.cluster.mu.Lock()
	b.cluster.paused = false
	b.cluster.mu.Unlock()
	select {
	case <-b.LeaseLost():
	case <-time.After(30 * time.Second):
		t.Fatal("b kept running under a lapsed lease")
	}
	// Even if the old id's key reappears, it stays dead.
	// (The bucket may be electing a new leader now that b is gone: retry.)
	ctx := context.Background()
	var err error
	for range 3 {
		if _, err = a.cluster.nodes.Put(ctx, "n."+b.ID(), []byte(`{"id":"`+b.ID()+`"}`)); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * a.cfg.Heartbeat)
	if a.cluster.Live(b.ID()) {
		t.Fatal("a node id came back")
	}
}
