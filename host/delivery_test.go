package host_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// deliveryPrograms are the examples the delivery tests' nodes carry.
var deliveryPrograms = []string{"chat", "tally", "hostile"}

func dcall(t *testing.T, c *hclient.Client, object, method, payload string) string {
	t.Helper()
	out, err := c.Call(context.Background(), object, method, []byte(payload))
	if err != nil {
		t.Fatalf("%s %s: %v", object, method, err)
	}
	return string(out)
}

// eventually polls cond until it holds or the deadline passes.
var waitUntil = hosttest.WaitFor

// metric reads one sample from /metrics; name may include labels exactly
// as exposed, e.g. `host_edges_pruned_total{reason="socket_gone"}`.
func metric(t testing.TB, c *hclient.Client, name string) float64 {
	t.Helper()
	resp, err := http.Get(c.Base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			v, _ := strconv.ParseFloat(strings.TrimPrefix(line, name+" "), 64)
			return v
		}
	}
	return 0
}

func edges(t *testing.T, c *hclient.Client, object string) []map[string]any {
	t.Helper()
	var out struct {
		Edges []map[string]any `json:"edges"`
	}
	id, _ := host.ParseObjectID(object)
	if err := c.Get(context.Background(), "/v1/objects/"+id.Program+"/"+id.ID+"/edges", &out); err != nil {
		t.Fatal(err)
	}
	return out.Edges
}

// watcher is a real WebSocket client that follows and collects frames.
type watcher struct {
	ws     *websocket.Conn
	mu     sync.Mutex
	frames []string
	done   chan struct{}
}

func dial(t *testing.T, c *hclient.Client, attach string) *websocket.Conn {
	t.Helper()
	id, _ := host.ParseObjectID(attach)
	url := "ws" + strings.TrimPrefix(c.Base, "http") + "/v1/objects/" + id.Program + "/" + id.ID + "/connect"
	ws, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(16 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func send(t *testing.T, ws *websocket.Conn, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// readUntil reads frames until one has the given type; it returns it.
func readUntil(t *testing.T, ws *websocket.Conn, typ string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v", typ, err)
		}
		var m map[string]any
		if json.Unmarshal(b, &m) == nil && m["type"] == typ {
			return m
		}
	}
}

// follow attaches a watcher to attach, follows publisher's topic and
// starts collecting frames.
func follow(t *testing.T, c *hclient.Client, attach, publisher, topic, params string) *watcher {
	t.Helper()
	ws := dial(t, c, attach)
	send(t, ws, map[string]string{"type": "follow", "object": publisher, "topic": topic, "params": params})
	readUntil(t, ws, "followed")
	w := &watcher{ws: ws, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			w.mu.Lock()
			w.frames = append(w.frames, string(b))
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watcher) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.frames...)
}

func (w *watcher) seqs(t *testing.T) []uint64 {
	var out []uint64
	for _, f := range w.got() {
		var m struct {
			Type string `json:"type"`
			Seq  uint64 `json:"seq"`
		}
		if json.Unmarshal([]byte(f), &m) == nil && m.Type == "event" {
			out = append(out, m.Seq)
		}
	}
	return out
}

