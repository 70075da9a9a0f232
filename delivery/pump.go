package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/durable-host/host/abi"
)

// Defaults from seed 000.
const (
	// DefaultInbox is a connection's inbox: 256 items.
	DefaultInbox = 256
	// DefaultInlineLimit: events ride inline in a durable delivery up to
	// 32 KB, else the delivery carries the range and the filter.
	DefaultInlineLimit = 32 << 10
	// DefaultRetryBase is the first backoff of a failed durable delivery;
	// it doubles after each further failure.
	DefaultRetryBase = 500 * time.Millisecond
	// DefaultMaxAttempts: after 8 failed attempts (the last wait 32 s) the
	// edge is dropped.
	DefaultMaxAttempts = 8
	// DefaultBatchEvents and DefaultBatchBytes bound one pump round's read
	// of the log; a round's call to a node stays under NATS's 1 MiB.
	DefaultBatchEvents = 512
	DefaultBatchBytes  = 512 << 10
)

// Clock is the pump's time source; tests inject one to run the 32 s backoff
// without waiting.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d and returns a function that cancels it.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// FanOut says how connection edges cross to their nodes.
type FanOut string

// Fan-out modes. Only FanOutNode is the product; the others are the
// baselines the benchmarks compare it with.
const (
	// FanOutNode: one call per node carrying the events once (seed 000).
	FanOutNode FanOut = "node"
	// FanOutSocket is the naive baseline: one send per watcher.
	FanOutSocket FanOut = "socket"
	// FanOutSubject is the baseline users would build on NATS alone: each
	// event is published once on a subject per topic, every node with
	// watchers subscribes, and NATS fans out.
	FanOutSubject FanOut = "subject"
)

// TopicPublisher is what a Transport offers for FanOutSubject.
type TopicPublisher interface {
	PublishTopic(ctx context.Context, publisher string, events []abi.Event) error
}

// Config configures delivery. Start from DefaultConfig.
type Config struct {
	// FanOut selects how connection batches cross to nodes; FanOutNode
	// unless benchmarking a baseline.
	FanOut      FanOut
	Inbox       int
	InlineLimit int
	RetryBase   time.Duration
	MaxAttempts int
	BatchEvents int
	BatchBytes  int
	Clock       Clock
}

// DefaultConfig returns the seed's numbers.
func DefaultConfig() Config {
	return Config{
		FanOut:      FanOutNode,
		Inbox:       DefaultInbox,
		InlineLimit: DefaultInlineLimit,
		RetryBase:   DefaultRetryBase,
		MaxAttempts: DefaultMaxAttempts,
		BatchEvents: DefaultBatchEvents,
		BatchBytes:  DefaultBatchBytes,
		Clock:       RealClock,
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Inbox < 1 {
		errs = append(errs, errors.New("inbox must hold at least 1 item"))
	}
	if c.InlineLimit < 0 || c.RetryBase <= 0 || c.MaxAttempts < 1 || c.BatchEvents < 1 || c.BatchBytes < 1 {
		errs = append(errs, errors.New("delivery limits must be positive"))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("delivery needs a clock"))
	}
	switch c.FanOut {
	case FanOutNode, FanOutSocket, FanOutSubject:
	default:
		errs = append(errs, fmt.Errorf("fan-out %q: use node, socket or subject", c.FanOut))
	}
	return errors.Join(errs...)
}

// Backoff returns the wait after the n-th consecutive failure (n >= 1):
// base, doubling: 0.5, 1, 2, 4, 8, 16, 32 s with the defaults.
func (c Config) Backoff(n int) time.Duration {
	if n < 1 {
		return 0
	}
	return c.RetryBase << min(n-1, 30)
}

// TopicMatch reports whether an edge on topic admits an event on
// eventTopic: an edge on "" follows every topic of its publisher.
func TopicMatch(topic, eventTopic string) bool { return topic == "" || topic == eventTopic }

// ConnEdge is one connection edge in a batch to its node.
type ConnEdge struct {
	Edge   int64  `json:"edge"`
	Conn   string `json:"conn"`
	Topic  string `json:"topic"`
	Cursor uint64 `json:"cursor"`
	Filter string `json:"filter,omitempty"`
}

