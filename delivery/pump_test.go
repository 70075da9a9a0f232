package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/delivery/deliverytest"
	"github.com/durable-host/host/store"
)

// pub is a publisher over a real object file. Its lanes run on goroutines
// it counts, so a test can wait for them.
type pub struct {
	id string
	f  *store.File
	mu sync.Mutex

	lanes   sync.WaitGroup
	started atomic.Int32 // lanes started since the last look
	ctx     context.Context
	stop    context.CancelFunc
	wmu     sync.Mutex
	wakes   []time.Time
	sets    delivery.ConnSets
}

func (p *pub) ConnSets() *delivery.ConnSets { return &p.sets }

func (p *pub) ID() string { return p.id }

func (p *pub) Go(f func(context.Context)) bool {
	if p.ctx.Err() != nil {
		return false
	}
	p.started.Add(1)
	p.lanes.Add(1)
	go func() {
		defer p.lanes.Done()
		f(p.ctx)
	}()
	return true
}

func (p *pub) Wake(t time.Time) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.wakes = append(p.wakes, t)
}

func (p *pub) Between(_ context.Context, fn func(*store.Tx) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	tx, err := p.f.Begin()
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func newPub(t testing.TB) *pub {
	t.Helper()
	f, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "pub.db"), store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	p := &pub{id: "chat/room1", f: f}
	p.ctx, p.stop = context.WithCancel(context.Background())
	t.Cleanup(func() {
		p.stop()
		p.lanes.Wait()
		f.Close()
	})
	return p
}