// conformance: D11
func TestD11_ForwardEnvelopeWithoutVMAndEventExport(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	// lobby is never called: if the forward path ran a VM for it, it would
	// be activated and get a file.
	plain := follow(t, c, "chat/lobby", "chat/room1", "messages", "")
	shaped := follow(t, c, "hostile/shaper", "chat/room1", "messages", "")
	dcall(t, c, "chat/room1", "post", `{"author":"ann","text":"hello"}`)
	dcall(t, c, "chat/room1", "post", `{"author":"bob","text":"please skip this"}`)
	dcall(t, c, "chat/room1", "post", `{"author":"cy","text":"bye"}`)
	waitUntil(t, "3 envelopes", 10*time.Second, func() bool { return len(plain.got()) == 3 })
	waitUntil(t, "2 shaped frames", 10*time.Second, func() bool { return len(shaped.got()) == 2 })
	for i, f := range plain.got() {
		var env struct {
			Type, Publisher, Topic string
			Seq                    uint64
			Payload                struct{ Author, Text string }
		}
		if err := json.Unmarshal([]byte(f), &env); err != nil {
			t.Fatal(err)
		}
		if env.Type != "event" || env.Publisher != "chat/room1" || env.Topic != "messages" || env.Seq != uint64(i+1) {
			t.Fatalf("envelope %d: %s", i, f)
		}
	}
	for _, f := range shaped.got() {
		if !strings.HasPrefix(f, "EVENT:{") || strings.Contains(f, "skip") {
			t.Fatalf("shaped frame %q", f)
		}
	}
	if _, err := os.Stat(filepath.Join(n.DataDir(), "objects", "chat", "lobby.db")); err == nil {
		t.Fatal("the forward envelope path activated the connection's object")
	}
	if got := metric(t, c, "host_event_handler_calls_total"); got != 3 {
		t.Errorf("event export ran %v times, want 3 (only for the shaped watcher)", got)
	}
	if got := metric(t, c, "host_forward_envelopes_total"); got != 3 {
		t.Errorf("%v forward envelopes, want 3", got)
	}
}

