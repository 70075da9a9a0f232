package delivery

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/durable-host/host/abi"
)

// fanOut is how a round's events cross to the connection edges due them.
// byNode is the product (seed 000); perSocket and bySubject are the
// baselines Config.FanOut selects for the benchmarks, here so that the
// round itself never asks which one runs.
type fanOut interface {
	// send carries r's events (in publish order) to the edges of its
	// nodes, all of them live; it returns the connections to prune.
	send(ctx context.Context, r *connRound) (prune []string)
}

// connRound is what a round's connection lane sends: the events, and the
// nodes with edges owed some of them.
type connRound struct {
	pub    string
	sets   *ConnSets
	events []abi.Event
	nodes  []nodeDue
}

var (
	_ fanOut = byNode{}
	_ fanOut = perSocket{}
	_ fanOut = bySubject{}
)

// newFanOut returns mode's fan-out. The subject baseline needs a transport
// that publishes topics; without one it is the product's.
func newFanOut(mode FanOut, t Transport, obs Observer, log *slog.Logger, self func() string) fanOut {
	nodes := byNode{transport: t, obs: obs, log: log, self: self}
	switch mode {
	case FanOutSocket:
		return perSocket{nodes}
	case FanOutSubject:
		if tp, ok := t.(TopicPublisher); ok {
			return bySubject{topics: tp, log: log}
		}
	}
	return nodes
}

// byNode sends one batch per node, concurrently: the events once, beside
// the node's edge set (whole to this node, else as the changes since the
// version the node holds).
type byNode struct {
	transport Transport
	obs       Observer
	log       *slog.Logger
	self      func() string
}

func (f byNode) send(ctx context.Context, r *connRound) []string {
	self := f.self()
	return sendEach(len(r.nodes), func(i int) []string {
		d := &r.nodes[i]
		return f.batch(ctx, r, d, d.node == self)
	})
}

// sendEach runs send(0) … send(n-1), each on a goroutine of its own, and
// returns, once all have answered, the connections they reported.
func sendEach(n int, send func(i int) []string) []string {
	var mu sync.Mutex // guards prune
	var prune []string
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			gone := send(i)
			mu.Lock()
			prune = append(prune, gone...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return prune
}

// batch sends one batch to d's node carrying the events its edges are
// owed, once. It returns the connections to prune. Every edge advances
// (at-most-once: a push that did not land is not retried).
func (f byNode) batch(ctx context.Context, r *connRound, d *nodeDue, local bool) []string {
	b := &ConnBatch{Publisher: r.pub, Cursor: d.after, Events: owed(r, d.owes)}
	if len(b.Events) == 0 {
		return nil
	}
	if local {
		// In process: the set itself, nothing to version.
		b.Edges = d.set.edges
	} else {
		r.sets.describe(b, d.node, d.set)
	}
	res, err := f.call(ctx, d.node, local, b)
	switch {
	case err == nil && res.Unknown && !local:
		// The node holds no set this session knows: it gets the whole
		// set, in this round.
		r.sets.whole(b, d.node, d.set)
		res, err = f.call(ctx, d.node, local, b)
	case errors.Is(err, ErrUnversioned):
		// A node of an earlier version: it gets whole, unversioned
		// batches from now on, this one again at once.
		r.sets.unversioned(d.node)
		r.sets.describe(b, d.node, d.set)
		res, err = f.call(ctx, d.node, local, b)
	}
	if err != nil {
		// At-most-once: a batch that did not land is not retried.
		f.log.Warn("connection batch failed", slog.String("node", d.node), slog.Any("err", err))
		return nil
	}
	if !local && !res.Unknown {
		r.sets.acked(d.node, res.Epoch, d.set)
	}
	return append(res.Refused, res.Gone...)
}

// call sends one batch to node, counted.
func (f byNode) call(ctx context.Context, node string, local bool, b *ConnBatch) (ConnResult, error) {
	f.obs.ConnBatchSent(node, local, b)
	return f.transport.Connections(ctx, node, b)
}

// owed returns r's events some edge admits by owes, with their publisher.
func owed(r *connRound, owes func(*abi.Event) bool) []abi.Event {
	var out []abi.Event
	for _, ev := range r.events {
		if owes(&ev) {
			ev.Publisher = r.pub
			out = append(out, ev)
		}
	}
	return out
}

// perSocket is the naive baseline: one send per watcher, each an
// unversioned batch of its one edge.
type perSocket struct{ byNode }

func (f perSocket) send(ctx context.Context, r *connRound) []string {
	var edges []*nodeDue
	var which []int
	for i := range r.nodes {
		for k := range r.nodes[i].set.edges {
			edges, which = append(edges, &r.nodes[i]), append(which, k)
		}
	}
	self := f.self()
	return sendEach(len(edges), func(i int) []string {
		d := edges[i]
		e := d.set.edges[which[i]]
		e.Cursor = max(e.Cursor, d.after)
		b := &ConnBatch{Publisher: r.pub, Edges: []ConnEdge{e}, Events: owed(r, func(ev *abi.Event) bool {
			return ev.Seq > e.Cursor && TopicMatch(e.Topic, ev.Topic)
		})}
		if len(b.Events) == 0 {
			return nil
		}
		res, err := f.call(ctx, d.node, d.node == self, b)
		if err != nil {
			f.log.Warn("connection batch failed", slog.String("node", d.node), slog.Any("err", err))
			return nil
		}
		return append(res.Refused, res.Gone...)
	})
}

// bySubject is the baseline users would build on NATS alone: each event
// is published once on its topic's subject and NATS fans out to every
// subscribed node. Refusals are not reported, so it prunes nothing.
type bySubject struct {
	topics TopicPublisher
	log    *slog.Logger
}

func (f bySubject) send(ctx context.Context, r *connRound) []string {
	if len(r.nodes) > 0 {
		if err := f.topics.PublishTopic(ctx, r.pub, r.events); err != nil {
			f.log.Warn("topic publish failed", slog.Any("err", err))
		}
	}
	return nil
}
