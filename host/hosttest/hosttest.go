// Package hosttest starts real nodes in a test's process, as nats-server's
// test.RunServer starts servers: data in a temporary directory, HTTP on a
// free loopback port, the embedded NATS server (in process with no TCP port
// for one node; routes on free loopback ports for a cluster), the shared
// compilation cache and a quiet logger. Every node it builds is shut down
// by t.Cleanup, and it returns only once the nodes are ready (a cluster's
// nodes each list all the others).
//
// It does not build modules (vm/vmtest does) nor wait for anything a test
// asserts. It imports testing: only tests use it. Tests inside package host
// cannot import it (it imports host): they are external tests reaching
// internals through export_test.go, or, where they need the internals
// themselves, call host.StartTestNode, which host's external tests set to
// Start.
package hosttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/bench"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm/vmtest"
)

// Options describes the nodes to start. The zero value is one node with the
// package's defaults and no programs.
type Options struct {
	// DataDir is a single node's data directory, to start a node again on
	// the same one; default a new t.TempDir(). Each node of a cluster gets a
	// temporary directory of its own.
	DataDir string
	// Configure changes each node's configuration before it is built.
	Configure func(*host.Config)
	// Programs are examples, by vmtest name, uploaded under that name
	// through the first node once it has started.
	Programs []string
	// Race keeps a cluster test in -short runs. The suite (make test)
	// runs every package with -race -short, then the packages with
	// heavy tests again without either: a cluster test runs under the
	// race detector only when it says so here (a few that cover calls,
	// deliveries and a takeover between nodes), since
	// three nodes' NATS servers, SQLite files and VMs all instrumented
	// cost four times the time and held the suite past ten minutes.
	Race bool
}

const (
	// shutdownTimeout bounds each node's shutdown at cleanup.
	shutdownTimeout = 60 * time.Second
	// readyTimeout bounds the wait for a cluster's nodes to see each other.
	readyTimeout = 60 * time.Second
	// clusterAttempts is how often a cluster is built with fresh route
	// ports when one was taken in between.
	clusterAttempts = 3
)

// Config returns a test node's configuration: data under dir, HTTP on a
// free loopback port, the shared compilation cache, a quiet logger; then
// configure (nil: none) changes it.
func Config(dir string, configure func(*host.Config)) host.Config {
	cfg := host.DefaultConfig()
	cfg.DataDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.VM.CacheDir = vmtest.CacheDir()
	cfg.Logger = slog.New(slog.DiscardHandler)
	if configure != nil {
		configure(&cfg)
	}
	return cfg
}

// Start starts one node and uploads o.Programs, and returns the node with
// a client of its HTTP API. The node is ready when Start returns: New binds
// its HTTP address, so no request is refused.
func Start(t testing.TB, o Options) (*host.Node, *hclient.Client) {
	t.Helper()
	dir := o.DataDir
	if dir == "" {
		dir = t.TempDir()
	}
	n := StartConfig(t, Config(dir, o.Configure))
	c := &hclient.Client{Base: n.URL()}
	upload(t, c, o.Programs)
	return n, c
}

// New builds a node from cfg as it is, without starting it, for a test that
// looks at a node between New and Start; cleanup shuts it down.
func New(t testing.TB, cfg host.Config) *host.Node {
	t.Helper()
	n, err := host.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new node: %v", err)
	}
	shutDownAtCleanup(t, n)
	return n
}

// StartConfig builds and starts a node from cfg as it is: a node restarted
// on a cluster node's configuration (Cluster returns them), a late joiner,
// a node on an external NATS.
func StartConfig(t testing.TB, cfg host.Config) *host.Node {
	t.Helper()
	n := New(t, cfg)
	if err := n.Start(); err != nil {
		t.Fatalf("start node: %v", err)
	}
	return n
}

// Heavy marks a single-node test the suite runs only in its pass without
// the race detector: it is skipped under -short (see Options.Race). The
// heavy ones take ten seconds or more under -race and are not about the
// host's own goroutines meeting (guests' contracts, hostile modules,
// redelivery and backoff schedules, restarts, the browser).
func Heavy(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("heavy: make test runs it in its pass without -race and -short")
	}
}

