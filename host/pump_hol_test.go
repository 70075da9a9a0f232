package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// latencyWatcher is a WebSocket client following a publisher's topic that
// notes when each event's frame arrives.
type latencyWatcher struct {
	mu sync.Mutex
	at map[uint64]time.Time
}

func watchLatency(t testing.TB, base, attach, publisher, topic string) *latencyWatcher {
	t.Helper()
	id, _ := host.ParseObjectID(attach)
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(base, "http")+"/v1/objects/"+id.Program+"/"+id.ID+"/connect", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	b, _ := json.Marshal(map[string]string{"type": "follow", "object": publisher, "topic": topic})
	if err := ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("waiting to follow: %v", err)
		}
		var m struct{ Type string }
		if json.Unmarshal(b, &m) == nil && m.Type == "followed" {
			break
		}
	}
	w := &latencyWatcher{at: map[uint64]time.Time{}}
	go func() {
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			now := time.Now()
			var m struct {
				Type string
				Seq  uint64
			}
			if json.Unmarshal(b, &m) == nil && m.Type == "event" {
				w.mu.Lock()
				w.at[m.Seq] = now
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *latencyWatcher) has(seq uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.at[seq]
	return ok
}

func (w *latencyWatcher) arrived(seq uint64) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at[seq]
}

// received returns what a hostile follower's receive recorded, in arrival
// order, as (topic, seq) pairs.
func received(t testing.TB, c *hclient.Client, follower string) [][2]string {
	t.Helper()
	out, err := c.Call(context.Background(), follower, "received", nil)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	json.Unmarshal(out, &lines)
	var got [][2]string
	for _, l := range lines {
		f := strings.Fields(l) // publisher topic seq payload
		got = append(got, [2]string{f[1], f[2]})
	}
	return got
}

// percentile is the nearest-rank p-th percentile: at most (100-p)% of lat
// lies above it.
func percentile(lat []time.Duration, p int) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[max(0, (len(s)*p+99)/100-1)]
}

func p99(lat []time.Duration) time.Duration { return percentile(lat, 99) }

