package host_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// asyncNode is one node shipping its change sets asynchronously (a copy
// is wanted, none can be made, so every commit is shipped).
func asyncNode(t *testing.T, dir string) (*host.Node, *hclient.Client) {
	if dir == "" {
		dir = t.TempDir()
	}
	return hosttest.Start(t, hosttest.Options{DataDir: dir, Programs: []string{"hostile"}, Configure: func(c *host.Config) {
		c.Replicas, c.ReplicaAck = 1, host.ReplicaAsync
	}})
}

// homeReport is the home's line of `host replicas`, and the stream's end.
func homeReport(t *testing.T, c *hclient.Client, obj string) (host.CopyInfo, uint64) {
	t.Helper()
	var rep host.ReplicaReport
	if err := c.Replicas(context.Background(), obj, &rep); err != nil {
		t.Fatal(err)
	}
	for _, cp := range rep.Copies {
		if cp.Home {
			return cp, rep.Stream.Applied
		}
	}
	t.Fatalf("no home in %+v", rep)
	return host.CopyInfo{}, 0
}

// stillFor checks that cond holds throughout d: what must not happen
// while shipping is held, which no event would announce.
func stillFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !cond() {
			t.Fatal(what)
		}
	}
}

// With --replica-ack async a call is answered once committed on its home,
// before its change set is in the stream; a follower receives the event
// only once it is.
func TestAsyncAckAnswersBeforeShippingAndDeliversAfter(t *testing.T) {
	t.Parallel()
	n, c := asyncNode(t, "")
	dcall(t, c, "hostile/f", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	// A stream subscriber from the start of the log.
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	var streamed atomic.Int32
	zero := uint64(0)
	go c.Subscribe(sctx, "hostile/pub", hclient.SubscribeOptions{Topic: "t", After: &zero}, func([]byte) bool {
		streamed.Add(1)
		return true
	})
	release := host.HoldShips(n)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	// A sync home would wait for the stream (10 s) and fail.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, "hostile/pub", "publish", []byte(`{"topic":"t","size":10}`)); err != nil {
		t.Fatalf("a call with shipping held: %v; want an answer at commit", err)
	}
	if home, _ := homeReport(t, c, "hostile/pub"); home.Unshipped < 1 {
		t.Fatalf("home reports %d unshipped change sets, want the call's", home.Unshipped)
	}
	received := func() int {
		var got []string
		json.Unmarshal([]byte(dcall(t, c, "hostile/f", "received", "")), &got)
		return len(got)
	}
	stillFor(t, "the follower or the stream received an event not yet shipped", 300*time.Millisecond, func() bool {
		r, s := received(), streamed.Load()
		if r != 0 || s != 0 {
			t.Logf("follower received %d, stream %d", r, s)
		}
		return r == 0 && s == 0
	})
	released = true
	release()
	waitUntil(t, "the follower and the stream receive the event once shipped", 10*time.Second, func() bool {
		return received() == 1 && streamed.Load() == 1
	})
	waitUntil(t, "nothing left to ship", 10*time.Second, func() bool {
		home, end := homeReport(t, c, "hostile/pub")
		return home.Unshipped == 0 && home.Position.Applied == end
	})
}

// A home holds at most host.AsyncWindow change sets unshipped: the next
// commit waits for room, so that is the most a crash can lose.
func TestAsyncAckWindowBoundsTheUnshipped(t *testing.T) {
	t.Parallel()
	n, c := asyncNode(t, "")
	dcall(t, c, "hostile/pub", "hook_runs", "") // active, its file caught up
	release := host.HoldShips(n)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	for i := range host.AsyncWindow {
		if _, err := c.Call(context.Background(), "hostile/pub", "publish", []byte(`{"topic":"t","size":10}`)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if home, _ := homeReport(t, c, "hostile/pub"); home.Unshipped != host.AsyncWindow {
		t.Fatalf("%d unshipped, want the window, %d", home.Unshipped, host.AsyncWindow)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), "hostile/pub", "publish", []byte(`{"topic":"t","size":10}`))
		done <- err
	}()
	stillFor(t, "a call past the window was answered before there was room", 300*time.Millisecond, func() bool {
		select {
		case <-done:
			return false
		default:
			return true
		}
	})
	released = true
	release()
	if err := <-done; err != nil {
		t.Fatalf("the call that waited for room: %v", err)
	}
	waitUntil(t, "everything shipped", 10*time.Second, func() bool {
		home, end := homeReport(t, c, "hostile/pub")
		return home.Unshipped == 0 && end == home.Position.Applied
	})
}

// A home file closed with its queue shipped is at its stream's end when
// opened again, though it records no stream sequences: it is used as it
// is, not taken for diverged and made again.
func TestAsyncHomeReopensAtItsStreamsEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := asyncNode(t, dir)
	for range 5 {
		dcall(t, c, "hostile/pub", "publish", `{"topic":"t","size":10}`)
	}
	waitUntil(t, "everything shipped", 10*time.Second, func() bool { return func() bool { h, _ := homeReport(t, c, "hostile/pub"); return h.Unshipped == 0 }() })
	applied := metric(t, c, "host_replica_applied_total")
	host.Evict(n, host.ObjectID{Program: "hostile", ID: "pub"})
	dcall(t, c, "hostile/pub", "publish", `{"topic":"t","size":10}`)
	if got := metric(t, c, "host_replica_applied_total"); got != applied {
		t.Fatalf("reopening applied %v change sets to the home file; want none", got-applied)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "objects", "hostile", "*"))
	for _, f := range files {
		if strings.Contains(f, ".diverged-") {
			t.Fatalf("the home file was set aside as diverged: %s", f)
		}
	}
	waitUntil(t, "the home at the stream's end, with its sequence", 10*time.Second, func() bool {
		h, end := homeReport(t, c, "hostile/pub")
		return h.Unshipped == 0 && h.Position.Applied == end && h.Position.Seq != 0
	})
	if _, err := os.Stat(filepath.Join(dir, "objects", "hostile", "pub.db")); err != nil {
		t.Fatal(err)
	}
}

// Under async acknowledgement a follower's delivery is answered once its
// receive's change set is shipped: the answer advances the publisher's
// edge cursor, and a crash of the follower's home could otherwise lose an
// event's effect that the publisher would never send again (a kill -9 test
// saw a tally 8 events short).
func TestAsyncFollowerAnswersItsDeliveryOnceShipped(t *testing.T) {
	t.Parallel()
	n, c := asyncNode(t, "")
	dcall(t, c, "hostile/f", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	release := host.HoldShipsOf(n, host.ObjectID{Program: "hostile", ID: "f"})
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	dcall(t, c, "hostile/pub", "publish", `{"topic":"t","size":10}`)
	cursor := func() float64 {
		for _, e := range edges(t, c, "hostile/pub") {
			if e["follower"] == "hostile/f" {
				f, _ := e["cursor"].(float64)
				return f
			}
		}
		t.Fatal("no edge to hostile/f")
		return 0
	}
	waitUntil(t, "the follower received the event", 10*time.Second, func() bool {
		return strings.Contains(dcall(t, c, "hostile/f", "received", ""), `"`)
	})
	stillFor(t, "the publisher's edge cursor passed an event whose receive is not shipped", 300*time.Millisecond, func() bool { return cursor() == 0 })
	released = true
	release()
	waitUntil(t, "the cursor advances once the receive is shipped", 10*time.Second, func() bool { return cursor() > 0 })
}
