package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
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
	// EdgeCopies and EdgeCopyIdle bound the publishers' edge sets a
	// receiving node keeps (EdgeCopies): how many, and how long unused.
	EdgeCopies   int
	EdgeCopyIdle time.Duration
	Clock        Clock
}

// DefaultConfig returns the seed's numbers.
func DefaultConfig() Config {
	return Config{
		FanOut:       FanOutNode,
		Inbox:        DefaultInbox,
		InlineLimit:  DefaultInlineLimit,
		RetryBase:    DefaultRetryBase,
		MaxAttempts:  DefaultMaxAttempts,
		BatchEvents:  DefaultBatchEvents,
		BatchBytes:   DefaultBatchBytes,
		EdgeCopies:   DefaultEdgeCopies,
		EdgeCopyIdle: DefaultEdgeCopyIdle,
		Clock:        RealClock,
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Inbox < 1 {
		errs = append(errs, errors.New("inbox must hold at least 1 item"))
	}
	if c.InlineLimit < 0 || c.RetryBase <= 0 || c.MaxAttempts < 1 || c.BatchEvents < 1 || c.BatchBytes < 1 || c.EdgeCopies < 1 || c.EdgeCopyIdle <= 0 {
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

// MaxBackoff is the longest wait: the one before the last attempt (32 s
// with the defaults). A follower that cannot be located backs off up to
// it and stays there.
func (c Config) MaxBackoff() time.Duration {
	return max(c.Backoff(c.MaxAttempts-1), c.RetryBase)
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

// ConnBatch is what a node holding connections gets for one pump round:
// the due events once, in publish order, and the node's connection edges.
// The edges travel in one of two forms. Unversioned (Set zero), Edges is
// every edge on the node: the local node's batches and the baselines'.
// Versioned, the receiving node keeps the publisher's edge set for its
// sockets (EdgeCopies) and the batch names the set's version: Edges is the
// whole set when Set.Base is 0, else the edges added or changed since the
// version Base, and Removed the ids removed since; a steady set costs a
// few bytes per batch however many watchers the node has.
type ConnBatch struct {
	Publisher string      `json:"publisher"`
	Events    []abi.Event `json:"events"`
	Edges     []ConnEdge  `json:"edges"`
	Removed   []int64     `json:"removed,omitempty"`
	// Cursor is a seq every edge of the node has done: an edge's cursor is
	// the larger of its own (as last sent) and this. The connection
	// cursors move together (store.Tx.AdvanceConnections), so one value
	// carries them all.
	Cursor uint64     `json:"cursor,omitempty"`
	Set    SetVersion `json:"set,omitzero"`
}

// SetVersion names a version of a publisher's connection edge set on one
// node. Versions are numbered by the publisher's home within a session
// (a random nonce per ConnSets: a new home, or the publisher active again,
// starts a new one) and acknowledged under the receiving node's epoch (a
// random nonce per EdgeCopies: a restarted node has a new one), so
// neither side mistakes an old version for a current one.
type SetVersion struct {
	// Epoch is the receiving node's epoch the sender last heard (0: none).
	Epoch   uint64 `json:"epoch,omitempty"`
	Session uint64 `json:"session,omitempty"`
	// Base is the version Edges and Removed change; 0: Edges is the
	// whole set.
	Base uint64 `json:"base,omitempty"`
	// Version is the set's version once the batch is applied; 0: the
	// batch is unversioned.
	Version uint64 `json:"version,omitempty"`
}

// ConnResult is the receiving node's report.
type ConnResult struct {
	// Refused are connections whose inbox was full: the publisher prunes
	// every edge they hold.
	Refused []string `json:"refused,omitempty"`
	// Gone are connections the node no longer has.
	Gone []string `json:"gone,omitempty"`
	// Epoch is the receiving node's EdgeCopies epoch: a versioned set it
	// acknowledges is held under it.
	Epoch uint64 `json:"epoch,omitempty"`
	// Unknown: the node does not hold the batch's base version (it
	// restarted, evicted the set or missed a change) and sliced nothing;
	// the sender sends the whole set.
	Unknown bool `json:"unknown,omitempty"`
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

// RangeQuery is the log read that materializes a ranged delivery: the
// events of its topic matching its filter in its range, which the copy
// read must hold.
func (d *ObjectDelivery) RangeQuery() store.Query {
	q := store.Query{Topic: d.Topic, Match: MustFilter(d.Filter).MatchFunc()}
	if d.Range != nil {
		q.After, q.Through = d.Range.After, d.Range.Through
	}
	if q.Through <= q.After {
		// No range, or an empty one, reads nothing (Through 0 would read
		// without an upper bound): no seq is above this.
		q.After, q.Through = math.MaxInt64, 0
	}
	return q
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
//
// Object's error wraps ErrUnplaced when the delivery did not reach the
// follower because of where it is, not because of what it did: the node
// asked is not its home, is gone or stopping, or the follower is being
// taken over. Such a failure backs off like a follower that cannot be
// located and is not counted toward the drop (D20); any other failure is.
//
// Connections' error wraps ErrUnversioned when the node could not read a
// versioned batch: it runs an earlier version, which takes only whole,
// unversioned ones.
type Transport interface {
	Connections(ctx context.Context, node string, b *ConnBatch) (ConnResult, error)
	Object(ctx context.Context, node string, d *ObjectDelivery) (ObjectResult, error)
}

// ErrUnplaced marks a delivery failure of placement: see Transport.
var ErrUnplaced = errors.New("follower not placed")

// ErrUnversioned marks a connection batch the node could not read because
// it was versioned: see Transport.
var ErrUnversioned = errors.New("node takes only unversioned connection batches")

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
	Between(ctx context.Context, f func(*store.Tx) error) error
	// Go runs f on a goroutine its owner waits for at shutdown, keeping the
	// publisher available until f returns; ctx ends when the owner stops.
	// It reports false, and f does not run, when the owner is stopping.
	Go(f func(ctx context.Context)) bool
	// Wake asks for a round at t (a follower's lane ended in a backoff).
	Wake(t time.Time)
	// ConnSets is the publisher's memory of the connection edge sets its
	// nodes hold: the same for as long as it is active here.
	ConnSets() *ConnSets
}

// Observer counts what the pump does.
type Observer interface {
	// ConnBatchSent is called for each connection batch sent, again for
	// one sent again whole to a node that answered Unknown.
	ConnBatchSent(node string, local bool, b *ConnBatch)
	ObjectDeliverySent(node string, local bool, events int, ranged bool)
	Pruned(reason string, edges int)
	Retried()
	Dropped(publisher string, e store.Edge, lastErr string)
}

// Pump delivers publishers' events, between their calls, in two kinds of
// lane. A publisher's round is its connection lane: it reads the events its
// connection edges are owed, sends one batch per node and records them, and
// waits for nothing else. Each object follower of a publisher has a lane of
// its own, started by a round and not waited for: it reads, delivers and
// records in its own short transactions, one delivery at a time, so a slow
// follower delays only itself and sees the publisher's events in publish
// order across all its edges.
type Pump struct {
	cfg       Config
	transport Transport
	fanout    fanOut
	members   Membership
	obs       Observer
	log       *slog.Logger

	// mu guards lanes: the object followers with a lane running, at most
	// one per (publisher, follower), and waiting: the publishers that have
	// edges of an unplaced follower, by follower. Never held while calling
	// out.
	mu      sync.Mutex
	lanes   map[laneKey]*lane
	waiting map[string]map[string]bool
}

type laneKey struct{ publisher, follower string }

// lane is a running follower lane. again is set (under Pump.mu) by a round
// that found the follower due while the lane ran: the lane reads once more
// before it ends, so no publish is missed.
type lane struct{ again bool }

// NewPump returns a pump.
func NewPump(cfg Config, t Transport, m Membership, obs Observer, log *slog.Logger) *Pump {
	return &Pump{
		cfg: cfg, transport: t, fanout: newFanOut(cfg.FanOut, t, obs, log, m.Self), members: m, obs: obs, log: log,
		lanes: map[laneKey]*lane{}, waiting: map[string]map[string]bool{},
	}
}

// Placed reports that follower is served again (its new home took it
// over) and returns the publishers whose lanes found it unplaced: the
// caller makes their edges of it due now (store.Tx.DueNow) and runs them,
// instead of waiting out their backoff.
func (p *Pump) Placed(follower string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	pubs := make([]string, 0, len(p.waiting[follower]))
	for pub := range p.waiting[follower] {
		pubs = append(pubs, pub)
	}
	delete(p.waiting, follower)
	return pubs
}

// Config returns the pump's configuration.
func (p *Pump) Config() Config { return p.cfg }

// Lanes reports how many follower lanes are running.
func (p *Pump) Lanes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lanes)
}

// followerDue is a follower's delivery state as a round sees it.
type followerDue struct {
	behind bool  // some edge has events to get
	due    int64 // Unix ns: its edges share the latest next_due
}

// Round runs one round of the publisher's connection lane: it reads the
// connection edges behind the head and the events they are owed, sends one
// batch per node and records the outcome. It starts the lane of every
// object follower that is due and has none running. It reports whether
// work was done (run again) and the next time a follower not running is
// due (zero if none).
func (p *Pump) Round(ctx context.Context, pub Publisher) (bool, time.Time, error) {
	now := p.cfg.Clock.Now()
	r, err := p.read(ctx, pub)
	if err != nil {
		return false, time.Time{}, err
	}
	if r.pruned {
		return true, time.Time{}, nil
	}
	next := p.startLanes(pub, r.followers, now)
	if len(r.nodes) == 0 || len(r.events) == 0 {
		return false, next, nil
	}
	return true, next, p.connectionRound(ctx, pub, r.nodes, r.events)
}

// roundRead is what a round's read found.
type roundRead struct {
	nodes     []nodeDue   // the nodes with connection edges behind the head
	events    []abi.Event // one batch of the log from their lowest cursor
	followers map[string]followerDue
	// pruned: the edges of connections on gone nodes were removed
	// instead, and nothing else was read.
	pruned bool
}

// read is a round's one transaction: it prunes the connections whose node
// is gone (due or not) and reads nothing more if there were any; else it
// finds the nodes whose connection edges are behind the head and the
// object followers' state, and reads the events the connection edges are
// owed.
func (p *Pump) read(ctx context.Context, pub Publisher) (roundRead, error) {
	var r roundRead
	err := pub.Between(ctx, func(tx *store.Tx) error {
		head, err := tx.Head()
		if err != nil {
			return err
		}
		all, err := tx.CachedEdges()
		if err != nil {
			return err
		}
		nodes := pub.ConnSets().nodesFor(tx.EdgesGeneration(), all)
		if r.pruned, err = p.pruneGoneNodes(tx, nodes); r.pruned || err != nil {
			return err
		}
		r.followers = objectFollowers(all, head)
		after := uint64(math.MaxUint64)
		for _, ne := range nodes {
			if d := ne.due(all); d.after < head {
				r.nodes = append(r.nodes, d)
				after = min(after, d.after)
			}
		}
		if len(r.nodes) == 0 {
			return nil
		}
		r.events, err = tx.Read(store.Query{After: after, Limit: p.cfg.BatchEvents, MaxBytes: p.cfg.BatchBytes})
		return err
	})
	return r, err
}

// pruneGoneNodes removes every edge of a connection whose node is gone:
// the connection is gone too. It reports whether there were any.
func (p *Pump) pruneGoneNodes(tx *store.Tx, nodes []*nodeEdges) (bool, error) {
	var dead []string
	for _, ne := range nodes {
		if !p.members.Live(ne.node) {
			dead = append(dead, conns(ne.set)...)
		}
	}
	if len(dead) == 0 {
		return false, nil
	}
	pruned := 0
	for _, c := range dedupe(dead) {
		n, err := tx.RemoveFollower(abi.FollowerConnection, c)
		if err != nil {
			return true, err
		}
		pruned += n
	}
	p.obs.Pruned("node_gone", pruned)
	return true, nil
}

func conns(set *edgeSet) []string {
	out := make([]string, len(set.edges))
	for i, e := range set.edges {
		out[i] = e.Conn
	}
	return out
}

// objectFollowers returns, by follower, the delivery state of the object
// followers.
func objectFollowers(all []store.Edge, head uint64) map[string]followerDue {
	var followers map[string]followerDue
	for _, e := range all {
		if e.Kind != abi.FollowerObject {
			continue
		}
		if followers == nil {
			followers = map[string]followerDue{}
		}
		f := followers[e.Follower]
		f.behind = f.behind || e.Cursor < head
		f.due = max(f.due, e.NextDue)
		followers[e.Follower] = f
	}
	return followers
}

// startLanes starts the lane of each follower due at now that has none
// running, and tells one running to look again. It returns the earliest
// time a follower without a lane is due later.
func (p *Pump) startLanes(pub Publisher, followers map[string]followerDue, now time.Time) time.Time {
	var next int64
	for f, st := range followers {
		if !st.behind {
			continue
		}
		k := laneKey{pub.ID(), f}
		p.mu.Lock()
		if l := p.lanes[k]; l != nil {
			l.again = true
			p.mu.Unlock()
			continue
		}
		if st.due > now.UnixNano() {
			p.mu.Unlock()
			if next == 0 || st.due < next {
				next = st.due
			}
			continue
		}
		l := &lane{}
		p.lanes[k] = l
		p.mu.Unlock()
		if !pub.Go(func(ctx context.Context) { p.runLane(ctx, pub, k, l) }) {
			p.mu.Lock()
			delete(p.lanes, k)
			p.mu.Unlock()
		}
	}
	if next == 0 {
		return time.Time{}
	}
	return time.Unix(0, next)
}

// connectionRound sends the events to every connection edge, one batch per
// node (or as the fan-out baseline does), and records that they advanced.
// A connection whose node went since the read is gone too: it is pruned
// instead.
func (p *Pump) connectionRound(ctx context.Context, pub Publisher, due []nodeDue, events []abi.Event) error {
	r := &connRound{pub: pub.ID(), sets: pub.ConnSets(), events: events, nodes: due[:0:0]}
	var prune []string
	for _, d := range due {
		if p.members.Live(d.node) {
			r.nodes = append(r.nodes, d)
		} else {
			prune = append(prune, conns(d.set)...)
		}
	}
	prune = append(prune, p.fanout.send(ctx, r)...)
	return p.record(ctx, pub, prune, events[len(events)-1].Seq)
}

// record prunes every edge of the connections in prune and advances every
// connection edge to through, in one transaction that runs even if ctx
// has ended: the sends are done.
func (p *Pump) record(ctx context.Context, pub Publisher, prune []string, through uint64) error {
	return pub.Between(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		pruned := 0
		for _, c := range dedupe(prune) {
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
		return tx.AdvanceConnections(through)
	})
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

// runLane runs a follower's lane until nothing is due for it now, then
// asks for a round when its backoff ends.
func (p *Pump) runLane(ctx context.Context, pub Publisher, k laneKey, l *lane) {
	for {
		more, next, err := p.laneStep(ctx, pub, k.follower)
		if err != nil && ctx.Err() == nil {
			p.log.Warn("follower delivery failed", slog.String("publisher", k.publisher), slog.String("follower", k.follower), slog.Any("err", err))
			next = p.cfg.Clock.Now().Add(p.cfg.RetryBase)
		}
		p.mu.Lock()
		if ctx.Err() == nil && (more || l.again) {
			l.again = false
			p.mu.Unlock()
			continue
		}
		delete(p.lanes, k)
		p.mu.Unlock()
		if !next.IsZero() && ctx.Err() == nil {
			pub.Wake(next)
		}
		return
	}
}

// segment is a run of consecutive events (in publish order) owed to one
// edge of a follower: one delivery.
type segment struct {
	edge    int // index into the follower's edges
	events  []abi.Event
	size    int
	through uint64 // the edge's cursor once delivered
}

// edgeOutcome is what a lane step records for one edge.
type edgeOutcome struct {
	cursor   uint64
	attempts int
	nextDue  time.Time
	node     string // a rehomed follower's node
	drop     bool
	lastErr  string
}

// laneStep reads the events owed to one follower across its edges,
// delivers them in publish order, one segment at a time, stopping at the
// first failure, and records the outcome. A failure holds back every edge
// of the follower (one backoff); a follower that cannot be located backs
// off the same way without counting an attempt. It reports whether more
// may be due now, and when the follower is next due if it backs off.
func (p *Pump) laneStep(ctx context.Context, pub Publisher, follower string) (bool, time.Time, error) {
	now := p.cfg.Clock.Now()
	var edges []store.Edge
	var events []abi.Event
	var head uint64
	var next time.Time
	err := pub.Between(ctx, func(tx *store.Tx) error {
		var err error
		if head, err = tx.Head(); err != nil {
			return err
		}
		all, err := tx.CachedEdges()
		if err != nil {
			return err
		}
		behind := false
		var due int64
		for _, e := range all {
			if e.Kind == abi.FollowerObject && e.Follower == follower {
				edges = append(edges, e)
				behind = behind || e.Cursor < head
				due = max(due, e.NextDue)
			}
		}
		if !behind {
			edges = nil
			return nil
		}
		if due > now.UnixNano() {
			next, edges = time.Unix(0, due), nil
			return nil
		}
		after := edges[0].Cursor
		for _, e := range edges {
			after = min(after, e.Cursor)
		}
		events, err = tx.Read(store.Query{After: after, Limit: p.cfg.BatchEvents, MaxBytes: p.cfg.BatchBytes})
		return err
	})
	if err != nil || len(edges) == 0 || len(events) == 0 {
		return false, next, err
	}
	through := events[len(events)-1].Seq

	// Route: an edge's recorded node if it is live, else wherever the
	// follower lives now (not a failure: D20).
	nodes := make([]string, len(edges))
	var located string
	var locErr error
	looked := false
	for i, e := range edges {
		// An edge whose last delivery found the follower unplaced asks
		// where it lives now: its node may be live but no longer its home.
		if e.Unplaced == 0 && p.members.Live(e.Node) {
			nodes[i] = e.Node
			continue
		}
		if !looked {
			located, locErr = p.members.Locate(ctx, follower)
			looked = true
		}
		nodes[i] = located
	}
	if locErr != nil {
		if ctx.Err() != nil {
			return false, time.Time{}, nil
		}
		return p.unplaced(ctx, pub, follower, edges, now, locErr)
	}

	segs := p.segments(pub.ID(), edges, events, through)
	out := make([]edgeOutcome, len(edges))
	for i, e := range edges {
		out[i] = edgeOutcome{cursor: e.Cursor, attempts: e.Attempts}
		if nodes[i] != e.Node {
			out[i].node = nodes[i]
		}
	}
	delivered := make([]bool, len(edges)) // every segment of the edge went
	for i := range delivered {
		delivered[i] = true
	}
	for _, s := range segs {
		delivered[s.edge] = false
	}
	failed := -1
	var failErr error
	self := p.members.Self()
	for k, s := range segs {
		e, o := edges[s.edge], &out[s.edge]
		d := &ObjectDelivery{Publisher: pub.ID(), Follower: follower, Topic: e.Topic, Filter: e.Filter, Events: s.events, Through: s.through}
		if s.size > p.cfg.InlineLimit {
			d.Events = nil
			d.Range = &Range{After: o.cursor, Through: s.through}
		}
		p.obs.ObjectDeliverySent(nodes[s.edge], nodes[s.edge] == self, len(d.Events), d.Range != nil)
		res, err := p.transport.Object(ctx, nodes[s.edge], d)
		o.cursor = max(res.Done, o.cursor)
		if err == nil && res.Err == "" {
			o.cursor, o.attempts = max(o.cursor, s.through), 0
			if lastOf(segs, k) {
				delivered[s.edge] = true
			}
			continue
		}
		if ctx.Err() != nil {
			// Stopping: not a failure of the follower. What went is
			// recorded; the rest goes after the restart.
			break
		}
		failed, failErr = s.edge, err
		o.lastErr = res.Err
		if err != nil {
			o.lastErr = err.Error()
		}
		break
	}
	for i := range out {
		if delivered[i] {
			// Nothing more in this batch is owed to it.
			out[i].cursor = max(out[i].cursor, through)
		}
	}
	more := through < head
	unplaced := 0 // the follower's unplaced streak, if this step found it so
	if failed >= 0 && errors.Is(failErr, ErrUnplaced) {
		// Not the follower's failure: back off as for one that cannot be
		// located, keeping what went and every edge's attempts.
		unplaced, next = p.notPlaced(pub, follower, edges, now, failErr)
		more = false
		for i := range out {
			out[i].nextDue = next
		}
	} else if failed >= 0 {
		o := &out[failed]
		o.attempts++
		if o.attempts >= p.cfg.MaxAttempts {
			o.drop = true
			more = true // the follower's other edges go on now
		} else {
			p.obs.Retried()
			next = p.cfg.Clock.Now().Add(p.cfg.Backoff(o.attempts))
			more = false
			for i := range out {
				out[i].nextDue = next // one backoff for every edge of the follower
			}
		}
	}
	err = pub.Between(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		for i, e := range edges {
			o := out[i]
			if o.drop {
				if _, err := tx.RemoveEdgeID(e.ID); err != nil {
					return err
				}
				p.obs.Dropped(pub.ID(), e, o.lastErr)
				continue
			}
			if err := tx.AdvanceEdge(e.ID, o.cursor, o.attempts, unplaced, o.nextDue, o.node); err != nil {
				return err
			}
		}
		return nil
	})
	return more && ctx.Err() == nil, next, err
}

// lastOf reports whether segs[k] is its edge's last segment.
func lastOf(segs []segment, k int) bool {
	for _, s := range segs[k+1:] {
		if s.edge == segs[k].edge {
			return false
		}
	}
	return true
}

// segments splits the events owed to a follower's edges into deliveries in
// publish order: a run of consecutive owed events of one edge is one
// delivery, so a follower with one edge (or edges whose events do not
// interleave) gets one delivery per edge. A segment's through is the seq
// before its edge's next segment, or the batch's last.
func (p *Pump) segments(pub string, edges []store.Edge, events []abi.Event, through uint64) []segment {
	filters := make([]Filter, len(edges))
	for i, e := range edges {
		filters[i] = MustFilter(e.Filter)
	}
	var segs []segment
	for _, ev := range events {
		ev.Publisher = pub
		for i, e := range edges {
			if ev.Seq <= e.Cursor || !TopicMatch(e.Topic, ev.Topic) || !filters[i].Match(ev.Payload) {
				continue
			}
			if n := len(segs); n > 0 && segs[n-1].edge == i {
				segs[n-1].events = append(segs[n-1].events, ev)
				segs[n-1].size += len(ev.Payload)
				continue
			}
			segs = append(segs, segment{edge: i, events: []abi.Event{ev}, size: len(ev.Payload)})
		}
	}
	nextStart := make([]uint64, len(edges))
	for i := range nextStart {
		nextStart[i] = through + 1
	}
	for k := len(segs) - 1; k >= 0; k-- {
		s := &segs[k]
		s.through = nextStart[s.edge] - 1
		nextStart[s.edge] = s.events[0].Seq
	}
	return segs
}

// notPlaced is the back-off of a follower found unplaced: its streak one
// longer than its edges', the next attempt 500 ms doubling up to the last
// failure's wait, and the publisher recorded as waiting for Placed.
func (p *Pump) notPlaced(pub Publisher, follower string, edges []store.Edge, now time.Time, cause error) (int, time.Time) {
	streak := 0
	for _, e := range edges {
		streak = max(streak, e.Unplaced)
	}
	streak++
	next := now.Add(min(p.cfg.Backoff(streak), p.cfg.MaxBackoff()))
	p.log.Debug("follower not placed", slog.String("publisher", pub.ID()), slog.String("follower", follower), slog.Int("streak", streak), slog.Time("next", next), slog.Any("err", cause))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiting[follower] == nil {
		p.waiting[follower] = map[string]bool{}
	}
	p.waiting[follower][pub.ID()] = true
	return streak, next
}

// unplaced records that the follower could not be located: every edge of
// it backs off, 500 ms doubling up to the last failure's wait, without
// counting an attempt, so it is never dropped for it (D20).
func (p *Pump) unplaced(ctx context.Context, pub Publisher, follower string, edges []store.Edge, now time.Time, cause error) (bool, time.Time, error) {
	streak, next := p.notPlaced(pub, follower, edges, now, cause)
	err := pub.Between(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		for _, e := range edges {
			if err := tx.AdvanceEdge(e.ID, e.Cursor, e.Attempts, streak, next, ""); err != nil {
				return err
			}
		}
		return nil
	})
	return false, next, err
}
