package delivery_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/delivery/deliverytest"
	"github.com/durable-host/host/store"
)

// remoteWatchers follows with n watchers spread over the remote nodes B
// and C (and the local A), returning their inboxes by connection.
func remoteWatchers(t *testing.T, pb *pub, net *fakeNet, n int) map[string]*inbox {
	t.Helper()
	in := map[string]*inbox{}
	for i := range n {
		node := []string{"A", "B", "C"}[i%3]
		id := fmt.Sprintf("%s.%d", node, i)
		in[id] = net.conn(node, id, 1000)
		pb.follow(t, abi.FollowerConnection, id, node, "m", "")
	}
	return in
}

// batchesTo returns the versioned batches sent to node from the k-th
// batch on.
func (n *fakeNet) batchesTo(node string, k int) []*delivery.ConnBatch {
	var out []*delivery.ConnBatch
	for i, b := range n.batches[k:] {
		if b.Set.Version != 0 && n.batchNode[k+i] == node {
			out = append(out, b)
		}
	}
	return out
}

func (n *fakeNet) unknowns() int {
	k := 0
	for _, r := range n.results {
		if r.Unknown {
			k++
		}
	}
	return k
}

// A steady edge set costs a version, not the edges: after the first batch
// to a node (the whole set), batches carry no edge and a few bytes beside
// the events however many watchers the node has.
func TestEdgeSetSteadyBatchesCarryNoEdges(t *testing.T) {
	for _, watchers := range []int{30, 600} {
		t.Run(fmt.Sprint(watchers), func(t *testing.T) {
			pb := newPub(t)
			net := newNet()
			p, _ := newPump(net, nil)
			in := remoteWatchers(t, pb, net, watchers)
			pb.publish(t, "m", `"first"`)
			drain(t, p, pb)
			k := len(net.batches)
			for i := range 3 {
				pb.publish(t, "m", fmt.Sprintf(`"m%d"`, i))
				drain(t, p, pb)
			}
			for _, node := range []string{"B", "C"} {
				bs := net.batchesTo(node, k)
				if len(bs) != 3 {
					t.Fatalf("%d versioned batches to %s, want 3", len(bs), node)
				}
				for _, b := range bs {
					events, edges := b.WireSize()
					if len(b.Edges) != 0 || len(b.Removed) != 0 || b.Set.Base != b.Set.Version || edges > 40 {
						t.Fatalf("steady batch to %s: %d edges, %d removed, %+v, %d edge bytes (%d event bytes)", node, len(b.Edges), len(b.Removed), b.Set, edges, events)
					}
				}
			}
			for id, box := range in {
				if got := seqs(box.items); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
					t.Fatalf("%s got %v", id, got)
				}
			}
		})
	}
}

// Edges added and removed travel as such, and a node that missed a change
// (its batch lost, or its reply lost after it applied it) still ends with
// the publisher's set: a lost batch leaves its acknowledged version the
// base; a lost reply leaves the node ahead of that base, so it answers
// Unknown and gets the whole set once, in the same round.
func TestEdgeSetMissedChanges(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	in := remoteWatchers(t, pb, net, 6) // B.1, B.4 on B
	pb.publish(t, "m", `"1"`)
	drain(t, p, pb)

	// A change, and its batch lost on the way: the next batch carries
	// the changes since the version B acknowledged.
	in["B.10"] = net.conn("B", "B.10", 100)
	pb.follow(t, abi.FollowerConnection, "B.10", "B", "m", "")
	net.dropped["B"] = 1
	pb.publish(t, "m", `"2"`)
	drain(t, p, pb)
	in["B.11"] = net.conn("B", "B.11", 100)
	pb.follow(t, abi.FollowerConnection, "B.11", "B", "m", "")
	if _, err := removeEdge(pb, "B.1"); err != nil {
		t.Fatal(err)
	}
	k := len(net.batches)
	pb.publish(t, "m", `"3"`)
	drain(t, p, pb)
	b := net.batchesTo("B", k)[0]
	if b.Set.Base == 0 || len(b.Edges) != 2 || !slices.Equal(b.Removed, []int64{edgeID(t, net, "B.1")}) {
		t.Fatalf("after a lost batch: base %d, %d edges, removed %v; want the changes since the acknowledged version", b.Set.Base, len(b.Edges), b.Removed)
	}

	// A change B applies, its reply lost: B is ahead of what the
	// publisher knows, answers Unknown, and gets the whole set.
	in["B.12"] = net.conn("B", "B.12", 100)
	pb.follow(t, abi.FollowerConnection, "B.12", "B", "m", "")
	net.lost["B"] = 1
	pb.publish(t, "m", `"4"`)
	drain(t, p, pb)
	in["B.13"] = net.conn("B", "B.13", 100)
	pb.follow(t, abi.FollowerConnection, "B.13", "B", "m", "")
	k = len(net.batches)
	pb.publish(t, "m", `"5"`)
	drain(t, p, pb)
	bs := net.batchesTo("B", k)
	if len(bs) != 2 || bs[0].Set.Base == 0 || bs[1].Set.Base != 0 || len(bs[1].Edges) != 5 {
		t.Fatalf("after a lost reply: %d batches %+v; want a delta answered Unknown, then the whole set of 5", len(bs), sets(bs))
	}
	if net.unknowns() != 1 {
		t.Fatalf("%d Unknown answers, want the one", net.unknowns())
	}
	want := map[string][]uint64{
		"B.1": {1, 2}, "B.4": {1, 2, 3, 4, 5}, "B.10": {3, 4, 5}, "B.11": {3, 4, 5}, "B.12": {4, 5}, "B.13": {5},
		"A.0": {1, 2, 3, 4, 5}, "C.2": {1, 2, 3, 4, 5},
	}
	// B's batch 2 was lost: at most once, B's watchers miss seq 2.
	want["B.1"], want["B.4"] = []uint64{1}, []uint64{1, 3, 4, 5}
	for id, w := range want {
		if got := seqs(in[id].items); !slices.Equal(got, w) {
			t.Errorf("%s got %v, want %v", id, got, w)
		}
	}
}

