package delivery

import (
	"context"
	"iter"
	"log/slog"
	"maps"
	"sync"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// fanOut is how a round's events cross to the connection edges due them.
// byNode is the product (seed 000); perSocket and bySubject are the
// baselines Config.FanOut selects for the benchmarks, here so that the
// round itself never asks which one runs.
type fanOut interface {
	// send carries events (in publish order) to the edges of groups, by
	// node, all of them on live nodes; it returns the connections to prune.
	send(ctx context.Context, pub string, groups map[string][]store.Edge, events []abi.Event) (prune []string)
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
// every edge on that node.
type byNode struct {
	transport Transport
	obs       Observer
	log       *slog.Logger
	self      func() string
}

func (f byNode) send(ctx context.Context, pub string, groups map[string][]store.Edge, events []abi.Event) []string {
	return f.sendEach(ctx, pub, events, maps.All(groups))
}

// sendEach sends each (node, edges) batch on a goroutine of its own and
// returns, once all have answered, the connections their nodes reported.
func (f byNode) sendEach(ctx context.Context, pub string, events []abi.Event, batches iter.Seq2[string, []store.Edge]) []string {
	var mu sync.Mutex // guards prune
	var prune []string
	var wg sync.WaitGroup
	self := f.self()
	for node, edges := range batches {
		wg.Go(func() {
			gone := f.batch(ctx, node, node == self, edges, events, pub)
			mu.Lock()
			prune = append(prune, gone...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return prune
}

// batch sends one batch to node carrying the events once beside every
// connection edge there. It returns the connections to prune. Every edge
// advances (at-most-once: a push that did not land is not retried).
func (f byNode) batch(ctx context.Context, node string, local bool, edges []store.Edge, events []abi.Event, pub string) []string {
	after := edges[0].Cursor
	topics := map[string]bool{}
	b := &ConnBatch{Publisher: pub, Edges: make([]ConnEdge, 0, len(edges))}
	for _, e := range edges {
		after = min(after, e.Cursor)
		topics[e.Topic] = true
		b.Edges = append(b.Edges, ConnEdge{Edge: e.ID, Conn: e.Follower, Topic: e.Topic, Cursor: e.Cursor, Filter: e.Filter})
	}
	for _, ev := range events {
		if ev.Seq > after && (topics[ev.Topic] || topics[""]) {
			ev.Publisher = pub
			b.Events = append(b.Events, ev)
		}
	}
	if len(b.Events) == 0 {
		return nil
	}
	f.obs.ConnBatchSent(node, local, len(b.Events), len(b.Edges))
	res, err := f.transport.Connections(ctx, node, b)
	if err != nil {
		// At-most-once: a batch that did not land is not retried.
		f.log.Warn("connection batch failed", slog.String("node", node), slog.Any("err", err))
		return nil
	}
	return append(res.Refused, res.Gone...)
}

// perSocket is the naive baseline: one send per watcher.
type perSocket struct{ byNode }

func (f perSocket) send(ctx context.Context, pub string, groups map[string][]store.Edge, events []abi.Event) []string {
	return f.sendEach(ctx, pub, events, func(yield func(string, []store.Edge) bool) {
		for node, g := range groups {
			for _, e := range g {
				if !yield(node, []store.Edge{e}) {
					return
				}
			}
		}
	})
}

// bySubject is the baseline users would build on NATS alone: each event
// is published once on its topic's subject and NATS fans out to every
// subscribed node. Refusals are not reported, so it prunes nothing.
type bySubject struct {
	topics TopicPublisher
	log    *slog.Logger
}

func (f bySubject) send(ctx context.Context, pub string, groups map[string][]store.Edge, events []abi.Event) []string {
	if len(groups) > 0 {
		if err := f.topics.PublishTopic(ctx, pub, events); err != nil {
			f.log.Warn("topic publish failed", slog.Any("err", err))
		}
	}
	return nil
}