// conformance: D03
func TestD03_FollowHookIsAccessControlNotRunDuringDelivery(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	dcall(t, c, "chat/secret", "set_key", `{"key":"k1"}`)
	ws := dial(t, c, "chat/secret")
	send(t, ws, map[string]string{"type": "follow", "topic": "messages", "params": "wrong"})
	e := readUntil(t, ws, "error")
	if !strings.Contains(fmt.Sprint(e["error"]), "this room needs its key") {
		t.Fatalf("refusal %v", e)
	}
	if len(edges(t, c, "chat/secret")) != 0 {
		t.Fatal("a refused follow left an edge")
	}
	w := follow(t, c, "chat/secret", "chat/secret", "messages", "k1")
	if len(edges(t, c, "chat/secret")) != 1 {
		t.Fatal("an approved follow made no edge")
	}
	dcall(t, c, "chat/secret", "post", `{"text":"in"}`)
	waitUntil(t, "delivery", 10*time.Second, func() bool { return len(w.got()) == 1 })

	// The hook runs once per follow, never per delivery.
	_, err := c.Call(context.Background(), "hostile/f1", "follow", []byte(`{"publisher":"hostile/pub","topic":"t","params":"deny"}`))
	if ae, ok := err.(*hclient.APIError); !ok || ae.Status != http.StatusForbidden || !strings.Contains(ae.Message, "denied on purpose") {
		t.Fatalf("denied follow: %v", err)
	}
	dcall(t, c, "hostile/f2", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	hooks := metric(t, c, "host_follow_hooks_total")
	for i := 0; i < 20; i++ {
		dcall(t, c, "hostile/pub", "publish", fmt.Sprintf(`"%d"`, i))
	}
	waitUntil(t, "20 received", 10*time.Second, func() bool {
		return dcall(t, c, "hostile/f2", "received", "") != "null" && strings.Count(dcall(t, c, "hostile/f2", "received", ""), "hostile/pub") == 20
	})
	// The denied run rolled back its own write; the approved one counts.
	if got := dcall(t, c, "hostile/pub", "hook_runs", ""); got != "1" {
		t.Fatalf("hook recorded %s approved runs, want 1", got)
	}
	if after := metric(t, c, "host_follow_hooks_total"); after != hooks {
		t.Fatalf("follow hooks went from %v to %v during delivery", hooks, after)
	}
}

// conformance: D01 D04
func TestD04_NoReplayAndFailedMethodPublishesNothing(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	for i := 0; i < 5; i++ {
		dcall(t, c, "hostile/pub", "publish", `"old"`)
	}
	w := follow(t, c, "chat/w", "hostile/pub", "t", "")
	if _, err := c.Call(context.Background(), "hostile/pub", "publish_then_fail", nil); err == nil {
		t.Fatal("publish_then_fail should fail")
	}
	dcall(t, c, "hostile/pub", "publish", `"new"`)
	waitUntil(t, "one event", 10*time.Second, func() bool { return len(w.got()) >= 1 })
	time.Sleep(50 * time.Millisecond) // let anything wrongly queued arrive
	got := w.got()
	if len(got) != 1 || !strings.Contains(got[0], `"seq":6`) || !strings.Contains(got[0], `"new"`) {
		t.Fatalf("watcher got %q: want only the new event, seq 6 (the failed method took no seq)", got)
	}
}

// conformance: D02 D13
func TestD13_SocketGonePrunesItsEdges(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	w1 := follow(t, c, "chat/room1", "chat/room1", "messages", "")
	follow(t, c, "chat/room1", "chat/room1", "other", "")
	dcall(t, c, "tally/t1", "follow", `{"publisher":"chat/room1"}`)
	es := edges(t, c, "chat/room1")
	if len(es) != 3 {
		t.Fatalf("edges %v", es)
	}
	for _, e := range es {
		if e["node"] != n.ID() {
			t.Fatalf("edge does not record the follower's node: %v", e)
		}
	}
	w1.ws.Close(websocket.StatusNormalClosure, "bye")
	waitUntil(t, "the closed socket's edge pruned", 10*time.Second, func() bool { return len(edges(t, c, "chat/room1")) == 2 })
	if metric(t, c, `host_edges_pruned_total{reason="socket_gone"}`) < 1 {
		t.Error("prune not counted")
	}
	dcall(t, c, "chat/room1", "post", `{"text":"still works"}`)
	waitUntil(t, "tally counts", 10*time.Second, func() bool { return strings.Contains(dcall(t, c, "tally/t1", "counts", ""), `"total":1`) })
}

// The slow-socket tests fill a socket that is never read: its kernel
// buffers (a few MB on loopback) and then its inbox, 8 items here instead
// of the default 256 so that 60 events of 200 KB (12 MB) do it.
const (
	slowEvents = 60
	slowEvent  = `{"topic":"t","size":200000}`
)

func smallInbox(c *host.Config) { c.Delivery.Inbox = 8 }

// conformance: D12
func TestD12_SlowSocketFallsBehindAndStaysOpen(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms, Configure: smallInbox})
	ws := dial(t, c, "chat/slow")
	send(t, ws, map[string]string{"type": "follow", "object": "hostile/pub", "topic": "t"})
	send(t, ws, map[string]string{"type": "follow", "object": "hostile/pub", "topic": "u"})
	readUntil(t, ws, "followed")
	readUntil(t, ws, "followed")
	fast := follow(t, c, "chat/fast", "hostile/pub", "t", "")
	// The slow client reads nothing: the socket buffers fill, then its
	// inbox, then the delivery is refused.
	const events = slowEvents
	for i := 0; i < events; i++ {
		dcall(t, c, "hostile/pub", "publish", slowEvent)
	}
	waitUntil(t, "the slow connection's edges pruned", 20*time.Second, func() bool { return len(edges(t, c, "hostile/pub")) == 1 })
	waitUntil(t, "the fast watcher gets everything", 20*time.Second, func() bool { return len(fast.seqs(t)) == events })
	// The socket stays open: the client reads its backlog, learns it fell
	// behind, and can still talk.
	behind := readUntil(t, ws, "behind")
	if !strings.Contains(fmt.Sprint(behind["error"]), "inbox full") {
		t.Fatalf("behind frame %v", behind)
	}
	send(t, ws, map[string]string{"type": "ping"})
	readUntil(t, ws, "pong")
	if metric(t, c, `host_edges_pruned_total{reason="connection"}`) != 2 {
		t.Error("both edges of the refused connection should be pruned")
	}
}