func sets(bs []*delivery.ConnBatch) []delivery.SetVersion {
	var out []delivery.SetVersion
	for _, b := range bs {
		out = append(out, b.Set)
	}
	return out
}

func removeEdge(pb *pub, conn string) (int, error) {
	var n int
	err := pb.Between(context.Background(), func(tx *store.Tx) error {
		var err error
		n, err = tx.RemoveFollower(abi.FollowerConnection, conn)
		return err
	})
	return n, err
}

// edgeID finds conn's edge id in a whole set sent earlier.
func edgeID(t *testing.T, net *fakeNet, conn string) int64 {
	t.Helper()
	for _, b := range net.batches {
		for _, e := range b.Edges {
			if e.Conn == conn {
				return e.Edge
			}
		}
	}
	t.Fatalf("no edge of %s was sent", conn)
	return 0
}

// A node that restarted (its copies gone, a new epoch) answers Unknown to
// the next batch and gets the whole set once; the batches after are
// steady again. Its watchers miss nothing of the round.
func TestEdgeSetRestartedReceiverGetsTheWholeSetOnce(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	in := remoteWatchers(t, pb, net, 9)
	pb.publish(t, "m", `"1"`)
	drain(t, p, pb)
	old := net.copies["B"].Epoch()
	net.copies["B"] = delivery.NewEdgeCopies(delivery.DefaultEdgeCopies, delivery.DefaultEdgeCopyIdle, delivery.RealClock)
	if net.copies["B"].Epoch() == old {
		t.Fatal("a new EdgeCopies has the old epoch")
	}
	k := len(net.batches)
	for i := range 3 {
		pb.publish(t, "m", fmt.Sprintf(`"%d"`, i+2))
		drain(t, p, pb)
	}
	bs := net.batchesTo("B", k)
	var whole int
	for _, b := range bs {
		if b.Set.Base == 0 {
			whole++
		}
	}
	if len(bs) != 4 || whole != 1 || bs[1].Set.Base != 0 || len(bs[1].Edges) != 3 {
		t.Fatalf("batches to the restarted node %+v: want Unknown, the whole set once, then steady", sets(bs))
	}
	for id, box := range in {
		if got := seqs(box.items); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
			t.Fatalf("%s got %v", id, got)
		}
	}
}

