package host

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/host/cluster"
)

// A peer that freezes (SIGSTOP, a stalled VM) keeps its sockets open, so
// nothing closes its NATS routes but unanswered pings. Until they close,
// the peer's subscriptions stay in the other servers' interest and
// requests routed to it wait for nothing (a paused home's successor took
// over a minute to answer in a full suite). The routes to a frozen peer
// close before its lease runs out (cluster.DefaultLeaseTTL), so by the
// time its objects are taken over nothing is routed to it.
//
// Here the frozen peer is a proxy between two embedded servers that stops
// forwarding bytes and keeps its connections open.
func TestRoutesToAFrozenPeerCloseBeforeItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	name := "frozen-" + t.Name()
	// b's route goes to a socket that never answers: a clustered
	// JetStream needs one configured.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	b, err := startNATS(NATSConfig{Cluster: "127.0.0.1:0", ClusterName: name, Routes: []string{"nats://" + mute.Addr().String()}}, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	p := startFreezer(t, b.srv.ClusterAddr().String())
	a, err := startNATS(NATSConfig{Cluster: "127.0.0.1:0", ClusterName: name, Routes: []string{"nats://" + p.addr}}, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	waitFor(t, "the route through the proxy", 30*time.Second, func() bool { return a.srv.NumRoutes() > 0 })

	p.freeze()
	frozen := time.Now()
	waitFor(t, "the routes to the frozen peer closed", 2*cluster.DefaultLeaseTTL, func() bool { return a.srv.NumRoutes() == 0 })
	took := time.Since(frozen)
	t.Logf("routes closed %v after the peer froze", took.Round(time.Millisecond))
	if took >= cluster.DefaultLeaseTTL {
		t.Fatalf("routes closed %v after the peer froze, past the lease TTL (%v)", took, cluster.DefaultLeaseTTL)
	}
}

// freezer is a TCP proxy that can stop forwarding while keeping its
// connections open: a frozen peer, as the network sees it.
type freezer struct {
	addr   string
	frozen atomic.Bool
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{addr: ln.Addr().String()}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go f.pipe(out, in)
			go f.pipe(in, out)
		}
	}()
	return f
}

// pipe copies src to dst until it is frozen; then it holds both open and
// reads nothing more.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if f.frozen.Load() {
			return // drops what it read, and never reads again
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { f.frozen.Store(true) }

// waitFor polls cond until it holds, failing the test when timeout
// passes first.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
