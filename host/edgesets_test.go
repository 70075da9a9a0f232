package host_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// edgeBytes reads the edge part of the publisher node's remote connection
// batches so far, and how many carried a whole set.
func edgeBytes(t *testing.T, c *hclient.Client) (bytes, whole float64) {
	t.Helper()
	return metric(t, c, `host_connection_batch_bytes_total{part="edges"}`), metric(t, c, `host_connection_batch_whole_sets_total`)
}

// inOrderFrom checks that w got seqs from, from+1, …, through (every one,
// in order) and nothing else.
func inOrderFrom(t *testing.T, name string, w *watcher, from, through uint64) {
	t.Helper()
	var want []uint64
	for s := from; s <= through; s++ {
		want = append(want, s)
	}
	waitUntil(t, name+" gets its messages", 20*time.Second, func() bool { return len(w.seqs(t)) >= len(want) })
	if got := w.seqs(t); !slices.Equal(got, want) {
		t.Fatalf("%s got %v, want %v", name, got, want)
	}
}

// Watchers on other nodes keep receiving every message in order while
// others join and leave between the messages, and the edge bytes of a
// steady batch do not grow with the watchers: 8 watchers or 80 on a node,
// a batch carries the set's version, not its edges.
//
// conformance: D07 D08 D24
func TestEdgeSetsRemoteWatchersAcrossChurn(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms})
	pub := &hclient.Client{Base: nodes[0].URL()}
	dcall(t, pub, "chat/room1", "post", `{"text":"home on node 0"}`) // seq 1
	remote := []*hclient.Client{{Base: nodes[1].URL()}, {Base: nodes[2].URL()}}
	var stable []*watcher
	for i := range 16 {
		stable = append(stable, follow(t, remote[i%2], "chat/w", "chat/room1", "messages", ""))
	}
	seq := uint64(1)
	post := func() {
		t.Helper()
		seq++
		dcall(t, pub, "chat/room1", "post", fmt.Sprintf(`{"text":"m%d"}`, seq))
	}
	// steady posts k messages once the set is settled and returns the
	// edge bytes per remote batch they cost.
	steady := func(k int) float64 {
		t.Helper()
		post() // carries the set's changes, if any
		inOrderFrom(t, "a stable watcher", stable[0], 2, seq)
		b0, w0 := edgeBytes(t, pub)
		n0 := metric(t, pub, `host_delivery_calls_total{kind="connection_batch",path="remote"}`)
		for range k {
			post()
			inOrderFrom(t, "a stable watcher", stable[1], 2, seq)
		}
		b1, w1 := edgeBytes(t, pub)
		n1 := metric(t, pub, `host_delivery_calls_total{kind="connection_batch",path="remote"}`)
		if w1 != w0 || n1-n0 != float64(2*k) {
			t.Fatalf("steady messages: %v whole sets, %v remote batches for %d messages to 2 nodes", w1-w0, n1-n0, k)
		}
		return (b1 - b0) / (n1 - n0)
	}
	small := steady(3)

	// Churn: between messages, watchers join on both remote nodes and
	// some leave; the stable ones see every message, each joined one
	// every message from its join until it leaves.
	type joined struct {
		w    *watcher
		from uint64
	}
	var churned []joined
	for round := range 8 {
		for i := range 8 {
			w := follow(t, remote[(round+i)%2], "chat/w", "chat/room1", "messages", "")
			churned = append(churned, joined{w, seq + 1})
		}
		if round%2 == 1 {
			// The oldest four leave: their sockets close, their edges go.
			for _, j := range churned[:4] {
				j.w.ws.CloseNow()
				<-j.w.done
			}
			churned = churned[4:]
		}
		post()
	}
	for i, w := range stable {
		inOrderFrom(t, fmt.Sprintf("stable watcher %d", i), w, 2, seq)
	}
	for i, j := range churned {
		inOrderFrom(t, fmt.Sprintf("joined watcher %d", i), j.w, j.from, seq)
	}
	waitUntil(t, "the left watchers' edges pruned", 20*time.Second, func() bool {
		return len(edges(t, pub, "chat/room1")) == len(stable)+len(churned)
	})
	large := steady(3)
	t.Logf("edge bytes per steady remote batch: %.1f with 8 watchers per node, %.1f with %d", small, large, (len(stable)+len(churned))/2)
	if large > small+2 || large > 40 {
		t.Fatalf("steady batches carry %.1f edge bytes with %d watchers, %.1f with %d: they should not grow with watchers",
			large, len(stable)+len(churned), small, len(stable))
	}
}