// conformance: D15 D16
func TestD15_ObjectFollowerExactlyOnceEffect(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	dcall(t, c, "tally/t1", "follow", `{"publisher":"chat/room1"}`)
	dcall(t, c, "tally/t2", "follow", `{"publisher":"chat/room1","filter":"author=ann"}`)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				author := []string{"ann", "bob"}[i%2]
				if _, err := c.Call(context.Background(), "chat/room1", "post", []byte(fmt.Sprintf(`{"author":%q,"text":"m%d"}`, author, i))); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	waitUntil(t, "200 counted", 20*time.Second, func() bool {
		return dcall(t, c, "tally/t1", "counts", "") == `{"authors":{"ann":100,"bob":100},"duplicates":0,"total":200}`
	})
	waitUntil(t, "ann's 100 counted", 20*time.Second, func() bool {
		return dcall(t, c, "tally/t2", "counts", "") == `{"authors":{"ann":100},"duplicates":0,"total":100}`
	})
}

// conformance: D05 D18 D19
func TestD18_FailingFollowerBacksOffThenIsDropped(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms, Configure: func(cfg *host.Config) {
		cfg.Delivery.RetryBase = 20 * time.Millisecond
		cfg.Delivery.MaxAttempts = 3
		cfg.VM.Budget = time.Second
	}})
	dcall(t, c, "hostile/f", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	dcall(t, c, "hostile/g", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	// A handler past its budget is a failed attempt. The publisher's call
	// returns at once: delivery runs after, between its calls.
	start := time.Now()
	dcall(t, c, "hostile/pub", "publish", `"loop"`)
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("publish took %v: delivery ran inside the method", d)
	}
	// While the followers spin, the publisher still answers.
	dcall(t, c, "hostile/pub", "hook_runs", "")
	waitUntil(t, "both edges dropped", 30*time.Second, func() bool { return len(edges(t, c, "hostile/pub")) == 0 })
	if got := metric(t, c, "host_edges_dropped_total"); got != 2 {
		t.Errorf("dropped %v edges, want 2", got)
	}
	if got := metric(t, c, "host_delivery_retries_total"); got != 4 {
		t.Errorf("%v retries, want 4 (2 per edge before the 3rd failure)", got)
	}
	// An error return is a failure too.
	dcall(t, c, "hostile/h", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	dcall(t, c, "hostile/pub", "publish", `"fail"`)
	waitUntil(t, "edge dropped", 30*time.Second, func() bool { return len(edges(t, c, "hostile/pub")) == 0 })
	if got := dcall(t, c, "hostile/h", "received", ""); got != "null" {
		t.Fatalf("failed handler left effects: %s", got)
	}
}

// conformance: D09 D22 D24
func TestD24_OrderWithSmallAndLargeEventsAndManyFollowers(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	var ws []*watcher
	for i := 0; i < 3; i++ {
		ws = append(ws, follow(t, c, "chat/w", "hostile/pub", "t", ""))
	}
	for i := 0; i < 4; i++ {
		dcall(t, c, fmt.Sprintf("hostile/f%d", i), "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	}
	const events = 60
	for i := 1; i <= events; i++ {
		body := fmt.Sprintf(`{"topic":"t","payload":%d}`, i)
		if i%7 == 0 {
			body = `{"topic":"t","size":40000}`
		}
		dcall(t, c, "hostile/pub", "publish", body)
	}
	for i, w := range ws {
		waitUntil(t, "watcher gets all", 20*time.Second, func() bool { return len(w.seqs(t)) == events })
		for k, s := range w.seqs(t) {
			if s != uint64(k+1) {
				t.Fatalf("watcher %d: event %d has seq %d", i, k, s)
			}
		}
	}
	for i := 0; i < 4; i++ {
		f := fmt.Sprintf("hostile/f%d", i)
		var got []string
		waitUntil(t, "follower gets all", 20*time.Second, func() bool {
			got = nil
			json.Unmarshal([]byte(dcall(t, c, f, "received", "")), &got)
			return len(got) == events
		})
		for k, line := range got {
			fields := strings.Fields(line)
			if fields[2] != strconv.Itoa(k+1) {
				t.Fatalf("%s: event %d is %q", f, k, line)
			}
		}
	}
	if metric(t, c, "host_ranges_materialized_total") == 0 {
		t.Error("large events should travel as ranges and be materialized")
	}
}

// conformance: D10 D12 D14
func TestD10_NodeConnectionInboxHolds256ThenRefuses(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	ws := dial(t, c, "chat/held")
	conn := fmt.Sprint(readUntil(t, ws, "hello")["connection"])
	for _, topic := range []string{"t", "storm"} {
		send(t, ws, map[string]string{"type": "follow", "object": "hostile/pub", "topic": topic})
		readUntil(t, ws, "followed")
	}
	// The connection's writer is held: once it has taken the first event
	// it is stuck writing it, and nothing leaves the inbox until release.
	release, err := host.HoldConnWriter(n, conn)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(release) })
	dcall(t, c, "hostile/pub", "publish", `"first"`)
	waitUntil(t, "the writer holding the first event", 10*time.Second, func() bool {
		es := edges(t, c, "hostile/pub")
		return len(es) == 2 && es[0]["cursor"] == float64(1) && host.ConnQueued(n, conn) == 0
	})
	// 300 events in one call, one pump round: 256 land, the 257th is
	// refused, and the publisher prunes both of the connection's edges.
	dcall(t, c, "hostile/pub", "publish_storm", `{"size":1,"total":300}`)
	waitUntil(t, "the storm delivered", 20*time.Second, func() bool {
		es := edges(t, c, "hostile/pub")
		return len(es) == 0 || es[0]["cursor"] == float64(301)
	})
	if es := edges(t, c, "hostile/pub"); len(es) != 0 {
		t.Fatalf("edges %v after 300 events to a held connection: the inbox must refuse the 257th and the publisher prune the connection's edges", es)
	}
	if q := host.ConnQueued(n, conn); q != 256 {
		t.Fatalf("the node's connection inbox holds %d items, want 256", q)
	}
	if got := metric(t, c, `host_edges_pruned_total{reason="connection"}`); got != 2 {
		t.Errorf("%v edges pruned for the full inbox, want both of the connection's", got)
	}
	once.Do(release)

	// The socket stayed open: the client reads its backlog, exactly the
	// 256 events that landed (seqs 2..257, in order), and one notice.
	var storm []uint64
	first, behind := 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for first == 0 || behind == 0 || len(storm) < 256 {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("reading the backlog (first %d, behind %d, storm %d): %v", first, behind, len(storm), err)
		}
		var m struct {
			Type, Topic, Error string
			Seq                uint64
		}
		if len(b) == 0 || json.Unmarshal(b, &m) != nil {
			continue
		}
		switch {
		case m.Type == "behind":
			if !strings.Contains(m.Error, "inbox full (256 events)") {
				t.Fatalf("behind notice %s", b)
			}
			behind++
		case m.Type == "event" && m.Topic == "t":
			first++
		case m.Type == "event" && m.Topic == "storm":
			storm = append(storm, m.Seq)
		}
	}
	// Whatever is still queued comes before the pong of a ping sent now.
	waitUntil(t, "the inbox drained", 10*time.Second, func() bool { return host.ConnQueued(n, conn) == 0 })
	send(t, ws, map[string]string{"type": "ping"})
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m struct{ Type, Topic string }
		json.Unmarshal(b, &m)
		if m.Type == "pong" {
			break
		}
		if m.Type == "behind" {
			behind++
		}
		if m.Type == "event" {
			t.Fatalf("an event past the inbox's 256: %s", b)
		}
	}
	for i, s := range storm {
		if s != uint64(i+2) {
			t.Fatalf("storm event %d has seq %d: want 2..257 in order", i, s)
		}
	}
	if first != 1 || behind != 1 {
		t.Fatalf("%d first events and %d behind notices, want one each", first, behind)
	}
	// Following again resumes at the head.
	send(t, ws, map[string]string{"type": "follow", "object": "hostile/pub", "topic": "t"})
	readUntil(t, ws, "followed")
	dcall(t, c, "hostile/pub", "publish", `"again"`)
	if e := readUntil(t, ws, "event"); e["seq"] != float64(302) {
		t.Fatalf("after following again: %v", e)
	}
}