// A batch naming a version of a publisher the node holds nothing of, or a
// version under another epoch or session, is answered Unknown and slices
// nothing.
func TestEdgeCopiesUnknownBase(t *testing.T) {
	c := delivery.NewEdgeCopies(10, time.Hour, delivery.RealClock)
	box := &inbox{cap: 10}
	lookup := func(string) (delivery.Inbox, bool) { return box, true }
	ev := []abi.Event{{Topic: "m", Seq: 5}}
	delta := &delivery.ConnBatch{Publisher: "p/never", Events: ev, Set: delivery.SetVersion{Epoch: c.Epoch(), Session: 7, Base: 3, Version: 4}}
	if res := c.Slice(delta, lookup); !res.Unknown || res.Epoch != c.Epoch() || len(box.items) != 0 {
		t.Fatalf("unknown publisher: %+v, %d items", res, len(box.items))
	}
	whole := &delivery.ConnBatch{Publisher: "p/1", Events: ev, Edges: []delivery.ConnEdge{{Edge: 1, Conn: "x", Topic: "m"}}, Set: delivery.SetVersion{Session: 7, Version: 3}}
	if res := c.Slice(whole, lookup); res.Unknown || len(box.items) != 1 {
		t.Fatalf("whole set: %+v, %d items", res, len(box.items))
	}
	for _, sv := range []delivery.SetVersion{
		{Epoch: c.Epoch() + 1, Session: 7, Base: 3, Version: 4}, // another epoch: the node restarted
		{Epoch: c.Epoch(), Session: 8, Base: 3, Version: 4},     // another session: another home
		{Epoch: c.Epoch(), Session: 7, Base: 2, Version: 4},     // a base it does not hold
	} {
		b := &delivery.ConnBatch{Publisher: "p/1", Events: []abi.Event{{Topic: "m", Seq: 6}}, Set: sv}
		if res := c.Slice(b, lookup); !res.Unknown || len(box.items) != 1 {
			t.Fatalf("%+v: %+v, %d items", sv, res, len(box.items))
		}
	}
	steady := &delivery.ConnBatch{Publisher: "p/1", Events: []abi.Event{{Topic: "m", Seq: 6}}, Set: delivery.SetVersion{Epoch: c.Epoch(), Session: 7, Base: 3, Version: 3}}
	if res := c.Slice(steady, lookup); res.Unknown || len(box.items) != 2 {
		t.Fatalf("steady: %+v, %d items", res, len(box.items))
	}
}

// A delta removes and adds by id (an added id replaces the edge it names),
// whatever order the ids come in; an emptied set is dropped, idle sets
// go after the idle time and past the limit the least recently used.
func TestEdgeCopiesDeltaAndEviction(t *testing.T) {
	clock := deliverytest.NewClock(time.Unix(1_700_000_000, 0))
	c := delivery.NewEdgeCopies(2, time.Minute, clock)
	got := map[string][]uint64{}
	lookup := func(conn string) (delivery.Inbox, bool) {
		return inboxFunc(func(it *delivery.Item) { got[conn] = append(got[conn], it.Event.Seq) }), true
	}
	e := func(id int64, conn, filter string) delivery.ConnEdge {
		return delivery.ConnEdge{Edge: id, Conn: conn, Topic: "m", Filter: filter}
	}
	send := func(pub string, seq uint64, sv delivery.SetVersion, edges []delivery.ConnEdge, removed ...int64) delivery.ConnResult {
		sv.Epoch, sv.Session = c.Epoch(), 1
		return c.Slice(&delivery.ConnBatch{Publisher: pub, Events: []abi.Event{{Topic: "m", Seq: seq, Payload: []byte(`{"u":"ann"}`)}}, Edges: edges, Removed: removed, Set: sv}, lookup)
	}
	send("p/1", 1, delivery.SetVersion{Version: 1}, []delivery.ConnEdge{e(5, "e", ""), e(2, "b", ""), e(3, "c", "")})
	send("p/1", 2, delivery.SetVersion{Base: 1, Version: 2}, []delivery.ConnEdge{e(9, "i", ""), e(3, "c", "u=bob"), e(1, "a", "")}, 2, 7)
	want := map[string][]uint64{"a": {2}, "b": {1}, "c": {1}, "e": {1, 2}, "i": {2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if res := send("p/1", 3, delivery.SetVersion{Base: 2, Version: 3}, nil, 1, 3, 5, 9); res.Unknown || c.Len() != 0 {
		t.Fatalf("an emptied set should be dropped: %+v, %d held", res, c.Len())
	}
	send("p/1", 4, delivery.SetVersion{Version: 4}, []delivery.ConnEdge{e(1, "a", "")})
	send("p/2", 1, delivery.SetVersion{Version: 1}, []delivery.ConnEdge{e(1, "a", "")})
	send("p/1", 5, delivery.SetVersion{Base: 4, Version: 4}, nil) // p/1 used last
	send("p/3", 1, delivery.SetVersion{Version: 1}, []delivery.ConnEdge{e(1, "a", "")})
	if c.Len() != 2 || !send("p/2", 2, delivery.SetVersion{Base: 1, Version: 1}, nil).Unknown {
		t.Fatal("past the limit the least recently used set should go")
	}
	clock.Advance(2 * time.Minute)
	if !send("p/1", 6, delivery.SetVersion{Base: 4, Version: 4}, nil).Unknown || c.Len() != 0 {
		t.Fatal("idle sets should go")
	}
}

type inboxFunc func(*delivery.Item)

func (f inboxFunc) Offer(it *delivery.Item) bool { f(it); return true }

// Watchers join and leave on remote nodes between the rounds of a burst
// (more events than a round reads), batches are lost and replies lost,
// nodes restart: every watcher still gets exactly the events published
// from its follow on (at most once: minus a lost batch's), of its topic
// and filter, in publish order, until it leaves. Against a model, over
// several seeds.
//
// conformance: D07 D14 D24
func TestEdgeSetChurnDuringBursts(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { churnDuringBursts(t, seed) })
	}
}