func (p *pub) publish(t testing.TB, topic string, payloads ...string) {
	t.Helper()
	err := p.Between(context.Background(), func(tx *store.Tx) error {
		for _, pl := range payloads {
			if _, err := tx.Append(topic, []byte(pl), time.Now()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (p *pub) follow(t testing.TB, kind abi.FollowerKind, follower, node, topic, filter string) store.Edge {
	t.Helper()
	var e store.Edge
	err := p.Between(context.Background(), func(tx *store.Tx) error {
		var err error
		e, err = tx.AddEdge(kind, follower, node, topic, filter, time.Now())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (p *pub) edges(t *testing.T) []store.Edge {
	t.Helper()
	var out []store.Edge
	p.Between(context.Background(), func(tx *store.Tx) error {
		var err error
		out, err = tx.Edges()
		return err
	})
	return out
}

// inbox is a bounded test inbox.
type inbox struct {
	cap   int
	items []*delivery.Item
}

func (in *inbox) Offer(it *delivery.Item) bool {
	if len(in.items) >= in.cap {
		return false
	}
	in.items = append(in.items, it)
	return true
}

// fakeNet is a Transport and Membership: nodes hold inboxes and object
// followers; it records every call.
type fakeNet struct {
	mu       sync.Mutex
	self     string
	live     map[string]bool
	located  map[string]string
	inboxes  map[string]map[string]*inbox // node → conn → inbox
	received map[string][]abi.Event       // follower → events handled
	fail     map[string]int               // follower → failures left
	connCall map[string]int               // node → connection batches
	objCall  map[string]int               // follower → deliveries
	batches  []*delivery.ConnBatch
	// batchNode is the node each of batches went to.
	batchNode []string
	objects   []*delivery.ObjectDelivery
	ranges    func(*delivery.ObjectDelivery) []abi.Event
	gates     map[string]*gate                // follower → its deliveries wait here
	home      map[string]string               // follower → the only node that takes its deliveries
	copies    map[string]*delivery.EdgeCopies // node → its copies of edge sets
	// lost: node → connection batches it slices whose reply is lost;
	// dropped: node → batches lost on the way there.
	lost, dropped map[string]int
	// old: nodes of the version before edge sets were versioned.
	old     map[string]bool
	results []delivery.ConnResult // every connection batch's reply
}

// gate holds a follower's deliveries until open is closed; each delivery
// that arrives is offered on entered.
type gate struct {
	open    chan struct{}
	entered chan *delivery.ObjectDelivery
}

func (n *fakeNet) slow(follower string) *gate {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := &gate{open: make(chan struct{}), entered: make(chan *delivery.ObjectDelivery, 100)}
	if n.gates == nil {
		n.gates = map[string]*gate{}
	}
	n.gates[follower] = g
	return g
}

func newNet() *fakeNet {
	return &fakeNet{
		self: "A", live: map[string]bool{"A": true}, located: map[string]string{},
		inboxes: map[string]map[string]*inbox{}, received: map[string][]abi.Event{},
		fail: map[string]int{}, connCall: map[string]int{}, objCall: map[string]int{},
		copies: map[string]*delivery.EdgeCopies{}, lost: map[string]int{}, dropped: map[string]int{}, old: map[string]bool{},
	}
}

func (n *fakeNet) Self() string        { return n.self }
func (n *fakeNet) Live(id string) bool { n.mu.Lock(); defer n.mu.Unlock(); return n.live[id] }
func (n *fakeNet) Locate(_ context.Context, obj string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if node, ok := n.located[obj]; ok {
		return node, nil
	}
	return "", fmt.Errorf("nowhere")
}

func (n *fakeNet) conn(node, id string, capacity int) *inbox {
	n.live[node] = true
	if n.inboxes[node] == nil {
		n.inboxes[node] = map[string]*inbox{}
	}
	in := &inbox{cap: capacity}
	n.inboxes[node][id] = in
	return in
}

func (n *fakeNet) Connections(_ context.Context, node string, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.connCall[node]++
	// A copy: the pump fills the same batch again for a node that
	// answered Unknown.
	cp := *b
	n.batches, n.batchNode = append(n.batches, &cp), append(n.batchNode, node)
	if n.dropped[node] > 0 {
		n.dropped[node]--
		return delivery.ConnResult{}, errors.New("batch lost")
	}
	if n.old[node] {
		return n.oldNode(node, b)
	}
	if n.copies[node] == nil {
		n.copies[node] = delivery.NewEdgeCopies(delivery.DefaultEdgeCopies, delivery.DefaultEdgeCopyIdle, delivery.RealClock)
	}
	res := n.copies[node].Slice(b, func(c string) (delivery.Inbox, bool) {
		in, ok := n.inboxes[node][c]
		return in, ok
	})
	n.results = append(n.results, res)
	if n.lost[node] > 0 {
		n.lost[node]--
		return delivery.ConnResult{}, errors.New("reply lost")
	}
	return res, nil
}

func (n *fakeNet) Object(ctx context.Context, node string, d *delivery.ObjectDelivery) (delivery.ObjectResult, error) {
	n.mu.Lock()
	gate := n.gates[d.Follower]
	n.mu.Unlock()
	if gate != nil {
		// A slow follower: the delivery waits until the test opens the
		// gate (or the pump stops).
		select {
		case gate.entered <- d:
		default:
		}
		select {
		case <-gate.open:
		case <-ctx.Done():
			return delivery.ObjectResult{}, ctx.Err()
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.objCall[d.Follower]++
	n.objects = append(n.objects, d)
	if h, ok := n.home[d.Follower]; ok && h != node {
		return delivery.ObjectResult{}, fmt.Errorf("%w: node %s: not this object's home", delivery.ErrUnplaced, node)
	}
	evs := d.Events
	if d.Range != nil {
		evs = n.ranges(d)
	}
	res := delivery.ObjectResult{}
	for _, e := range evs {
		if n.fail[d.Follower] > 0 {
			n.fail[d.Follower]--
			res.Err = "handler failed"
			return res, nil
		}
		n.received[d.Follower] = append(n.received[d.Follower], e)
		res.Done = e.Seq
	}
	res.Done = d.Through
	return res, nil
}

type nopObs struct{ pruned, dropped, retried int }

func (o *nopObs) ConnBatchSent(string, bool, *delivery.ConnBatch) {}
func (o *nopObs) ObjectDeliverySent(string, bool, int, bool)      {}
func (o *nopObs) Pruned(_ string, n int)                          { o.pruned += n }
func (o *nopObs) Retried()                                        { o.retried++ }
func (o *nopObs) Dropped(string, store.Edge, string)              { o.dropped++ }
func newPump(net *fakeNet, clock delivery.Clock) (*delivery.Pump, *nopObs) {
	cfg := delivery.DefaultConfig()
	if clock != nil {
		cfg.Clock = clock
	}
	obs := &nopObs{}
	return delivery.NewPump(cfg, net, net, obs, slog.Default()), obs
}

// drain runs rounds, and waits for the lanes they start, until nothing is
// due; it returns when something is due next.
func drain(t *testing.T, p *delivery.Pump, pb *pub) time.Time {
	t.Helper()
	for i := 0; i < 100; i++ {
		more, next, err := p.Round(context.Background(), pb)
		if err != nil {
			t.Fatal(err)
		}
		started := pb.started.Swap(0)
		pb.lanes.Wait()
		if !more && started == 0 {
			return next
		}
	}
	t.Fatal("pump did not settle")
	return time.Time{}
}

func seqs(items []*delivery.Item) []uint64 {
	var out []uint64
	for _, it := range items {
		out = append(out, it.Event.Seq)
	}
	return out
}

// conformance: D05 D06 D07 D08 D23
func TestD08_ConnectionBatchOneCallPerNode(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	var inboxes []*inbox
	// 40 watchers over 4 nodes, one of them local.
	for i := 0; i < 40; i++ {
		node := []string{"A", "B", "C", "D"}[i%4]
		id := fmt.Sprintf("%s.%d", node, i)
		inboxes = append(inboxes, net.conn(node, id, delivery.DefaultInbox))
		pb.follow(t, abi.FollowerConnection, id, node, "messages", "")
	}
	big := `"` + strings.Repeat("x", 40<<10) + `"`
	pb.publish(t, "messages", `"one"`, big, `"three"`)
	drain(t, p, pb)
	for _, node := range []string{"A", "B", "C", "D"} {
		if net.connCall[node] != 1 {
			t.Errorf("node %s got %d connection batches, want 1", node, net.connCall[node])
		}
	}
	for _, b := range net.batches {
		if len(b.Events) != 3 || len(b.Edges) != 10 {
			t.Fatalf("batch carries %d events beside %d edges, want the 3 events once beside 10 edges", len(b.Events), len(b.Edges))
		}
		// D23: no range form, even past 32 KB.
		if len(b.Events[1].Payload) != len(big) {
			t.Fatal("large event not inline in a connection batch")
		}
	}
	for i, in := range inboxes {
		if got := seqs(in.items); !slices.Equal(got, []uint64{1, 2, 3}) {
			t.Fatalf("watcher %d got %v", i, got)
		}
	}
	// One copy per node: every inbox on a node shares the item.
	if inboxes[0].items[0] != inboxes[4].items[0] {
		t.Error("inboxes on one node should share one item per event")
	}
}

// conformance: D07
func TestD07_ReceivingNodeSlicesByTopicCursorFilter(t *testing.T) {
	evs := []abi.Event{
		{Publisher: "p/1", Topic: "a", Seq: 1, Payload: []byte(`{"u":"ann"}`)},
		{Publisher: "p/1", Topic: "b", Seq: 2, Payload: []byte(`{"u":"bob"}`)},
		{Publisher: "p/1", Topic: "a", Seq: 3, Payload: []byte(`{"u":"bob"}`)},
		{Publisher: "p/1", Topic: "a", Seq: 4, Payload: []byte(`{"u":"ann","n":2}`)},
		{Publisher: "p/1", Topic: "b", Seq: 5, Payload: []byte(`"text"`)},
	}
	inb := map[string]*inbox{}
	for _, c := range []string{"all-a", "late-a", "ann-a", "b", "every", "n2"} {
		inb[c] = &inbox{cap: 10}
	}
	b := &delivery.ConnBatch{Publisher: "p/1", Events: evs, Edges: []delivery.ConnEdge{
		{Edge: 1, Conn: "all-a", Topic: "a"},
		{Edge: 2, Conn: "late-a", Topic: "a", Cursor: 3},
		{Edge: 3, Conn: "ann-a", Topic: "a", Filter: "u=ann"},
		{Edge: 4, Conn: "b", Topic: "b"},
		{Edge: 5, Conn: "every", Topic: ""},
		{Edge: 6, Conn: "n2", Topic: "a", Filter: "u=ann&n=2"},
		{Edge: 7, Conn: "missing", Topic: "a"},
	}}
	res := delivery.Slice(b, func(c string) (delivery.Inbox, bool) {
		in, ok := inb[c]
		return in, ok
	})
	want := map[string][]uint64{
		"all-a": {1, 3, 4}, "late-a": {4}, "ann-a": {1, 4}, "b": {2, 5}, "every": {1, 2, 3, 4, 5}, "n2": {4},
	}
	for c, w := range want {
		if got := seqs(inb[c].items); !slices.Equal(got, w) {
			t.Errorf("%s got %v, want %v", c, got, w)
		}
	}
	if !slices.Equal(res.Gone, []string{"missing"}) || len(res.Refused) != 0 {
		t.Errorf("result %+v", res)
	}
}

// conformance: D12 D13 D14
func TestD12_InboxFullPrunesEveryEdgeOfThatConnection(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, nil)
	full := net.conn("A", "A.full", 2)
	ok := net.conn("A", "A.ok", 100)
	pb.follow(t, abi.FollowerConnection, "A.full", "A", "messages", "")
	pb.follow(t, abi.FollowerConnection, "A.full", "A", "other", "")
	pb.follow(t, abi.FollowerConnection, "A.ok", "A", "messages", "")
	pb.follow(t, abi.FollowerConnection, "A.gone", "A", "messages", "")
	pb.publish(t, "messages", `1`, `2`, `3`, `4`)
	drain(t, p, pb)
	if len(full.items) != 2 || len(ok.items) != 4 {
		t.Fatalf("full got %d, ok got %d", len(full.items), len(ok.items))
	}
	edges := pb.edges(t)
	if len(edges) != 1 || edges[0].Follower != "A.ok" {
		t.Fatalf("edges left %+v, want only A.ok's", edges)
	}
	if obs.pruned != 3 {
		t.Errorf("pruned %d edges, want 3 (both of A.full's, A.gone's)", obs.pruned)
	}
	// D14: the cursor advanced over everything sent, landed or not; a
	// miss is not retried.
	if edges[0].Cursor != 4 {
		t.Errorf("cursor %d, want 4", edges[0].Cursor)
	}
	calls := net.connCall["A"]
	drain(t, p, pb)
	if net.connCall["A"] != calls {
		t.Error("nothing is due after a round: no retry of connection batches")
	}
}

// conformance: D14
func TestD14_ConnectionCursorAdvancesOnMiss(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	net.live["B"] = true // node B exists but has no such socket yet: a miss
	net.conn("A", "A.1", 10)
	pb.follow(t, abi.FollowerConnection, "A.1", "A", "t", "")
	e := pb.follow(t, abi.FollowerConnection, "B.1", "B", "t", "u=zed")
	pb.publish(t, "t", `{"u":"ann"}`)
	drain(t, p, pb)
	for _, got := range pb.edges(t) {
		if got.ID == e.ID {
			t.Fatalf("edge of a connection its node reported gone should be pruned: %+v", got)
		}
		if got.Cursor != 1 {
			t.Fatalf("cursor %d, want 1", got.Cursor)
		}
	}
}

// conformance: D04
func TestD04_NewEdgeStartsAtHead(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	pb.publish(t, "t", `1`, `2`, `3`)
	in := net.conn("A", "A.1", 10)
	e := pb.follow(t, abi.FollowerConnection, "A.1", "A", "t", "")
	o := pb.follow(t, abi.FollowerObject, "tally/1", "A", "t", "")
	if e.Cursor != 3 || o.Cursor != 3 {
		t.Fatalf("new edges start at %d/%d, want the head 3", e.Cursor, o.Cursor)
	}
	drain(t, p, pb)
	if len(in.items) != 0 || len(net.received["tally/1"]) != 0 {
		t.Fatal("something was replayed down a new edge")
	}
	pb.publish(t, "t", `4`)
	drain(t, p, pb)
	if got := seqs(in.items); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("got %v", got)
	}
	if got := net.received["tally/1"]; len(got) != 1 || got[0].Seq != 4 {
		t.Fatalf("object got %v", got)
	}
}

// conformance: D09 D22
func TestD09_ObjectEdgesOneDeliveryEachInlineElseRange(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	var rangeReads int
	net.ranges = func(d *delivery.ObjectDelivery) []abi.Event {
		rangeReads++
		evs, err := store.Read(context.Background(), pb.f.Path(), d.RangeQuery())
		if err != nil {
			t.Error(err)
		}
		return evs
	}
	for i := 0; i < 50; i++ {
		pb.follow(t, abi.FollowerObject, fmt.Sprintf("tally/%d", i), "A", "t", "")
	}
	pb.follow(t, abi.FollowerObject, "filtered/1", "A", "t", "k=big")
	pb.publish(t, "t", `{"k":"small"}`)
	drain(t, p, pb)
	for i := 0; i < 50; i++ {
		f := fmt.Sprintf("tally/%d", i)
		if net.objCall[f] != 1 {
			t.Fatalf("%s got %d deliveries, want 1", f, net.objCall[f])
		}
	}
	if len(net.objects) != 50 {
		t.Fatalf("%d deliveries for 50 followers (the filtered one matches nothing)", len(net.objects))
	}
	for _, d := range net.objects {
		if d.Range != nil || len(d.Events) != 1 {
			t.Fatalf("small event should ride inline: %+v", d)
		}
	}
	// Past 32 KB in total: only the range and the filter travel.
	net.objects = nil
	big := `{"k":"big","pad":"` + strings.Repeat("y", 33<<10) + `"}`
	pb.publish(t, "t", big)
	drain(t, p, pb)
	for _, d := range net.objects {
		if d.Range == nil || len(d.Events) != 0 {
			t.Fatalf("over 32 KB should carry the range: %+v", d.Range)
		}
	}
	if rangeReads != 51 {
		t.Errorf("%d ranges materialized, want 51", rangeReads)
	}
	got := net.received["filtered/1"]
	if len(got) != 1 || string(got[0].Payload) != big {
		t.Fatalf("filtered follower got %d events", len(got))
	}
}

// conformance: D18 D19
func TestD18_RetryScheduleThenDrop(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, clock)
	pb.follow(t, abi.FollowerObject, "flaky/1", "A", "t", "")
	pb.publish(t, "t", `1`)
	net.fail["flaky/1"] = 1000
	start := clock.Now()
	var waits []time.Duration
	next := drain(t, p, pb)
	for !next.IsZero() {
		waits = append(waits, next.Sub(clock.Now()))
		clock.Advance(next.Sub(clock.Now()))
		next = drain(t, p, pb)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	if net.objCall["flaky/1"] != 8 {
		t.Fatalf("%d attempts, want 8", net.objCall["flaky/1"])
	}
	if len(pb.edges(t)) != 0 || obs.dropped != 1 {
		t.Fatalf("edge should be dropped after the 8th failure (dropped=%d)", obs.dropped)
	}
	if total := clock.Now().Sub(start); total != 63500*time.Millisecond {
		t.Errorf("dropped after %v, want 63.5s", total)
	}
}

// conformance: D18
func TestD18_SuccessResetsAttempts(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, clock)
	pb.follow(t, abi.FollowerObject, "flaky/1", "A", "t", "")
	pb.publish(t, "t", `1`, `2`)
	net.fail["flaky/1"] = 2
	for next := drain(t, p, pb); !next.IsZero(); next = drain(t, p, pb) {
		clock.Advance(next.Sub(clock.Now()))
	}
	e := pb.edges(t)[0]
	if e.Attempts != 0 || e.Cursor != 2 {
		t.Fatalf("edge %+v", e)
	}
	if got := net.received["flaky/1"]; len(got) != 2 || got[0].Seq != 1 || got[1].Seq != 2 {
		t.Fatalf("received %v", got)
	}
}

// conformance: D20 D21
func TestD20_FollowerRehomedIsNotAFailure(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, nil)
	pb.follow(t, abi.FollowerObject, "tally/1", "OLD", "t", "")
	pb.follow(t, abi.FollowerConnection, "OLD.7", "OLD", "t", "")
	net.located["tally/1"] = "B"
	net.live["B"] = true
	pb.publish(t, "t", `1`)
	drain(t, p, pb)
	if len(net.received["tally/1"]) != 1 {
		t.Fatal("rehomed follower did not receive")
	}
	edges := pb.edges(t)
	if len(edges) != 1 || edges[0].Node != "B" || edges[0].Attempts != 0 {
		t.Fatalf("edges %+v: want the object edge rehomed to B with no failed attempt", edges)
	}
	if obs.pruned != 1 || obs.retried != 0 {
		t.Errorf("pruned %d (want the connection of the dead node), retried %d", obs.pruned, obs.retried)
	}
}

// conformance: D24
func TestD24_OrderPerFollowerAcrossInlineAndRange(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	net.ranges = func(d *delivery.ObjectDelivery) []abi.Event {
		evs, _ := store.Read(context.Background(), pb.f.Path(), d.RangeQuery())
		return evs
	}
	in := net.conn("A", "A.1", 10000)
	remote := net.conn("B", "B.1", 10000)
	pb.follow(t, abi.FollowerConnection, "A.1", "A", "", "")
	pb.follow(t, abi.FollowerConnection, "B.1", "B", "", "")
	for i := 0; i < 5; i++ {
		pb.follow(t, abi.FollowerObject, fmt.Sprintf("o/%d", i), "A", "", "")
	}
	var want []uint64
	for i := 1; i <= 1200; i++ {
		pl := fmt.Sprintf(`"%d"`, i)
		if i%97 == 0 {
			pl = `"` + strings.Repeat("z", 40<<10) + `"`
		}
		pb.publish(t, []string{"a", "b"}[i%2], pl)
		want = append(want, uint64(i))
	}
	drain(t, p, pb)
	if got := seqs(in.items); !slices.Equal(got, want) {
		t.Fatalf("local watcher out of order or short: %d events", len(got))
	}
	if got := seqs(remote.items); !slices.Equal(got, want) {
		t.Fatalf("remote watcher out of order or short: %d events", len(got))
	}
	for i := 0; i < 5; i++ {
		var got []uint64
		for _, e := range net.received[fmt.Sprintf("o/%d", i)] {
			got = append(got, e.Seq)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("object follower %d: %d events, out of order or short", i, len(got))
		}
	}
}

func TestFilterSyntax(t *testing.T) {
	cases := []struct {
		filter, payload string
		want            bool
	}{
		{"", `anything`, true},
		{"u=ann", `{"u":"ann"}`, true},
		{"u=ann", `{"u":"bob"}`, false},
		{"n=2", `{"n":2}`, true},
		{"n=2", `{"n":"2"}`, true},
		{"ok=true", `{"ok":true}`, true},
		{"u=ann&n=1", `{"u":"ann","n":2}`, false},
		{"u=ann", `not json`, false},
	}
	for _, c := range cases {
		f, err := delivery.ParseFilter(c.filter)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Match([]byte(c.payload)); got != c.want {
			t.Errorf("%q on %s = %v", c.filter, c.payload, got)
		}
	}
	for _, bad := range []string{"noequals", "=x", strings.Repeat("a", 2000) + "=1"} {
		if _, err := delivery.ParseFilter(bad); err == nil {
			t.Errorf("%q should not parse", bad)
		}
	}
}

func TestBackoffDefaults(t *testing.T) {
	c := delivery.DefaultConfig()
	if c.Inbox != 256 || c.InlineLimit != 32<<10 || c.MaxAttempts != 8 || c.RetryBase != 500*time.Millisecond {
		t.Fatalf("defaults %+v differ from seed 000", c)
	}
	if c.Backoff(7) != 32*time.Second {
		t.Fatalf("last wait %v, want 32s", c.Backoff(7))
	}
}

// Connection edges' cursors advance together through one row (the
// connection floor): each connection still gets every event after its own
// start exactly once and in order, across batches, a re-follow, a file
// reopened (the edge cache rebuilt from the rows) and a failing object
// follower whose own cursor the floor must not move.
//
// conformance: D04 D14 D24
func TestConnectionCursorsMoveTogether(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	cfg := delivery.DefaultConfig()
	cfg.BatchEvents = 3 // several rounds per drain
	p := delivery.NewPump(cfg, net, net, &nopObs{}, slog.Default())
	in1 := net.conn("A", "A.1", 1000)
	in2 := net.conn("A", "A.2", 1000)
	pb.follow(t, abi.FollowerConnection, "A.1", "A", "t", "")
	net.fail["tally/1"] = 1 << 30 // never succeeds: its cursor stays put
	pb.follow(t, abi.FollowerObject, "tally/1", "A", "t", "")
	want1 := []uint64{}
	publish := func(n int) {
		for i := 0; i < n; i++ {
			pb.publish(t, "t", "x")
		}
	}
	publish(7)
	drain(t, p, pb)
	want1 = append(want1, 1, 2, 3, 4, 5, 6, 7)
	e2 := pb.follow(t, abi.FollowerConnection, "A.2", "A", "t", "")
	if e2.Cursor != 7 {
		t.Fatalf("new connection edge starts at %d, want the head 7", e2.Cursor)
	}
	publish(2)
	drain(t, p, pb)
	want1 = append(want1, 8, 9)
	// Following again keeps the cursor, which is the floor's, not the row's.
	if again := pb.follow(t, abi.FollowerConnection, "A.1", "A", "t", ""); again.Cursor != 9 {
		t.Fatalf("re-follow reports cursor %d, want 9", again.Cursor)
	}
	check := func(stage string) {
		t.Helper()
		for _, e := range pb.edges(t) {
			want := uint64(9)
			if e.Kind == abi.FollowerObject {
				want = 0
			}
			if e.Cursor != want {
				t.Fatalf("%s: edge %s cursor %d, want %d", stage, e.Follower, e.Cursor, want)
			}
		}
	}
	check("after delivery")

	// Reopen the file: the cache is rebuilt from the rows and the floor.
	path := pb.f.Path()
	pb.f.Close()
	f, err := store.Open(context.Background(), path, store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	pb.f = f
	check("after reopen")
	drain(t, p, pb) // nothing is owed to the connections
	publish(4)
	drain(t, p, pb)
	want1 = append(want1, 10, 11, 12, 13)
	if got := seqs(in1.items); !slices.Equal(got, want1) {
		t.Fatalf("A.1 got %v, want %v", got, want1)
	}
	if got := seqs(in2.items); !slices.Equal(got, []uint64{8, 9, 10, 11, 12, 13}) {
		t.Fatalf("A.2 got %v", got)
	}
}

func receivedSeqs(n *fakeNet, follower string) []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []uint64
	for _, e := range n.received[follower] {
		out = append(out, e.Seq)
	}
	return out
}

func upTo(n int) []uint64 {
	var out []uint64
	for i := 1; i <= n; i++ {
		out = append(out, uint64(i))
	}
	return out
}

// A follower whose delivery does not return holds back neither the
// publisher's sockets nor its rounds: each round delivers to the
// connections and returns while the follower's lane waits; no second
// delivery goes to the busy follower; once it answers it gets every event,
// once each, in order, without another round.
//
// conformance: D14 D15 D24
func TestPumpSlowFollowerDoesNotHoldConnections(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	in := net.conn("A", "A.1", 1000)
	pb.follow(t, abi.FollowerConnection, "A.1", "A", "t", "")
	pb.follow(t, abi.FollowerObject, "slow/1", "A", "t", "")
	pb.follow(t, abi.FollowerObject, "quick/1", "A", "t", "")
	g := net.slow("slow/1")
	round := func() {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			for {
				more, _, err := p.Round(context.Background(), pb)
				if err != nil || !more {
					done <- err
					return
				}
			}
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a round waits for the slow follower")
		}
	}
	pb.publish(t, "t", "1")
	round()
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow follower's delivery did not start")
	}
	for i := 2; i <= 10; i++ {
		pb.publish(t, "t", fmt.Sprint(i))
		round()
		if got := seqs(in.items); len(got) != i {
			t.Fatalf("after publish %d the socket has %v", i, got)
		}
	}
	if got := receivedSeqs(net, "slow/1"); len(got) != 0 {
		t.Fatalf("slow follower got %v before answering", got)
	}
	// The quick follower's lane ends once it has recorded its outcome.
	for deadline := time.Now().Add(5 * time.Second); p.Lanes() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes running, want the slow follower's alone", p.Lanes())
		}
	}
	net.mu.Lock()
	calls := net.objCall["slow/1"]
	net.mu.Unlock()
	if calls != 0 || len(g.entered) != 0 {
		t.Fatalf("a second delivery went to the busy follower")
	}
	if got := receivedSeqs(net, "quick/1"); !slices.Equal(got, upTo(10)) {
		t.Fatalf("the quick follower got %v", got)
	}
	close(g.open)
	pb.lanes.Wait() // no round: the lane itself picks up what came meanwhile
	if got := receivedSeqs(net, "slow/1"); !slices.Equal(got, upTo(10)) {
		t.Fatalf("slow follower got %v, want 1..10 once each in order", got)
	}
	if n := p.Lanes(); n != 0 {
		t.Fatalf("%d lanes left", n)
	}
	for _, e := range pb.edges(t) {
		if e.Cursor != 10 {
			t.Fatalf("edge %s cursor %d", e.Follower, e.Cursor)
		}
	}
}

// Stopping the publisher's owner ends a lane that is waiting on its
// follower: its goroutine returns, and the unfinished delivery is not
// recorded as a failure (it goes again after a restart).
func TestPumpLaneStopsWithItsOwner(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, nil)
	pb.follow(t, abi.FollowerObject, "slow/1", "A", "t", "")
	g := net.slow("slow/1")
	pb.publish(t, "t", "1")
	if _, _, err := p.Round(context.Background(), pb); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	pb.stop()
	done := make(chan struct{})
	go func() { pb.lanes.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the lane did not stop with its owner")
	}
	if e := pb.edges(t)[0]; e.Attempts != 0 || e.Cursor != 0 || obs.retried != 0 {
		t.Fatalf("edge %+v after stop: want untouched", e)
	}
	if p.Lanes() != 0 {
		t.Fatal("a lane mark was left behind")
	}
	if pb.Go(func(context.Context) {}) {
		t.Fatal("a stopped owner started a lane")
	}
}

// Events of one publisher reach a follower in publish order across all of
// its edges: a follower on topics a and b whose receive fails for a while
// holds both edges back under one backoff, and after recovery its log is in
// seq order across the topics.
//
// conformance: D18 D24
func TestD24_OrderAcrossAFollowersEdges(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, clock)
	pb.follow(t, abi.FollowerObject, "f/1", "A", "a", "")
	pb.follow(t, abi.FollowerObject, "f/1", "A", "b", "")
	pb.follow(t, abi.FollowerObject, "f/1", "A", "", "n=3") // all topics, filtered
	net.fail["f/1"] = 3
	for i := 1; i <= 6; i++ {
		pb.publish(t, []string{"a", "b"}[(i-1)%2], fmt.Sprintf(`{"n":%d}`, i))
	}
	next := drain(t, p, pb)
	if next.IsZero() {
		t.Fatal("a failing follower should back off")
	}
	// One backoff for the follower: every edge waits for the same time.
	for _, e := range pb.edges(t) {
		if e.NextDue != next.UnixNano() {
			t.Fatalf("edge on %q due %v, want %v with its sibling", e.Topic, time.Unix(0, e.NextDue), next)
		}
		if want := map[string]store.EdgeState{"a": store.EdgeRetrying, "b": store.EdgeHeld, "": store.EdgeHeld}[e.Topic]; e.State != want {
			t.Fatalf("edge on %q is %q, want %q", e.Topic, e.State, want)
		}
	}
	for !next.IsZero() {
		clock.Advance(next.Sub(clock.Now()))
		next = drain(t, p, pb)
	}
	// Seq 3 matches two edges (topic a, and all topics filtered on n=3):
	// the follower gets it once per edge, in a row.
	if got := receivedSeqs(net, "f/1"); !slices.Equal(got, []uint64{1, 2, 3, 3, 4, 5, 6}) {
		t.Fatalf("follower got %v, want publish order across its edges", got)
	}
	if obs.retried != 3 || obs.dropped != 0 {
		t.Fatalf("retried %d dropped %d, want 3 and 0", obs.retried, obs.dropped)
	}
	for _, e := range pb.edges(t) {
		if e.Cursor != 6 || e.Attempts != 0 || e.State != store.EdgeOK {
			t.Fatalf("edge %+v after recovery", e)
		}
	}
}