// redeliver sends an object delivery to node n over its inter-node
// transport, as a publisher's pump does, and returns the follower's report.
func redeliver(t *testing.T, n *host.Node, d *delivery.ObjectDelivery) delivery.ObjectResult {
	t.Helper()
	if d.Through == 0 && len(d.Events) > 0 {
		d.Through = d.Events[len(d.Events)-1].Seq
	}
	m := nats.NewMsg("host.node." + n.ID() + ".deliver")
	m.Data = delivery.AppendObjectDelivery(nil, d)
	reply, err := n.NATSConn().RequestMsg(m, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s := reply.Header.Get("Status"); s != "200" {
		t.Fatalf("delivery answered %s: %s", s, reply.Header.Get("Error"))
	}
	var res delivery.ObjectResult
	if err := json.Unmarshal(reply.Data, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func ev(seq uint64, payload string) abi.Event {
	return abi.Event{Seq: seq, Topic: "t", Payload: []byte(payload), Time: time.Now().UnixNano()}
}

// receivedLines lists what hostile follower f's receive handler committed.
func receivedLines(t *testing.T, c *hclient.Client, f string) []string {
	t.Helper()
	var got []string
	json.Unmarshal([]byte(dcall(t, c, f, "received", "")), &got)
	return got
}

// The same event delivered twice to a follower through the node's receive
// path: the handler's effect is there once. The cursor is checked before
// the handler runs (a redelivery whose handler would now fail is skipped,
// not run) and advances only with the handler's own transaction (a failed
// handler leaves the cursor, so its event runs again).
//
// conformance: D15 D16 D17
func TestD17_RedeliverySkipsWhatTheHandlerCommitted(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	const pub, f = "hostile/pub", "hostile/r"
	want := func(res delivery.ObjectResult, done uint64, failed bool) {
		t.Helper()
		if (res.Err != "") != failed || !failed && res.Done != done {
			t.Fatalf("delivery result %+v, want done %d, failed %v", res, done, failed)
		}
	}
	check := func(want ...string) {
		t.Helper()
		got := receivedLines(t, c, f)
		if !slices.Equal(got, want) {
			t.Fatalf("follower committed %q, want %q", got, want)
		}
	}
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(1, `"one"`)}}), 1, false)
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(1, `"one"`)}}), 1, false)
	check(pub + ` t 1 "one"`)
	// Seq 1 is committed: its handler must not run again, so a payload
	// that would make it fail is never seen.
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(1, `"fail"`)}}), 1, false)
	// A failed handler commits nothing, its cursor included: the event
	// runs again on redelivery.
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(2, `"fail"`)}}), 0, true)
	check(pub + ` t 1 "one"`)
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(2, `"two"`)}}), 2, false)
	check(pub+` t 1 "one"`, pub+` t 2 "two"`)
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "t", Events: []abi.Event{ev(1, `"one"`), ev(2, `"fail"`), ev(3, `"three"`)}}), 3, false)
	check(pub+` t 1 "one"`, pub+` t 2 "two"`, pub+` t 3 "three"`)
	// The cursor is per (publisher, topic): seq 1 of another topic or of
	// another publisher is another event.
	other := ev(1, `"other topic"`)
	other.Topic = "u"
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: f, Topic: "u", Events: []abi.Event{other}}), 1, false)
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: "hostile/pub2", Follower: f, Topic: "t", Events: []abi.Event{ev(1, `"other publisher"`)}}), 1, false)
	check(pub+` t 1 "one"`, pub+` t 2 "two"`, pub+` t 3 "three"`, pub+` u 1 "other topic"`, `hostile/pub2 t 1 "other publisher"`)

	// The cursor and the handler's effect commit together: a reader of the
	// follower's file never sees one without the other.
	const g = "hostile/s"
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: g, Topic: "t", Events: []abi.Event{ev(1, `"1"`)}}), 1, false)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(n.DataDir(), "objects", "hostile", "s.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	var snapshots, torn int
	var reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var cursor, effects int
			err := db.QueryRow(`SELECT COALESCE((SELECT seq FROM cursors WHERE publisher = 'hostile/pub' AND topic = 't'), 0),
				(SELECT count(*) FROM state WHERE key >= CAST('got/' AS BLOB) AND key < CAST('got0' AS BLOB))`).Scan(&cursor, &effects)
			if err != nil {
				continue
			}
			snapshots++
			if cursor != effects {
				torn++
			}
		}
	}()
	for seq := uint64(2); seq <= 150; seq++ {
		want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: g, Topic: "t", Events: []abi.Event{ev(seq, fmt.Sprintf(`"%d"`, seq))}}), seq, false)
	}
	close(stop)
	reader.Wait()
	if torn > 0 {
		t.Fatalf("%d of %d snapshots of the follower's file show the cursor and the handler's effects apart", torn, snapshots)
	}
	t.Logf("%d snapshots, none torn", snapshots)

	// Through the real pump: the edge delivers seq 1, then the same
	// delivery arrives again (its outcome lost on the way back).
	dcall(t, c, "hostile/g", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	dcall(t, c, pub, "publish", `"real"`)
	waitUntil(t, "the pump's delivery", 10*time.Second, func() bool { return len(receivedLines(t, c, "hostile/g")) == 1 })
	want(redeliver(t, n, &delivery.ObjectDelivery{Publisher: pub, Follower: "hostile/g", Topic: "t", Events: []abi.Event{ev(1, `"fail"`)}}), 1, false)
	if got := receivedLines(t, c, "hostile/g"); len(got) != 1 || got[0] != pub+` t 1 "real"` {
		t.Fatalf("after a redelivery of what the pump delivered: %q", got)
	}
}