// ConnBatch is what a node holding connections gets for one pump round: the
// due events once, in publish order, beside every edge on that node.
type ConnBatch struct {
	Publisher string      `json:"publisher"`
	Events    []abi.Event `json:"events"`
	Edges     []ConnEdge  `json:"edges"`
}

// ConnResult is the receiving node's report.
type ConnResult struct {
	// Refused are connections whose inbox was full: the publisher prunes
	// every edge they hold.
	Refused []string `json:"refused,omitempty"`
	// Gone are connections the node no longer has.
	Gone []string `json:"gone,omitempty"`
}

// ObjectDelivery is one delivery down one object edge: its events inline, or
// (past the inline limit) only the range and the filter.
type ObjectDelivery struct {
	Publisher string      `json:"publisher"`
	Follower  string      `json:"follower"`
	Topic     string      `json:"topic"`
	Filter    string      `json:"filter,omitempty"`
	Events    []abi.Event `json:"events,omitempty"`
	// Range, when set, replaces Events: the events of Topic matching
	// Filter with seq in (After, Through].
	Range *Range `json:"range,omitempty"`
	// Through is the last seq this delivery covers.
	Through uint64 `json:"through"`
}

// Range is a sequence range (After, Through] of the publisher's log.
type Range struct {
	After   uint64 `json:"after"`
	Through uint64 `json:"through"`
}

// ObjectResult is the follower's report.
type ObjectResult struct {
	// Done is the last seq handled (committed, or skipped as already
	// committed, or not matching): the edge's new cursor.
	Done uint64 `json:"done"`
	// Err is set when a handler failed: a failed attempt.
	Err string `json:"error,omitempty"`
}

// Transport carries deliveries to a node: directly for the local node, over
// NATS for the others.
type Transport interface {
	Connections(ctx context.Context, node string, b *ConnBatch) (ConnResult, error)
	Object(ctx context.Context, node string, d *ObjectDelivery) (ObjectResult, error)
}

// Membership answers which nodes exist and where objects live.
type Membership interface {
	Self() string
	// Live reports whether node exists; node ids never return.
	Live(node string) bool
	// Locate returns the node an object lives on now (activating it there
	// if needed).
	Locate(ctx context.Context, object string) (string, error)
}

// Publisher is the pump's view of a publisher object.
type Publisher interface {
	ID() string
	// Between runs f on the publisher's file between its handler calls.
	Between(ctx context.Context, f func(*Tx) error) error
}

// Observer counts what the pump does.
type Observer interface {
	ConnBatchSent(node string, local bool, events, edges int)
	ObjectDeliverySent(node string, local bool, events int, ranged bool)
	Pruned(reason string, edges int)
	Retried()
	Dropped(publisher string, e Edge, lastErr string)
}

// Pump is a publisher's delivery loop, run between the publisher's calls.
type Pump struct {
	cfg       Config
	transport Transport
	members   Membership
	obs       Observer
	log       *slog.Logger
}

// NewPump returns a pump.
func NewPump(cfg Config, t Transport, m Membership, obs Observer, log *slog.Logger) *Pump {
	return &Pump{cfg: cfg, transport: t, members: m, obs: obs, log: log}
}

// Config returns the pump's configuration.
func (p *Pump) Config() Config { return p.cfg }

type edgeUpdate struct {
	edge     Edge
	cursor   uint64
	attempts int
	nextDue  time.Time
	drop     bool
	lastErr  string
	node     string // a rehomed follower's node
}