// A follower that cannot be located backs off like a failed attempt (500 ms
// doubling, then 32 s) without counting one: it is never dropped, shows as
// unplaced with its next attempt, and is routed at the first attempt after
// it is served again.
//
// conformance: D19 D20
func TestD20_UnplacedFollowerBacksOffAndIsNeverDropped(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	pb := newPub(t)
	net := newNet()
	p, obs := newPump(net, clock)
	pb.follow(t, abi.FollowerObject, "tally/1", "OLD", "t", "")
	pb.follow(t, abi.FollowerObject, "tally/1", "OLD", "u", "")
	pb.publish(t, "t", `1`)
	pb.publish(t, "u", `2`)
	var waits []time.Duration
	next := drain(t, p, pb)
	for range 12 {
		if next.IsZero() {
			t.Fatal("an unplaced follower must be tried again")
		}
		for _, e := range pb.edges(t) {
			if e.State != store.EdgeUnplaced || e.Attempts != 0 || e.NextAttempt == "" {
				t.Fatalf("edge %+v: want unplaced, no attempt counted, a next attempt", e)
			}
			if at, err := time.Parse(time.RFC3339Nano, e.NextAttempt); err != nil || !at.Equal(next) {
				t.Fatalf("next attempt %q, want %v", e.NextAttempt, next)
			}
		}
		waits = append(waits, next.Sub(clock.Now()))
		clock.Advance(next.Sub(clock.Now()))
		next = drain(t, p, pb)
	}
	s := time.Second
	want := []time.Duration{s / 2, s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 32 * s, 32 * s, 32 * s, 32 * s, 32 * s}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	if len(pb.edges(t)) != 2 || obs.dropped != 0 || obs.retried != 0 {
		t.Fatalf("unplaced is not a failure: dropped %d, retried %d", obs.dropped, obs.retried)
	}
	// Served again: the next attempt routes it, nothing counted.
	net.mu.Lock()
	net.located["tally/1"] = "B"
	net.live["B"] = true
	net.mu.Unlock()
	clock.Advance(next.Sub(clock.Now()))
	if next := drain(t, p, pb); !next.IsZero() {
		t.Fatalf("still due at %v after it is served", next)
	}
	if got := receivedSeqs(net, "tally/1"); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("follower got %v", got)
	}
	for _, e := range pb.edges(t) {
		if e.Node != "B" || e.State != store.EdgeOK || e.Unplaced != 0 || e.Attempts != 0 || e.NextAttempt != "" {
			t.Fatalf("edge %+v: want routed to B, ok", e)
		}
	}
}