// Cluster starts k nodes clustered through their embedded NATS servers on
// loopback (routes on free ports, a cluster name no other test's cluster
// has, 10 s leases renewed every second, then o.Configure), uploads
// o.Programs through the first, and waits until every node lists all k. It
// returns the nodes and the configuration each was built from, to start
// one again on its data directory (StartConfig). o.DataDir is not used.
func Cluster(t testing.TB, k int, o Options) ([]*host.Node, []host.Config) {
	t.Helper()
	if testing.Short() && !o.Race {
		t.Skip("a cluster test: make test runs it in its pass without -race and -short")
	}
	// Route ports are picked free and then bound by the node; in a full
	// parallel run something else can take one in between. That is the
	// test's doing, not the product's: pick fresh ports and try again.
	var nodes []*host.Node
	var cfgs []host.Config
	for attempt := 1; ; attempt++ {
		var err error
		nodes, cfgs, err = newCluster(t, k, o.Configure)
		if err == nil {
			break
		}
		for _, n := range nodes {
			if n != nil {
				n.Shutdown(context.Background())
			}
		}
		if attempt == clusterAttempts || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("cluster attempt %d: %v", attempt, err)
	}
	for _, n := range nodes {
		shutDownAtCleanup(t, n)
	}
	for i, n := range nodes {
		if err := n.Start(); err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
	}
	// The first node takes uploads without its peers, and membership
	// settles meanwhile.
	upload(t, &hclient.Client{Base: nodes[0].URL()}, o.Programs)
	WaitFor(t, "cluster membership", readyTimeout, func() bool {
		for _, n := range nodes {
			var v struct{ Nodes []map[string]any }
			if err := (&hclient.Client{Base: n.URL()}).Get(context.Background(), "/v1/cluster", &v); err != nil || len(v.Nodes) != k {
				return false
			}
		}
		return true
	})
	return nodes, cfgs
}

// newCluster builds k clustered nodes (not started), concurrently: in a
// new cluster each node waits for the others' JetStream. When one fails
// the others stop waiting for it.
func newCluster(t testing.TB, k int, configure func(*host.Config)) ([]*host.Node, []host.Config, error) {
	routes := make([]string, k)
	for i := range routes {
		routes[i] = FreeAddr(t)
	}
	name := clusterName()
	cfgs := make([]host.Config, k)
	nodes := make([]*host.Node, k)
	errs := make([]error, k)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // not before: a node may keep what New was given
	var wg sync.WaitGroup
	for i := range k {
		cfgs[i] = Config(t.TempDir(), func(c *host.Config) {
			// A node of these tests leaves by Shutdown, which ends its
			// lease at once: nothing here waits for one to lapse, and a
			// lease of 10 s outlasts a loaded machine's slow renewals (a
			// full suite under the race detector lost 4 s test leases,
			// and with them whole nodes, mid-test). A test of lapses sets
			// its own.
			c.LeaseTTL, c.Heartbeat = 10*time.Second, time.Second
			c.NATS.Cluster, c.NATS.ClusterName = routes[i], name
			for j, r := range routes {
				if j != i {
					c.NATS.Routes = append(c.NATS.Routes, "nats://"+r)
				}
			}
			if configure != nil {
				configure(c)
			}
		})
		wg.Go(func() {
			nodes[i], errs[i] = host.New(ctx, cfgs[i])
			if errs[i] != nil {
				errs[i] = fmt.Errorf("node %d: %w", i, errs[i])
				cancel()
			}
		})
	}
	wg.Wait()
	return nodes, cfgs, errors.Join(errs...)
}

var clusters atomic.Int64

// clusterName is a NATS cluster name no other test cluster has: a server
// of another test that still retries a route to a port this cluster now
// uses is refused instead of merging the two clusters.
func clusterName() string {
	return fmt.Sprintf("t%d-%d", os.Getpid(), clusters.Add(1))
}

// FreeAddr returns a loopback address nobody listens on right now, and
// that this process has not given out before (bench.FreePorts says why
// the ports are drawn as they are: a port the kernel chose and got back
// went to the next outgoing connection of any test, and a node started on
// it failed with "address already in use").
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := bench.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// WaitFor polls cond until it holds, failing the test when timeout passes
// first.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func shutDownAtCleanup(t testing.TB, n *host.Node) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		n.Shutdown(ctx) // a second Shutdown, after the test's own, is a no-op
	})
}

// upload uploads programs through c. A fresh cluster may answer 503 while
// its streams elect their leaders (the node says so, and a user would try
// again): such an upload is tried again for up to readyTimeout.
func upload(t testing.TB, c *hclient.Client, programs []string) {
	t.Helper()
	for _, p := range programs {
		wasm := vmtest.Wasm(t, p)
		deadline := time.Now().Add(readyTimeout)
		for {
			_, err := c.Upload(context.Background(), p, wasm)
			if err == nil {
				break
			}
			var ae *hclient.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("upload %s: %v", p, err)
			}
			t.Logf("upload %s: %v; trying again", p, err)
			time.Sleep(250 * time.Millisecond)
		}
	}
}