// Round runs one round: reads due edges and the events they are owed,
// delivers them partitioned by the follower's node, and records the
// outcome. It reports whether work was done (run again) and, when nothing
// is due now, the next due time (zero if none).
func (p *Pump) Round(ctx context.Context, pub Publisher) (bool, time.Time, error) {
	var due []Edge
	var events []abi.Event
	var next time.Time
	now := p.cfg.Clock.Now()
	var deadConns []string
	err := pub.Between(ctx, func(tx *Tx) error {
		head, err := tx.Head()
		if err != nil {
			return err
		}
		// A connection whose node is gone is gone too, due or not.
		all, err := tx.cachedEdges()
		if err != nil {
			return err
		}
		for _, e := range all {
			if e.Kind == abi.FollowerConnection && !p.members.Live(e.Node) {
				deadConns = append(deadConns, e.Follower)
			}
		}
		if len(deadConns) > 0 {
			pruned := 0
			for _, c := range dedupe(deadConns) {
				n, err := tx.RemoveFollower(abi.FollowerConnection, c)
				if err != nil {
					return err
				}
				pruned += n
			}
			p.obs.Pruned("node_gone", pruned)
			return nil
		}
		if due, err = tx.DueEdges(head, now); err != nil {
			return err
		}
		if len(due) == 0 {
			t, ok, err := tx.NextDue(head)
			if ok && t.After(now) {
				next = t
			}
			return err
		}
		after := due[0].Cursor
		for _, e := range due {
			after = min(after, e.Cursor)
		}
		events, err = tx.Events(after, p.cfg.BatchEvents, p.cfg.BatchBytes)
		return err
	})
	if len(deadConns) > 0 && err == nil {
		return true, time.Time{}, nil
	}
	if err != nil || len(due) == 0 {
		return false, next, err
	}
	if len(events) == 0 {
		return false, time.Time{}, nil
	}
	through := events[len(events)-1].Seq

	// Partition due edges by the follower's node.
	type group struct {
		conns   []Edge
		objects []Edge
	}
	groups := map[string]*group{}
	var updates []edgeUpdate
	var prunedConns []string
	route := make([]string, len(due)) // each due edge's node; "" = settled here
	conns := map[string]int{}         // node → due connection edges
	for i, e := range due {
		node := e.Node
		if !p.members.Live(node) {
			if e.Kind == abi.FollowerConnection {
				// A connection's node is gone for good: so is it.
				prunedConns = append(prunedConns, e.Follower)
				continue
			}
			// An object follower moved: route its identity to its new
			// home. Not a failure.
			moved, err := p.members.Locate(ctx, e.Follower)
			if err != nil {
				// Not a failed attempt: look again after the first
				// backoff, without counting.
				p.log.Debug("follower not placed yet", slog.String("follower", e.Follower), slog.Any("err", err))
				updates = append(updates, edgeUpdate{edge: e, cursor: e.Cursor, attempts: e.Attempts, nextDue: now.Add(p.cfg.RetryBase)})
				continue
			}
			node = moved
		}
		route[i] = node
		if e.Kind == abi.FollowerConnection {
			conns[node]++
		}
	}
	// Sized once: at thousands of sockets, growing these slices was most
	// of a round's garbage.
	for i, e := range due {
		node := route[i]
		if node == "" {
			continue
		}
		g := groups[node]
		if g == nil {
			g = &group{conns: make([]Edge, 0, conns[node])}
			groups[node] = g
		}
		if e.Kind == abi.FollowerConnection {
			g.conns = append(g.conns, e)
		} else {
			g.objects = append(g.objects, e)
		}
	}

	var mu sync.Mutex // guards updates and prunedConns
	var wg sync.WaitGroup
	self := p.members.Self()
	if tp, ok := p.transport.(TopicPublisher); ok && p.cfg.FanOut == FanOutSubject {
		// Baseline: publish each event once on its topic's subject; NATS
		// fans out to every subscribed node. Refusals are not reported.
		var all []Edge
		for _, g := range groups {
			all = append(all, g.conns...)
			g.conns = nil
		}
		if len(all) > 0 {
			if err := tp.PublishTopic(ctx, pub.ID(), events); err != nil {
				p.log.Warn("topic publish failed", slog.Any("err", err))
			}
		}
	}
	for node, g := range groups {
		local := node == self
		if len(g.conns) > 0 && p.cfg.FanOut == FanOutSocket {
			// Baseline: one send per watcher.
			for _, e := range g.conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					gone := p.connections(ctx, node, local, []Edge{e}, events, pub.ID())
					mu.Lock()
					prunedConns = append(prunedConns, gone...)
					mu.Unlock()
				}()
			}
			g.conns = nil
		}
		if len(g.conns) > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gone := p.connections(ctx, node, local, g.conns, events, pub.ID())
				mu.Lock()
				prunedConns = append(prunedConns, gone...)
				mu.Unlock()
			}()
		}
		for _, e := range g.objects {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u := p.object(ctx, node, local, e, events, through, pub.ID())
				mu.Lock()
				updates = append(updates, u)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()

	err = pub.Between(context.WithoutCancel(ctx), func(tx *Tx) error {
		pruned := 0
		for _, c := range dedupe(prunedConns) {
			n, err := tx.RemoveFollower(abi.FollowerConnection, c)
			if err != nil {
				return err
			}
			pruned += n
		}
		if pruned > 0 {
			p.obs.Pruned("connection", pruned)
		}
		// Connection edges advance whether or not their pushes landed,
		// all of them to through: one row records it.
		if len(conns) > 0 {
			if err := tx.AdvanceConnections(through); err != nil {
				return err
			}
		}
		for _, u := range updates {
			if u.drop {
				if _, err := tx.RemoveEdgeID(u.edge.ID); err != nil {
					return err
				}
				p.obs.Dropped(pub.ID(), u.edge, u.lastErr)
				continue
			}
			if err := tx.AdvanceEdge(u.edge.ID, u.cursor, u.attempts, u.nextDue, u.node); err != nil {
				return err
			}
		}
		return nil
	})
	return true, time.Time{}, err
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// connections sends one batch to node carrying the events once beside
// every connection edge there. It returns the connections to prune. Every
// edge advances (at-most-once: a push that did not land is not retried).
func (p *Pump) connections(ctx context.Context, node string, local bool, edges []Edge, events []abi.Event, pub string) []string {
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
	p.obs.ConnBatchSent(node, local, len(b.Events), len(b.Edges))
	res, err := p.transport.Connections(ctx, node, b)
	if err != nil {
		// At-most-once: a batch that did not land is not retried.
		p.log.Warn("connection batch failed", slog.String("node", node), slog.Any("err", err))
		return nil
	}
	return append(res.Refused, res.Gone...)
}

// object makes one delivery down one object edge.
func (p *Pump) object(ctx context.Context, node string, local bool, e Edge, events []abi.Event, through uint64, pub string) edgeUpdate {
	u := edgeUpdate{edge: e, cursor: e.Cursor, attempts: e.Attempts}
	if node != e.Node {
		u.node = node
	}
	if through <= e.Cursor {
		return u
	}
	f := MustFilter(e.Filter)
	d := &ObjectDelivery{Publisher: pub, Follower: e.Follower, Topic: e.Topic, Filter: e.Filter, Through: through}
	size := 0
	for _, ev := range events {
		if ev.Seq > e.Cursor && TopicMatch(e.Topic, ev.Topic) && f.Match(ev.Payload) {
			ev.Publisher = pub
			d.Events = append(d.Events, ev)
			size += len(ev.Payload)
		}
	}
	if size > p.cfg.InlineLimit {
		d.Events = nil
		d.Range = &Range{After: e.Cursor, Through: through}
	}
	if d.Range == nil && len(d.Events) == 0 {
		u.cursor = through
		return u
	}
	p.obs.ObjectDeliverySent(node, local, len(d.Events), d.Range != nil)
	res, err := p.transport.Object(ctx, node, d)
	if err == nil && res.Err == "" {
		u.cursor, u.attempts = max(res.Done, e.Cursor), 0
		return u
	}
	msg := res.Err
	if err != nil {
		msg = err.Error()
	}
	u.cursor = max(res.Done, e.Cursor)
	u.attempts = e.Attempts + 1
	u.lastErr = msg
	if u.attempts >= p.cfg.MaxAttempts {
		u.drop = true
		return u
	}
	p.obs.Retried()
	u.nextDue = p.cfg.Clock.Now().Add(p.cfg.Backoff(u.attempts))
	return u
}

// AdvanceEdge records an edge's progress: the cursor only moves forward;
// a non-empty node rehomes the follower.
func (t *Tx) AdvanceEdge(id int64, cursor uint64, attempts int, nextDue time.Time, node string) error {
	var due int64
	if !nextDue.IsZero() {
		due = nextDue.UnixNano()
	}
	var nodeArg any
	if node != "" {
		nodeArg = node
	}
	if _, err := t.f.advance.ExecContext(bg, int64(cursor), attempts, due, nodeArg, id); err != nil {
		return fmt.Errorf("advance edge %d: %w", id, err)
	}
	t.patches = append(t.patches, func(es []Edge) {
		for i := range es {
			if es[i].ID == id {
				es[i].Cursor = max(es[i].Cursor, cursor)
				es[i].Attempts, es[i].NextDue = attempts, due
				if node != "" {
					es[i].Node = node
				}
			}
		}
	})
	return nil
}