// While a durable follower's receive runs 9 s (twice in a row, so it is
// busy for the whole measurement), the publisher's sockets get every event
// at once: each one reaches every socket while the follower is still inside
// its slow receives, and the p99 from the publish call stays under
// 250 ms (a delivery that waited for the follower would take seconds). The
// 50 ms figure is measured by BenchmarkHOLSocketLatency, beside the idle
// phase this test also logs; a loaded machine's stalls are not the
// product's. The follower then gets every event once, in publish order.
// Not parallel: it measures latency.
func TestPumpSlowFollowerDoesNotDelaySockets(t *testing.T) {
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	var ws []*latencyWatcher
	for range 3 {
		ws = append(ws, watchLatency(t, c.Base, "chat/w", "hostile/pub", "t"))
	}
	dcall(t, c, "hostile/slow", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	seq := uint64(0)
	// measure publishes until enough are sent or the time is up, and
	// returns every socket's latency.
	measure := func(count int, until time.Time) []time.Duration {
		t.Helper()
		sent := map[uint64]time.Time{}
		for len(sent) < count && time.Now().Before(until) {
			seq++
			sent[seq] = time.Now()
			dcall(t, c, "hostile/pub", "publish", strconv.Itoa(len(sent)))
			waitUntil(t, "sockets get the event", 20*time.Second, func() bool {
				for _, w := range ws {
					if !w.has(seq) {
						return false
					}
				}
				return true
			})
		}
		var lat []time.Duration
		for s, t0 := range sent {
			for _, w := range ws {
				lat = append(lat, w.arrived(s).Sub(t0))
			}
		}
		return lat
	}
	idle := measure(100, time.Now().Add(time.Minute))
	waitUntil(t, "the idle phase delivered", 20*time.Second, func() bool { return len(received(t, c, "hostile/slow")) == int(seq) })

	const spin = 9 * time.Second
	spinStart := time.Now()
	for range 2 {
		seq++
		dcall(t, c, "hostile/pub", "publish", fmt.Sprintf(`"sleep:%d"`, spin.Milliseconds()))
	}
	waitUntil(t, "the follower's delivery in flight", 5*time.Second, func() bool { return host.PumpLanes(n) == 1 })
	busy := measure(150, spinStart.Add(spin+spin/3))
	measured := time.Since(spinStart)
	if host.PumpLanes(n) != 1 || measured > 2*spin-time.Second || len(busy) < 40*len(ws) {
		t.Fatalf("%d deliveries in %v: the measurement must take 40 publishes or more and end while the follower is still busy", len(busy), measured)
	}
	t.Logf("publish → socket p50 %v, p99 %v over %d deliveries while the follower's receive ran; idle follower p50 %v, p99 %v (target 50 ms)",
		percentile(busy, 50), p99(busy), len(busy), percentile(idle, 50), p99(idle))
	if p := p99(busy); p >= 250*time.Millisecond {
		t.Fatalf("publish → socket p99 %v while a follower is busy: sockets waited for it", p)
	}

	var got [][2]string
	want := int(seq)
	waitUntil(t, "the follower gets every event", 60*time.Second, func() bool {
		got = received(t, c, "hostile/slow")
		return len(got) >= want
	})
	if took := time.Since(spinStart); took < 2*spin {
		t.Fatalf("the follower finished after %v: its receives did not run 2×%v", took, spin)
	}
	for i, g := range got {
		if g[1] != strconv.Itoa(i+1) || len(got) != want {
			t.Fatalf("follower's receive log %v: want seqs 1..%d once each, in order", got, want)
		}
	}
	waitUntil(t, "the lane ends", 20*time.Second, func() bool { return host.PumpLanes(n) == 0 })
}

// A follower with edges on topics a and b whose receive fails for a while
// gets, after it recovers, the publisher's events in publish order across
// both topics: the failing edge holds the other back under one backoff,
// visible in the edges' states.
//
// conformance: D18 D24
func TestD24_FollowerOrderAcrossTopicsAfterFailure(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms, Configure: func(cfg *host.Config) { cfg.Delivery.RetryBase = 50 * time.Millisecond }})
	for _, topic := range []string{"a", "b"} {
		dcall(t, c, "hostile/f", "follow", fmt.Sprintf(`{"publisher":"hostile/pub","topic":%q}`, topic))
	}
	// Fails for 3 s: attempts at 0, 50, 150, 350, 750 and 1550 ms fail,
	// the one at 3150 ms goes through (the 8th failure, at 6350 ms, would
	// drop the edge). Not shorter: the window must outlast the four
	// publishes below, so that b's events come due while a retries; under
	// a loaded -race run they took more than the second it once was.
	until := time.Now().Add(3 * time.Second).UnixMilli()
	dcall(t, c, "hostile/pub", "publish", fmt.Sprintf(`{"topic":"a","payload":"fail_until:%d"}`, until))
	for i, topic := range []string{"b", "a", "b", "a"} {
		dcall(t, c, "hostile/pub", "publish", fmt.Sprintf(`{"topic":%q,"payload":%d}`, topic, i))
	}
	states := func() map[string]string {
		out := map[string]string{}
		for _, e := range edges(t, c, "hostile/pub") {
			out[e["topic"].(string)] = fmt.Sprint(e["state"])
		}
		return out
	}
	seen := false
	var got [][2]string
	waitUntil(t, "the follower gets all five", 30*time.Second, func() bool {
		if s := states(); s["a"] == "retrying" && s["b"] == "held" {
			seen = true
		}
		got = received(t, c, "hostile/f")
		return len(got) == 5
	})
	want := [][2]string{{"a", "1"}, {"b", "2"}, {"a", "3"}, {"b", "4"}, {"a", "5"}}
	if !slices.Equal(got, want) {
		t.Fatalf("receive log %v, want %v: publish order across the follower's edges", got, want)
	}
	if !seen {
		t.Error("never saw the failing edge retrying and its sibling held")
	}
	waitUntil(t, "both edges ok", 10*time.Second, func() bool {
		s := states()
		return s["a"] == "ok" && s["b"] == "ok"
	})
	if got := metric(t, c, "host_edges_dropped_total"); got != 0 {
		t.Fatalf("%v edges dropped", got)
	}
}

// A follower whose home is gone and not yet served elsewhere is not a
// failure: `host edges` shows its edge unplaced with its next attempt,
// backing off, no attempt counted; once the follower is served again it
// gets what it missed.
//
// conformance: D20
func TestD20_UnplacedFollowerShownThenRouted(t *testing.T) {
	t.Parallel()
	// No copies: the follower's node gone, nothing can serve it.
	nodes, cfgs := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms, Configure: func(cfg *host.Config) {
		cfg.Delivery.RetryBase = 50 * time.Millisecond
		cfg.Replicas = 0
	}})
	ctx := context.Background()
	a := &hclient.Client{Base: nodes[0].URL()}
	c := &hclient.Client{Base: nodes[2].URL()}
	dcall(t, a, "chat/room1", "post", `{"text":"home on node 0"}`)
	dcall(t, c, "tally/t1", "follow", `{"publisher":"chat/room1"}`) // tally homes on node 2
	dcall(t, a, "chat/room1", "post", `{"author":"ann","text":"one"}`)
	waitUntil(t, "counted on node 2", 20*time.Second, func() bool { return strings.Contains(dcall(t, c, "tally/t1", "counts", ""), `"total":1`) })
	oldID := nodes[2].ID()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	nodes[2].Shutdown(sctx)
	cancel()
	waitUntil(t, "node 2 gone", 20*time.Second, func() bool {
		var v struct{ Nodes []struct{ ID string } }
		a.Get(ctx, "/v1/cluster", &v)
		return len(v.Nodes) == 2
	})
	dcall(t, a, "chat/room1", "post", `{"author":"bob","text":"two"}`)
	var e map[string]any
	waitUntil(t, "the edge unplaced and backing off", 20*time.Second, func() bool {
		es := edges(t, a, "chat/room1")
		if len(es) != 1 {
			t.Fatalf("edges %v", es)
		}
		e = es[0]
		u, _ := e["unplaced"].(float64)
		return e["state"] == "unplaced" && u >= 3
	})
	if e["attempts"] != float64(0) || e["next_attempt"] == nil || e["node"] != oldID {
		t.Fatalf("unplaced edge %v: want no attempt counted, a next attempt, its old node", e)
	}
	next, err := time.Parse(time.RFC3339Nano, e["next_attempt"].(string))
	if err != nil || time.Until(next) > 3200*time.Millisecond {
		t.Fatalf("next attempt %v: want within the 3.2 s cap (50 ms doubling)", e["next_attempt"])
	}

	// Node 2's directory comes back under a new id and serves the tally.
	cfg := cfgs[2]
	cfg.Listen = "127.0.0.1:0"
	n2 := hosttest.StartConfig(t, cfg)
	c2 := &hclient.Client{Base: n2.URL()}
	waitUntil(t, "the tally counts what it missed", 30*time.Second, func() bool {
		return dcall(t, c2, "tally/t1", "counts", "") == `{"authors":{"ann":1,"bob":1},"duplicates":0,"total":2}`
	})
	waitUntil(t, "the edge routed and ok", 20*time.Second, func() bool {
		e = edges(t, a, "chat/room1")[0]
		return e["state"] == "ok" && e["node"] == n2.ID()
	})
	if e["attempts"] != float64(0) || e["unplaced"] != nil || e["next_attempt"] != nil {
		t.Fatalf("routed edge %v", e)
	}
	if got := metric(t, a, "host_delivery_retries_total") + metric(t, a, "host_edges_dropped_total"); got != 0 {
		t.Fatalf("%v retries or drops: an unplaced follower is not a failure", got)
	}
}