// Local edges deliver directly: a socket and an object follower on the
// publisher's own node get their events with no inter-node call.
//
// conformance: D06
func TestD06_LocalEdgesDeliverDirectly(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	w := follow(t, c, "chat/w", "chat/room1", "messages", "")
	dcall(t, c, "tally/t1", "follow", `{"publisher":"chat/room1"}`)
	for i := 0; i < 3; i++ {
		dcall(t, c, "chat/room1", "post", fmt.Sprintf(`{"author":"ann","text":"m%d"}`, i))
	}
	waitUntil(t, "the socket's events", 10*time.Second, func() bool { return len(w.seqs(t)) == 3 })
	waitUntil(t, "the tally's events", 10*time.Second, func() bool {
		return dcall(t, c, "tally/t1", "counts", "") == `{"authors":{"ann":3},"duplicates":0,"total":3}`
	})
	for _, kind := range []string{"conns", "deliver"} {
		if got := metric(t, c, `host_internode_calls_total{kind="`+kind+`"}`); got != 0 {
			t.Errorf("%v inter-node %s calls for followers on the publisher's node, want none", got, kind)
		}
	}
	if metric(t, c, `host_delivery_calls_total{kind="connection_batch",path="local"}`) == 0 || metric(t, c, `host_delivery_calls_total{kind="object",path="local"}`) == 0 {
		t.Error("local deliveries not counted as local")
	}
}