func churnDuringBursts(t *testing.T, seed uint64) {
	pb := newPub(t)
	net := newNet()
	cfg := delivery.DefaultConfig()
	cfg.BatchEvents = 3
	p := delivery.NewPump(cfg, net, net, &nopObs{}, slog.Default())
	rng := rand.New(rand.NewPCG(seed, 2))
	type watch struct {
		node, topic, filter string
		since               uint64
		gone                bool
		had                 int // items when it left
	}
	ws := map[string]*watch{}
	var order []string // watchers in the order they followed
	want := map[string][]uint64{}
	boxes := map[string]*inbox{}
	var head uint64
	var log []abi.Event
	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 3:
			node := []string{"A", "B", "C"}[rng.IntN(3)]
			id := fmt.Sprintf("%s.%d", node, step)
			w := &watch{node: node, topic: []string{"m", "n", ""}[rng.IntN(3)], filter: []string{"", "u=ann"}[rng.IntN(2)], since: head}
			ws[id], boxes[id] = w, net.conn(node, id, 10000)
			order = append(order, id)
			pb.follow(t, abi.FollowerConnection, id, node, w.topic, w.filter)
		case op < 5 && len(order) > 0:
			id := order[rng.IntN(len(order))]
			if w := ws[id]; !w.gone {
				w.gone, w.had = true, len(boxes[id].items)
				if _, err := removeEdge(pb, id); err != nil {
					t.Fatal(err)
				}
			}
		case op < 9:
			for range 1 + rng.IntN(5) {
				topic := []string{"m", "n"}[rng.IntN(2)]
				payload := []string{`{"u":"ann"}`, `{"u":"bob"}`}[rng.IntN(2)]
				pb.publish(t, topic, payload)
				head++
				log = append(log, abi.Event{Topic: topic, Seq: head, Payload: []byte(payload)})
			}
		default:
			node := []string{"B", "C"}[rng.IntN(2)]
			switch rng.IntN(3) {
			case 0:
				net.copies[node] = nil // restarted
			case 1:
				net.lost[node]++
			default:
				net.dropped[node]++
			}
		}
		if rng.IntN(3) > 0 {
			continue
		}
		// A lost reply loses the batch too when the node answered
		// Unknown: the whole set is not sent.
		lost := map[string]bool{}
		for _, node := range []string{"B", "C"} {
			lost[node] = net.dropped[node] > 0 || net.lost[node] > 0
		}
		drain(t, p, pb)
		// The model: a watcher present at the drain gets what it is owed
		// since its follow or the last drain, unless its node lost a
		// batch meanwhile (then it may miss some: at most once).
		for id, w := range ws {
			if w.gone {
				if n := len(boxes[id].items); n != w.had {
					t.Fatalf("step %d: %s got %d events after it left", step, id, n-w.had)
				}
				continue
			}
			f := delivery.MustFilter(w.filter)
			for _, ev := range log[w.since:head] {
				if delivery.TopicMatch(w.topic, ev.Topic) && f.Match(ev.Payload) && !lost[w.node] {
					want[id] = append(want[id], ev.Seq)
				}
			}
			w.since = head
			got := seqs(boxes[id].items)
			for i := 1; i < len(got); i++ {
				if got[i] <= got[i-1] {
					t.Fatalf("step %d: %s got %v out of order", step, id, got)
				}
			}
			if !lost[w.node] && !slices.Equal(got, want[id]) {
				t.Fatalf("step %d: %s (%s %q %q) got %v, want %v", step, id, w.node, w.topic, w.filter, got, want[id])
			}
			if lost[w.node] {
				want[id] = got // from here on it is exact again
			}
		}
	}
}