// A delivery that fails because of where the follower is (its recorded
// node, still live, is not its home any more: a takeover the publisher's
// node has not seen) backs off like an unplaced follower, without counting
// an attempt, and asks where the follower is on every next attempt, so it
// reaches the new home as soon as the directory names it; a handler's
// failure is still counted.
//
// conformance: D19 D20
func TestD20_DeliveryToAMovedFollowerIsNotCounted(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	pb := newPub(t)
	net := newNet()
	net.live["B"], net.live["C"] = true, true
	net.located["tally/1"] = "B"                 // the directory is stale: B, still live,
	net.home = map[string]string{"tally/1": "C"} // is not its home any more
	p, obs := newPump(net, clock)
	pb.follow(t, abi.FollowerObject, "tally/1", "OLD", "t", "")
	pb.follow(t, abi.FollowerObject, "tally/1", "OLD", "u", "")
	pb.publish(t, "t", `1`)
	pb.publish(t, "u", `2`)
	next := drain(t, p, pb)
	var waits []time.Duration
	for range 11 {
		if next.IsZero() {
			t.Fatal("a moved follower must be tried again")
		}
		for _, e := range pb.edges(t) {
			if e.State != store.EdgeUnplaced || e.Attempts != 0 || e.Node != "B" {
				t.Fatalf("edge %+v: want unplaced at B, no attempt counted", e)
			}
		}
		waits = append(waits, next.Sub(clock.Now()))
		clock.Advance(next.Sub(clock.Now()))
		if len(waits) == 11 {
			net.mu.Lock()
			net.located["tally/1"] = "C" // the directory names the new home
			net.mu.Unlock()
		}
		next = drain(t, p, pb)
	}
	s := time.Second
	want := []time.Duration{s / 2, s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 32 * s, 32 * s, 32 * s, 32 * s}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	if !next.IsZero() {
		t.Fatalf("still due at %v after the directory names the new home", next)
	}
	if obs.dropped != 0 || obs.retried != 0 {
		t.Fatalf("a moved follower is not a failure: dropped %d, retried %d", obs.dropped, obs.retried)
	}
	if got := receivedSeqs(net, "tally/1"); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("follower got %v", got)
	}
	for _, e := range pb.edges(t) {
		if e.Node != "C" || e.State != store.EdgeOK || e.Unplaced != 0 || e.Attempts != 0 || e.NextAttempt != "" {
			t.Fatalf("edge %+v: want routed to C, ok", e)
		}
	}
	// A handler's failure at the new home counts as before.
	net.mu.Lock()
	net.fail["tally/1"] = 1
	net.mu.Unlock()
	pb.publish(t, "t", `3`)
	if next = drain(t, p, pb); next.IsZero() || obs.retried != 1 {
		t.Fatalf("a handler failure: next %v, retried %d; want a counted retry", next, obs.retried)
	}
	counted := 0
	for _, e := range pb.edges(t) {
		counted += e.Attempts
		if e.Unplaced != 0 {
			t.Fatalf("edge %+v: a handler failure is not unplaced", e)
		}
	}
	if counted != 1 {
		t.Fatalf("edges %+v: want one counted attempt", pb.edges(t))
	}
}

