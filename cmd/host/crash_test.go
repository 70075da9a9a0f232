package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/vm/vmtest"
)

// TestD17_ExactlyOnceEffectAcrossKill9 kills a separate `host serve`
// process with SIGKILL at random points while 1,000 chat posts flow to a
// tally follower, restarting it each time. Afterwards the tally has counted
// every committed post exactly once, and no acknowledged post was lost.
//
// conformance: D15 D16 D17 D20
func TestD17_ExactlyOnceEffectAcrossKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	bin := hostBinary(t)
	data := t.TempDir()
	addr := freePort(t)
	srv := startServer(t, bin, data, addr)
	c := &host.Client{Base: "http://" + addr}
	ctx := context.Background()
	for _, p := range []string{"chat", "tally"} {
		if _, err := c.Upload(ctx, p, vmtest.Wasm(t, p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Call(ctx, "tally/t1", "follow", []byte(`{"publisher":"chat/room1"}`)); err != nil {
		t.Fatal(err)
	}

	const target = 1000
	var acked atomic.Int64
	stop := make(chan struct{})
	posterDone := make(chan struct{})
	go func() {
		defer close(posterDone)
		for acked.Load() < target {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Call(cctx, "chat/room1", "post", []byte(`{"author":"ann","text":"x"}`))
			cancel()
			if err != nil {
				time.Sleep(10 * time.Millisecond) // the node is down; retry
				continue
			}
			acked.Add(1)
		}
	}()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for kill := 0; kill < 3; kill++ {
		at := int64(100 + kill*250 + rng.IntN(150))
		for acked.Load() < at {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		srv.cmd.Process.Kill() // SIGKILL: no shutdown path runs
		<-srv.done
		srv.waited = true
		t.Logf("killed at %d acknowledged posts", acked.Load())
		srv = startServer(t, bin, data, addr)
	}
	<-posterDone
	close(stop)

	// One last post tells how many posts committed in all (some whose
	// reply was lost in a kill may have committed too).
	out, err := c.Call(ctx, "chat/room1", "post", []byte(`{"author":"last","text":"end"}`))
	if err != nil {
		t.Fatal(err)
	}
	var last struct{ N int64 }
	json.Unmarshal(out, &last)
	if last.N < target+1 {
		t.Fatalf("chat has %d posts but %d were acknowledged: an acknowledged post was lost", last.N, acked.Load()+1)
	}
	var counts struct {
		Total      int64            `json:"total"`
		Duplicates int64            `json:"duplicates"`
		Authors    map[string]int64 `json:"authors"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.Call(ctx, "tally/t1", "counts", nil)
		if err == nil && json.Unmarshal(out, &counts) == nil && counts.Total >= last.N {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tally reached %d of %d (err %v)", counts.Total, last.N, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if counts.Total != last.N || counts.Duplicates != 0 || counts.Authors["last"] != 1 {
		t.Fatalf("tally %+v, want total %d with no duplicates", counts, last.N)
	}
	// The follower edge rehomed to the restarted node with no failure.
	var edges struct {
		Edges []struct {
			Node     string `json:"node"`
			Attempts int    `json:"attempts"`
		} `json:"edges"`
	}
	if err := c.Get(ctx, "/v1/objects/chat/room1/edges", &edges); err != nil {
		t.Fatal(err)
	}
	var health struct{ Node string }
	if err := c.Get(ctx, "/healthz", &health); err != nil {
		t.Fatal(err)
	}
	if len(edges.Edges) != 1 || edges.Edges[0].Node != health.Node || edges.Edges[0].Attempts != 0 {
		t.Fatalf("edges %+v: want the tally edge on the live node %s", edges.Edges, health.Node)
	}
}