// The node's defaults are the seeds' numbers: a handler budget of 10 s,
// durable retries from 500 ms doubling to a last wait of 32 s before the
// 8th failure drops the edge, a 256-item inbox, 32 KB inline, and a 10 s
// stream idle threshold.
//
// conformance: D10 D18 D19 D22 S05
func TestD18_D19_NodeDefaultsAreTheSeeds(t *testing.T) {
	cfg := host.DefaultConfig()
	d := cfg.Delivery
	if cfg.VM.Budget != 10*time.Second {
		t.Errorf("handler budget %v, want 10s", cfg.VM.Budget)
	}
	if d.RetryBase != 500*time.Millisecond || d.MaxAttempts != 8 {
		t.Errorf("retry base %v, attempts %d: want 500ms, 8", d.RetryBase, d.MaxAttempts)
	}
	var waits []time.Duration
	for a := 1; a < d.MaxAttempts; a++ {
		waits = append(waits, d.Backoff(a))
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second}
	if !slices.Equal(waits, want) {
		t.Errorf("waits after failures 1..7: %v, want %v", waits, want)
	}
	if d.Inbox != 256 || d.InlineLimit != 32<<10 {
		t.Errorf("inbox %d, inline limit %d: want 256, 32 KB", d.Inbox, d.InlineLimit)
	}
	if cfg.Streams.Idle != 10*time.Second {
		t.Errorf("stream idle threshold %v, want 10s", cfg.Streams.Idle)
	}
}