// Shutdown waits for a follower lane in flight and leaves no goroutine
// behind. Not parallel: it counts goroutines.
func TestPumpShutdownWaitsForLanes(t *testing.T) {
	for _, p := range []string{"chat", "tally", "hostile"} {
		vmtest.Wasm(t, p) // build outside the measurement
	}
	http.DefaultClient.CloseIdleConnections()
	before := runtime.NumGoroutine()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	dcall(t, c, "hostile/slow", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	dcall(t, c, "hostile/pub", "publish", `"spin:2000"`)
	waitUntil(t, "the follower's delivery in flight", 10*time.Second, func() bool { return host.PumpLanes(n) == 1 })
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if k := host.PumpLanes(n); k != 0 {
		t.Fatalf("%d lanes after shutdown", k)
	}
	http.DefaultClient.CloseIdleConnections()
	var now int
	deadline := time.Now().Add(10 * time.Second)
	for {
		now = runtime.NumGoroutine()
		if now <= before || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if now > before {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%d goroutines before the node, %d after shutdown:\n%s", before, now, buf)
	}
}

// An unplaced follower is routed as soon as it is served again, not at the
// end of its backoff: when its node's data directory comes back and takes
// it over, the publisher hears of it and delivers at once.
//
// conformance: D20
func TestD20_UnplacedFollowerRoutedOnceServedAgain(t *testing.T) {
	t.Parallel()
	// A backoff longer than the restart: routing at the next attempt would
	// come too late for the check.
	// No copies: the follower's node gone, nothing can serve it.
	nodes, cfgs := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms, Configure: func(cfg *host.Config) {
		cfg.Delivery.RetryBase = 45 * time.Second
		cfg.Replicas = 0
	}})
	ctx := context.Background()
	a := &hclient.Client{Base: nodes[0].URL()}
	c := &hclient.Client{Base: nodes[2].URL()}
	dcall(t, a, "chat/room1", "post", `{"text":"home on node 0"}`)
	dcall(t, c, "tally/t1", "follow", `{"publisher":"chat/room1"}`) // tally homes on node 2
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	nodes[2].Shutdown(sctx)
	cancel()
	waitUntil(t, "node 2 gone", 20*time.Second, func() bool {
		var v struct{ Nodes []struct{ ID string } }
		a.Get(ctx, "/v1/cluster", &v)
		return len(v.Nodes) == 2
	})
	dcall(t, a, "chat/room1", "post", `{"author":"bob","text":"missed"}`)
	var next time.Time
	waitUntil(t, "the edge unplaced", 20*time.Second, func() bool {
		e := edges(t, a, "chat/room1")[0]
		if e["state"] != "unplaced" {
			return false
		}
		var err error
		next, err = time.Parse(time.RFC3339Nano, e["next_attempt"].(string))
		return err == nil
	})
	cfg := cfgs[2]
	cfg.Listen = "127.0.0.1:0"
	n2 := hosttest.StartConfig(t, cfg)
	c2 := &hclient.Client{Base: n2.URL()}
	waitUntil(t, "the tally counts what it missed before the backoff ends", time.Until(next)-time.Second, func() bool {
		return dcall(t, c2, "tally/t1", "counts", "") == `{"authors":{"bob":1},"duplicates":0,"total":1}`
	})
	if got := metric(t, a, "host_delivery_retries_total") + metric(t, a, "host_edges_dropped_total"); got != 0 {
		t.Fatalf("%v retries or drops: an unplaced follower is not a failure", got)
	}
}