// A receiving node that loses its copy of a publisher's edge set (here:
// its bound of one set, two publishers taking turns) answers the next
// batch Unknown and gets the whole set once, in the same round: its
// watchers miss nothing. A node that restarts comes back under a new id,
// gets whole sets for its new sockets, and its old sockets' edges are
// pruned.
//
// conformance: D21 D24
func TestEdgeSetsReceiverLosesItsCopy(t *testing.T) {
	t.Parallel()
	nodes, cfgs := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms, Configure: func(c *host.Config) {
		c.Delivery.EdgeCopies = 1
		c.Replicas = 0
	}})
	pub := &hclient.Client{Base: nodes[0].URL()}
	rooms := []string{"chat/room1", "chat/room2"}
	for _, r := range rooms {
		dcall(t, pub, r, "post", `{"text":"home on node 0"}`) // seq 1
	}
	c1 := &hclient.Client{Base: nodes[1].URL()}
	c2 := &hclient.Client{Base: nodes[2].URL()}
	var ws [2][]*watcher // by room
	for i := range 6 {
		for r, room := range rooms {
			ws[r] = append(ws[r], follow(t, []*hclient.Client{c1, c2}[i%2], "chat/w", room, "messages", ""))
		}
	}
	_, whole0 := edgeBytes(t, pub)
	const msgs = 6
	for m := range msgs {
		for r, room := range rooms {
			// One message, one round: wait for it before the next.
			dcall(t, pub, room, "post", fmt.Sprintf(`{"text":"m%d"}`, m))
			for i, w := range ws[r] {
				inOrderFrom(t, fmt.Sprintf("%s watcher %d", room, i), w, 2, uint64(m+2))
			}
		}
	}
	// Each node holds one room's set: every batch after the other room's
	// finds its own evicted, is answered Unknown and brings it whole;
	// the first batch to each node is whole anyway. 2 rooms × 2 nodes.
	if _, whole := edgeBytes(t, pub); whole-whole0 != 4*msgs {
		t.Fatalf("%v whole sets for %d alternating messages per room to 2 nodes: each batch should find its set evicted and come whole, once", whole-whole0, msgs)
	}

	// Node 2 restarts: a new id, new sockets; the old id's edges go.
	oldID := nodes[2].ID()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	nodes[2].Shutdown(sctx)
	cancel()
	cfg := cfgs[2]
	cfg.Listen = "127.0.0.1:0"
	n2 := hosttest.StartConfig(t, cfg)
	waitUntil(t, "the old id gone from the cluster", 20*time.Second, func() bool {
		var v struct{ Nodes []struct{ ID string } }
		pub.Get(context.Background(), "/v1/cluster", &v)
		for _, n := range v.Nodes {
			if n.ID == oldID {
				return false
			}
		}
		return len(v.Nodes) == 3
	})
	fresh := follow(t, &hclient.Client{Base: n2.URL()}, "chat/w", "chat/room1", "messages", "")
	dcall(t, pub, "chat/room1", "post", `{"text":"after the restart"}`)
	inOrderFrom(t, "the restarted node's watcher", fresh, msgs+2, msgs+2)
	inOrderFrom(t, "node 1's watcher", ws[0][0], 2, msgs+2)
	waitUntil(t, "the old node's edges pruned", 20*time.Second, func() bool {
		return len(edges(t, pub, "chat/room1")) == 4 // node 1's three, the fresh one
	})
}