// A ranged delivery is materialized with its topic, its filter and its
// range, from a copy that holds the range; an empty range reads nothing.
//
// conformance: D09
func TestRangeQueryMaterializesTopicFilterRange(t *testing.T) {
	pb := newPub(t)
	pb.publish(t, "t", `{"u":"ann"}`, `{"u":"bob"}`) // 1 2
	pb.publish(t, "o", `{"u":"ann"}`)                // 3
	pb.publish(t, "t", `{"u":"ann"}`, `{"u":"ann"}`) // 4 5
	ctx := context.Background()
	for _, c := range []struct {
		d    delivery.ObjectDelivery
		want []uint64
	}{
		{delivery.ObjectDelivery{Topic: "t", Filter: "u=ann", Range: &delivery.Range{After: 0, Through: 4}}, []uint64{1, 4}},
		{delivery.ObjectDelivery{Topic: "", Filter: "u=ann", Range: &delivery.Range{After: 1, Through: 5}}, []uint64{3, 4, 5}},
		{delivery.ObjectDelivery{Topic: "t", Range: &delivery.Range{After: 1, Through: 2}}, []uint64{2}},
		{delivery.ObjectDelivery{Topic: "t", Filter: "bad", Range: &delivery.Range{After: 0, Through: 5}}, nil},
		{delivery.ObjectDelivery{Topic: "t", Range: &delivery.Range{After: 3, Through: 3}}, nil},
		{delivery.ObjectDelivery{Topic: "t", Range: &delivery.Range{}}, nil},
		{delivery.ObjectDelivery{Topic: "t"}, nil},
	} {
		evs, err := store.Read(ctx, pb.f.Path(), c.d.RangeQuery())
		var got []uint64
		for _, e := range evs {
			got = append(got, e.Seq)
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v %v, want %v", c.d, got, err, c.want)
		}
	}
	if _, err := store.Read(ctx, pb.f.Path(), (&delivery.ObjectDelivery{Range: &delivery.Range{After: 4, Through: 6}}).RangeQuery()); !errors.Is(err, store.ErrNoLog) {
		t.Fatalf("a range past this copy's log: %v, want ErrNoLog", err)
	}
}
