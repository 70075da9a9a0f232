package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm/vmtest"
)

// startClusterNode runs `host serve` in a cluster of routes as its own
// process; the caller waits for it with waitHealthy.
func startClusterNode(t *testing.T, bin, data, addr string, route string, peers []string, more ...string) *server {
	t.Helper()
	// A cluster name of its own: a stray route from another test's cluster
	// is refused instead of merging.
	name := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid())
	extra := []string{"--nats-cluster", route, "--nats-cluster-name", name, "--lease-ttl", "15s", "--heartbeat", "500ms"}
	for _, p := range peers {
		extra = append(extra, "--nats-routes", "nats://"+p)
	}
	return spawnServer(t, bin, data, addr, append(extra, more...)...)
}

// TestD21_KillNodeHoldingSockets runs three `host serve` processes in a
// cluster, watches a room from two of them, kills one with SIGKILL and
// checks: delivery to the other watcher goes on, the dead node's
// connection edges are pruned, and its objects answer "unavailable" at
// once instead of hanging. The killed node is made the leader of the lease
// bucket first: while NATS elects a new one no lease can be renewed, and
// the survivors' leases must outlast that (they are checked a full lease
// TTL after the kill).
//
// conformance: D13 D21
func TestD21_KillNodeHoldingSockets(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a cluster of processes; not in -short")
	}
	bin := hostBinary(t)
	addrs := []string{freePort(t), freePort(t), freePort(t)}
	routes := []string{freePort(t), freePort(t), freePort(t)}
	natsClient := freePort(t) // node 0's NATS client port, to move the lease leader
	servers := make([]*server, 3)
	for i := range servers {
		var peers []string
		for j, r := range routes {
			if j != i {
				peers = append(peers, r)
			}
		}
		// No copies: the dead node's object must answer "unavailable"
		// (with copies it is taken over; TestTakeoverAfterKill9).
		more := []string{"--replicas", "0"}
		if i == 0 {
			more = append(more, "--nats-listen", natsClient)
		}
		servers[i] = startClusterNode(t, bin, t.TempDir(), addrs[i], routes[i], peers, more...)
	}
	for i, s := range servers {
		waitHealthy(t, addrs[i], s)
	}
	ctx := context.Background()
	cs := make([]*hclient.Client, 3)
	for i, a := range addrs {
		cs[i] = &hclient.Client{Base: "http://" + a}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var v struct{ Nodes []any }
		if cs[0].Get(ctx, "/v1/cluster", &v) == nil && len(v.Nodes) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cluster did not form")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := cs[0].Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].Call(ctx, "chat/room1", "post", []byte(`{"text":"home on node 0"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[2].Call(ctx, "chat/doomed", "post", []byte(`{"text":"home on node 2"}`)); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	got := map[int][]string{}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	for _, i := range []int{1, 2} {
		followed := make(chan struct{})
		go func() {
			cs[i].Watch(wctx, "chat/room1", hclient.WatchOptions{Topic: "messages"}, func(frame []byte) bool {
				mu.Lock()
				got[i] = append(got[i], string(frame))
				mu.Unlock()
				return true
			})
		}()
		// Watch returns frames only after the follow; wait for the edge.
		go func() {
			for {
				var e struct{ Edges []any }
				if cs[0].Get(ctx, "/v1/objects/chat/room1/edges", &e) == nil && len(e.Edges) >= i {
					close(followed)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		<-followed
	}
	count := func(i int) int {
		mu.Lock()
		defer mu.Unlock()
		return len(got[i])
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cs[0].Call(ctx, "chat/room1", "post", []byte(`{"text":"before"}`))
	waitFor("both watchers see the first post", func() bool { return count(1) == 1 && count(2) == 1 })

	moveLeaseLeader(t, natsClient, "host-"+routes[2])
	var health struct{ Node string }
	cs[2].Get(ctx, "/healthz", &health)
	servers[2].cmd.Process.Kill()
	killed := time.Now()
	<-servers[2].done
	servers[2].waited = true

	for k := 0; k < 5; k++ {
		if _, err := cs[0].Call(ctx, "chat/room1", "post", []byte(fmt.Sprintf(`{"text":"after %d"}`, k))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("the live node's watcher keeps receiving", func() bool { return count(1) == 6 })
	var lastEdges any
	defer func() {
		if t.Failed() {
			t.Logf("dead node %s; last edges %+v", health.Node, lastEdges)
		}
	}()
	waitFor("the dead node's connection edge pruned", func() bool {
		var e struct {
			Edges []struct{ Node string } `json:"edges"`
		}
		if err := cs[0].Get(ctx, "/v1/objects/chat/room1/edges", &e); err != nil {
			lastEdges = err
			return false
		}
		lastEdges = e
		for _, edge := range e.Edges {
			if edge.Node == health.Node {
				return false
			}
		}
		return len(e.Edges) == 1
	})
	// A full lease TTL (15 s) after the kill, with the lease bucket's
	// leader gone, the live nodes are still live: node 1's watcher still
	// receives and its edge is still there.
	time.Sleep(time.Until(killed.Add(15*time.Second + 2*time.Second)))
	if _, err := cs[0].Call(ctx, "chat/room1", "post", []byte(`{"text":"after the lease TTL"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor("the live node's watcher receives a lease TTL after the kill", func() bool { return count(1) == 7 })
	var after struct {
		Edges []struct{ Node string } `json:"edges"`
	}
	if err := cs[0].Get(ctx, "/v1/objects/chat/room1/edges", &after); err != nil || len(after.Edges) != 1 {
		t.Fatalf("edges a lease TTL after the kill: %+v %v", after, err)
	}
	// The dead node's object: a clear error, promptly.
	start := time.Now()
	var err error
	for time.Since(start) < 30*time.Second {
		_, err = cs[1].Call(ctx, "chat/doomed", "history", nil)
		var ae *hclient.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable && strings.Contains(ae.Message, "unavailable") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var ae *hclient.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("object on the dead node: %v", err)
	}
	one := time.Now()
	cs[1].Call(ctx, "chat/doomed", "history", nil)
	if d := time.Since(one); d > 2*time.Second {
		t.Fatalf("the unavailable object took %v to answer", d)
	}
	var first map[string]any
	json.Unmarshal([]byte(got[1][0]), &first)
	if first["type"] != "event" {
		t.Fatalf("frame %v", first)
	}
}

// moveLeaseLeader makes the server named leader lead the lease bucket's
// stream, through the JetStream API on a node's client port.
func moveLeaseLeader(t *testing.T, natsAddr, leader string) {
	t.Helper()
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const stream = "KV_host_nodes"
	for {
		st, err := js.Stream(ctx, stream)
		if err == nil {
			info, err := st.Info(ctx)
			if err == nil && info.Cluster != nil && info.Cluster.Leader == leader {
				t.Logf("%s leads the lease bucket", leader)
				return
			}
			if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
				req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, leader)
				if m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req)); err == nil {
					t.Logf("lease leader %s asked to step down for %s: %s", info.Cluster.Leader, leader, m.Data)
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("could not make %s lead the lease bucket", leader)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