// An edge removed and followed again by the same connection on the same
// topic may get its old id back (SQLite reuses the largest rowid): it is
// another edge, starting at the head, and the node must not keep the old
// one's cursor and replay what it missed.
//
// conformance: D04
func TestEdgeSetReusedIDIsANewEdge(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	keep := net.conn("B", "B.keep", 100)
	pb.follow(t, abi.FollowerConnection, "B.keep", "B", "m", "")
	again := net.conn("B", "B.again", 100)
	first := pb.follow(t, abi.FollowerConnection, "B.again", "B", "m", "")
	pb.publish(t, "m", `1`)
	drain(t, p, pb)
	// Gone and back between two batches to B.
	if _, err := removeEdge(pb, "B.again"); err != nil {
		t.Fatal(err)
	}
	pb.publish(t, "m", `2`)
	time.Sleep(time.Millisecond) // another creation time
	second := pb.follow(t, abi.FollowerConnection, "B.again", "B", "m", "")
	if second.ID != first.ID {
		t.Skipf("the store gave a new id (%d, was %d): nothing reused to check", second.ID, first.ID)
	}
	pb.publish(t, "m", `3`)
	drain(t, p, pb)
	if got := seqs(again.items); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("the refollowed connection got %v, want [1 3]: nothing replayed down the new edge", got)
	}
	if got := seqs(keep.items); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("the other got %v", got)
	}
}

// The batch's cursor raises every edge's: an edge sent with an older
// cursor (its set unchanged since) is not offered what it has done.
//
// conformance: D07 D14
func TestSliceBatchCursorRaisesEdgeCursors(t *testing.T) {
	box := &inbox{cap: 10}
	b := &delivery.ConnBatch{Publisher: "p/1", Cursor: 3,
		Events: []abi.Event{{Topic: "m", Seq: 2}, {Topic: "m", Seq: 3}, {Topic: "m", Seq: 4}},
		Edges:  []delivery.ConnEdge{{Edge: 1, Conn: "c", Topic: "m", Cursor: 1}}}
	delivery.Slice(b, func(string) (delivery.Inbox, bool) { return box, true })
	if got := seqs(box.items); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("got %v, want [4]: the batch's cursor 3 is the edge's", got)
	}
}

// oldNode is a node of the version before edge sets were versioned: its
// decoder takes a batch that ends after the edges and refuses anything
// after them (as a bad request, which the host's transport reports as
// ErrUnversioned); it slices what it takes. Called with n.mu held.
func (n *fakeNet) oldNode(node string, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	bare := *b
	bare.Removed, bare.Cursor, bare.Set = nil, 0, delivery.SetVersion{}
	if len(delivery.AppendConnBatch(nil, b)) != len(delivery.AppendConnBatch(nil, &bare)) {
		return delivery.ConnResult{}, fmt.Errorf("%w: bad request: malformed conns request", delivery.ErrUnversioned)
	}
	return delivery.Slice(b, func(c string) (delivery.Inbox, bool) {
		in, ok := n.inboxes[node][c]
		return in, ok
	}), nil
}

// A node of the earlier version (mixed versions during a rolling
// upgrade) cannot read a versioned batch: it gets the same batch whole
// and unversioned at once, and only that form afterwards, each edge with
// its own cursor (nothing replayed down an edge made at the head).
//
// conformance: D04 D24
func TestEdgeSetOldNodeGetsUnversionedBatches(t *testing.T) {
	pb := newPub(t)
	net := newNet()
	p, _ := newPump(net, nil)
	in := remoteWatchers(t, pb, net, 6) // B.1, B.4 on B
	net.old["B"] = true
	pb.publish(t, "m", `"1"`)
	drain(t, p, pb)
	if net.connCall["B"] != 2 {
		t.Fatalf("%d batches to the old node, want the versioned one refused and the same again unversioned", net.connCall["B"])
	}
	pb.publish(t, "m", `"2"`)
	in["B.7"] = net.conn("B", "B.7", 100)
	pb.follow(t, abi.FollowerConnection, "B.7", "B", "m", "")
	pb.publish(t, "m", `"3"`)
	k := len(net.batches)
	drain(t, p, pb)
	for i, b := range net.batches[k:] {
		if net.batchNode[k+i] == "B" && (b.Set != delivery.SetVersion{} || b.Cursor != 0 || len(b.Edges) != 3) {
			t.Fatalf("batch to the old node %+v: want every edge, unversioned", b)
		}
	}
	if net.connCall["B"] != 3 {
		t.Fatalf("%d batches to the old node, want one more", net.connCall["B"])
	}
	want := map[string][]uint64{"B.1": {1, 2, 3}, "B.4": {1, 2, 3}, "B.7": {3}, "C.2": {1, 2, 3}, "A.0": {1, 2, 3}}
	for id, w := range want {
		if got := seqs(in[id].items); !slices.Equal(got, w) {
			t.Errorf("%s got %v, want %v", id, got, w)
		}
	}
}