// A ranged delivery carries the edge's filter and the receiver applies it
// as it materializes the range from its copy of the publisher's log: only
// matching events reach the handler.
//
// conformance: D22
func TestD22_RangedDeliveryAppliesTheEdgesFilter(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	for _, k := range []int{2, 1, 3, 1} {
		dcall(t, c, "hostile/pub", "publish", fmt.Sprintf(`{"topic":"t","payload":{"k":%d}}`, k))
	}
	res := redeliver(t, n, &delivery.ObjectDelivery{Publisher: "hostile/pub", Follower: "hostile/rf", Topic: "t", Filter: "k=1",
		Range: &delivery.Range{After: 0, Through: 4}, Through: 4})
	if res.Err != "" || res.Done != 4 {
		t.Fatalf("ranged delivery: %+v", res)
	}
	got := receivedLines(t, c, "hostile/rf")
	if want := []string{`hostile/pub t 2 {"k":1}`, `hostile/pub t 4 {"k":1}`}; !slices.Equal(got, want) {
		t.Fatalf("follower handled %q, want only the matching events %q", got, want)
	}
	if metric(t, c, "host_ranges_materialized_total") != 1 {
		t.Error("the range was not materialized")
	}
}

// TestSocketGetsABatchSentAgainOnce: connection edges are at most once. A
// batch that reaches a socket again (its connection progress failed to
// commit after it was sent, or a new home resends what the old one had not
// recorded; the chaos soak saw the first) is dropped by the socket's
// writer: the client gets each event once, and the next event after.
//
// conformance: D07
func TestSocketGetsABatchSentAgainOnce(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: deliveryPrograms})
	w := follow(t, c, "chat/lobby", "chat/room1", "messages", "")
	dcall(t, c, "chat/room1", "post", `{"author":"ann","text":"one"}`)
	waitUntil(t, "the first event", 10*time.Second, func() bool { return len(w.seqs(t)) == 1 })
	first := w.seqs(t)[0]
	// The same event, and an older one, sent again.
	host.OfferToEveryConnection(n, abi.Event{Publisher: "chat/room1", Topic: "messages", Seq: first}, []byte(`{"type":"event","again":true}`))
	host.OfferToEveryConnection(n, abi.Event{Publisher: "chat/room1", Topic: "messages", Seq: first - 1}, []byte(`{"type":"event","again":true}`))
	dcall(t, c, "chat/room1", "post", `{"author":"ann","text":"two"}`)
	waitUntil(t, "the second event", 10*time.Second, func() bool { return len(w.seqs(t)) >= 2 })
	for _, f := range w.got() {
		if strings.Contains(f, `"again"`) {
			t.Fatalf("a batch sent again reached the socket: %s (all frames: %q)", f, w.got())
		}
	}
	if got := w.seqs(t); len(got) != 2 || got[1] <= got[0] {
		t.Fatalf("seqs %v, want two ascending", got)
	}
}
