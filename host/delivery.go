package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// followLockWait bounds how long a follow waits for the publisher's lock;
// a follow from inside a handler holds the follower's lock meanwhile, so two
// objects following each other at once must not wait forever.
const followLockWait = 2 * time.Second

// pumpState is an object's pump scheduling: at most one round goroutine
// (its connection lane) per object, re-run when kicked while running. The
// lanes of its object followers run beside it, at most one per follower
// (delivery.Pump keeps that), started through publisher.Go.
type pumpState struct {
	running atomic.Bool
	again   atomic.Bool
	// timer is the pending retry wake-up; guarded by the object's lock.
	stopTimer func() bool
	// sets are the connection edge sets the round sent to each node.
	sets delivery.ConnSets
}

// kick schedules a pump round for the object. It never blocks and never
// runs delivery on the caller's goroutine: a method returns once its
// transaction commits.
func (n *Node) kick(id ObjectID) {
	o, err := n.objects.acquire(id)
	if err != nil {
		return
	}
	o.pump.again.Store(true)
	if !o.pump.running.CompareAndSwap(false, true) {
		n.objects.release(o)
		return
	}
	if !n.goCounted(func() {
		defer n.objects.release(o)
		n.pumpLoop(o)
	}) {
		o.pump.running.Store(false)
		n.objects.release(o)
	}
}

// goCounted runs f on a goroutine counted with the pumps, so Shutdown
// waits for it, and reports true; once the node is stopping it runs
// nothing and reports false.
func (n *Node) goCounted(f func()) bool {
	n.pumpMu.Lock()
	if n.stopping {
		n.pumpMu.Unlock()
		return false
	}
	n.pumps.Add(1)
	n.pumpMu.Unlock()
	go func() {
		defer n.pumps.Done()
		f()
	}()
	return true
}

func (n *Node) pumpLoop(o *object) {
	ctx := context.Background()
	for {
		o.pump.again.Store(false)
		var next time.Time
		for {
			select {
			case <-n.stop:
				o.pump.running.Store(false)
				return
			default:
			}
			more, nx, err := n.pump.Round(ctx, publisher{n, o})
			if err != nil {
				if !errors.Is(err, errDeactivated) && !errors.Is(err, ErrShuttingDown) {
					n.log.Warn("pump round failed", slog.String("publisher", o.id.String()), slog.Any("err", err))
				}
				break
			}
			if !more {
				next = nx
				break
			}
		}
		if !next.IsZero() {
			n.scheduleRetry(o.id, next)
		}
		o.pump.running.Store(false)
		if !o.pump.again.Load() || !o.pump.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// scheduleRetry wakes the object's pump at t, reactivating it if needed.
func (n *Node) scheduleRetry(id ObjectID, t time.Time) {
	d := t.Sub(n.dcfg.Clock.Now())
	n.dcfg.Clock.AfterFunc(max(d, 0), func() {
		select {
		case <-n.stop:
		default:
			n.kick(id)
		}
	})
}

// publisher adapts an object to delivery.Publisher; its lanes are the
// node's pump goroutines, so it is the node's wiring, as remoteTransport.
type publisher struct {
	n *Node
	o *object
}

func (p publisher) ID() string { return p.o.id.String() }

// Go runs a follower lane of the publisher: it holds a reference to the
// object, so the object stays active while the lane runs, and counts in
// pumps, so Shutdown waits for it; its context ends at Shutdown.
func (p publisher) Go(f func(context.Context)) bool {
	n := p.n
	o, err := n.objects.acquire(p.o.id)
	if err != nil {
		return false
	}
	if o != p.o {
		n.objects.release(o)
		return false
	}
	if !n.goCounted(func() {
		defer n.objects.release(o)
		f(n.bgContext)
	}) {
		n.objects.release(o)
		return false
	}
	return true
}

// ConnSets is the object's memory of the edge sets its sockets' nodes
// hold: it goes with the object, and a new activation starts afresh.
func (p publisher) ConnSets() *delivery.ConnSets { return &p.o.pump.sets }

// Wake schedules a round of the publisher at t.
func (p publisher) Wake(t time.Time) { p.n.scheduleRetry(p.o.id, t) }

// Between runs f in a transaction of the publisher's own, between its
// calls. Under async acknowledgement it runs once everything committed
// before it is shipped, so no follower is given an event before it is in
// the stream. It waits unlocked, so calls go on meanwhile; commits that
// keep arriving make it wait under the lock after a few tries.
func (p publisher) Between(ctx context.Context, f func(*store.Tx) error) error {
	o, r := p.o, p.n.replicas
	for try := 0; ; try++ {
		locked := try >= 3
		if !locked {
			if err := r.waitShipped(ctx, o.id); err != nil {
				return err
			}
		}
		if err := o.lock(ctx); err != nil {
			return err
		}
		err := o.readyFile(ctx)
		if err == nil && locked {
			err = r.waitShipped(ctx, o.id)
		}
		if err == nil && !locked && !r.allShipped(o.id) {
			o.unlock()
			continue
		}
		if err == nil {
			err = o.between(f)
		}
		o.unlock()
		return err
	}
}

// receive runs a durable delivery on the follower: for each event in order,
// skip it if the follower's receive cursor is at or past it, else run the
// receive handler and advance the cursor in the handler's own transaction.
func (n *Node) receive(ctx context.Context, d *delivery.ObjectDelivery) (delivery.ObjectResult, error) {
	id, err := ParseObjectID(d.Follower)
	if err != nil {
		return delivery.ObjectResult{}, err
	}
	// The follower runs on its home only: a delivery routed by a stale
	// edge must not make a second copy of it here.
	if err := n.ensureHome(ctx, id); err != nil {
		return delivery.ObjectResult{}, err
	}
	events := d.Events
	if d.Range != nil {
		pub, err := ParseObjectID(d.Publisher)
		if err != nil {
			return delivery.ObjectResult{}, err
		}
		if events, err = n.materialize(ctx, pub, d); err != nil {
			if placementError(err) {
				return delivery.ObjectResult{}, err // the publisher's log is moving
			}
			return delivery.ObjectResult{Err: err.Error()}, nil
		}
	}
	o, err := n.objects.acquire(id)
	if err != nil {
		return delivery.ObjectResult{}, err
	}
	defer n.objects.release(o)
	res, err := o.receiveAll(ctx, d.Topic, events, d.Through)
	if err != nil || res.Done == 0 {
		return res, err
	}
	// Under async acknowledgement the follower's commits are shipped after
	// they return. The answer advances the publisher's edge cursor, which
	// must not pass an event whose effect a crash of the follower's home
	// could still lose (the publisher would never send it again), so the
	// delivery is answered once they are shipped; the follower's other
	// calls go on meanwhile. Under sync acknowledgement they are shipped
	// already.
	if r := n.replicas; r != nil {
		if err := r.waitShipped(ctx, id); err != nil {
			return delivery.ObjectResult{}, err
		}
	}
	return res, nil
}

// receiveAll runs the follower's receive for each event in order, locked,
// and says how far it got: through, or the last event before a handler
// failed (with its error).
func (o *object) receiveAll(ctx context.Context, topic string, events []abi.Event, through uint64) (delivery.ObjectResult, error) {
	if err := o.lock(ctx); err != nil {
		return delivery.ObjectResult{}, err
	}
	defer o.unlock()
	res := delivery.ObjectResult{}
	for i := range events {
		ev := &events[i]
		if err := o.receiveOne(ctx, topic, ev); err != nil {
			if placementError(err) {
				// Fenced or moving, not the handler's failure: the
				// publisher locates the follower again.
				return res, err
			}
			res.Err = err.Error()
			return res, nil
		}
		res.Done = ev.Seq
	}
	res.Done = through
	return res, nil
}

// errAlreadyDone rolls back a delivery the follower already committed.
var errAlreadyDone = errors.New("already committed here")

// receiveOne handles one event exactly once in effect: the receive cursor
// is checked before the handler runs and advanced in its transaction.
// Called locked.
func (o *object) receiveOne(ctx context.Context, topic string, ev *abi.Event) error {
	err := o.handle(ctx, func(h *objectHost) error {
		if !o.module.Has(abi.HandlerReceive) {
			return fmt.Errorf("%s has no receive handler", o.id)
		}
		cur, err := h.tx.Cursor(ev.Publisher, topic)
		if err != nil {
			return err
		}
		if ev.Seq <= cur {
			return errAlreadyDone // redelivery skips
		}
		// Calls it makes are keyed by the event: a redelivery repeats
		// none of their effects.
		h.event, h.topic = ev, topic
		if err := o.inst.Receive(h, ev); err != nil {
			return err
		}
		return h.tx.SetCursor(ev.Publisher, topic, ev.Seq)
	})
	if errors.Is(err, errAlreadyDone) {
		return nil
	}
	if err == nil {
		o.env.metrics.received.Inc()
	}
	return err
}

// materialize reads a ranged delivery through the read path: this node's
// own copy of the publisher's log (its file when this node is the
// publisher's home, else the copy it keeps), else the holder, else the
// shipped replica (the change stream, applied to a scratch file). Each tier
// is counted on /metrics (host_read_path_total).
func (n *Node) materialize(ctx context.Context, pub ObjectID, d *delivery.ObjectDelivery) ([]abi.Event, error) {
	q := d.RangeQuery()
	tier := "own"
	evs, err := store.Read(ctx, n.objectPath(pub), q)
	if errors.Is(err, store.ErrNoLog) && n.replicas != nil {
		evs, err = n.replicas.readCopy(ctx, pub, q)
	}
	if errors.Is(err, store.ErrNoLog) {
		tier = "holder"
		evs, err = n.materializeRemote(ctx, pub, d)
		if err != nil && n.replicas != nil && (errors.Is(err, ErrUnavailable) || errors.Is(err, store.ErrNoLog)) {
			tier = "shipped"
			evs, err = n.replicas.readShipped(ctx, pub, q)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("materialize %s (%d, %d]: %w", pub, d.Range.After, d.Range.Through, err)
	}
	for i := range evs {
		evs[i].Publisher = d.Publisher
	}
	n.metrics.materialized.Inc()
	n.metrics.readPath.WithLabelValues(tier).Inc()
	return evs, nil
}

// Follow asks publisher to admit a follower living on this node: the
// publisher's follow hook runs (once, now, never during delivery) on the
// publisher's home, and on approval an edge is recorded at the log's head,
// naming this node as the follower's.
func (n *Node) Follow(ctx context.Context, publisherID ObjectID, req abi.FollowRequest) (store.Edge, error) {
	if err := publisherID.Validate(); err != nil {
		return store.Edge{}, err
	}
	if len(req.Topic) > abi.MaxTopicLen {
		return store.Edge{}, fmt.Errorf("%w: topic longer than %d bytes", ErrBadRequest, abi.MaxTopicLen)
	}
	if _, err := delivery.ParseFilter(req.Filter); err != nil {
		return store.Edge{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if req.Kind == abi.FollowerObject && req.Follower == publisherID.String() {
		return store.Edge{}, fmt.Errorf("%w: an object cannot follow itself", ErrBadRequest)
	}
	if _, err := n.programs.latest(ctx, publisherID.Program); err != nil {
		return store.Edge{}, err
	}
	req.Publisher = publisherID.String()
	return opFollow.onHome(ctx, n, publisherID, followRequest{FollowRequest: req, Node: n.id})
}

// opFollow runs a follow on the publisher's home.
var opFollow = objectOp("follow", 0, (*Node).followLocal)

// followRequest is a follow as it crosses to the publisher's home: the
// request and the node the follower lives on.
type followRequest struct {
	abi.FollowRequest
	Node string
}

// followLocal runs the follow on the publisher's home.
func (n *Node) followLocal(ctx context.Context, publisherID ObjectID, freq followRequest) (store.Edge, error) {
	req, followerNode := freq.FollowRequest, freq.Node
	o, err := n.objects.acquire(publisherID)
	if err != nil {
		return store.Edge{}, err
	}
	defer n.objects.release(o)
	// A cold publisher compiles its module first, outside its lock, so a
	// herd of follows waits for one compile, not for each other's turn.
	if err := n.programs.warm(ctx, publisherID.Program); err != nil {
		return store.Edge{}, err
	}
	// A follow from inside a handler holds the follower's lock: it waits
	// only briefly, so two objects following each other cannot deadlock.
	// A socket's follow holds nothing and may wait for an activation and
	// a handler ahead of it.
	wait := followLockWait
	if req.Kind == abi.FollowerConnection {
		wait = max(n.cfg.VM.Budget, n.cfg.VM.InitBudget) + n.cfg.VM.Budget
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := o.lock(lctx); err != nil {
		return store.Edge{}, fmt.Errorf("%w: publisher %s is busy: %v", ErrUnavailable, publisherID, err)
	}
	defer o.unlock()
	var e store.Edge
	err = o.handle(ctx, func(h *objectHost) error {
		// Across tenants only a follow hook can admit: a program without
		// one keeps its events to its own tenant.
		if req.Tenant != tenancy.TenantOf(publisherID.Program) && !o.module.Has(abi.HandlerFollow) {
			return &vm.RefusedError{Reason: "its program has no follow hook, so only its own tenant may follow it"}
		}
		n.metrics.followHooks.Inc()
		if err := o.inst.Follow(h, &req); err != nil {
			return err
		}
		var err error
		e, err = h.tx.AddEdge(req.Kind, req.Follower, followerNode, req.Topic, req.Filter, time.Now())
		return err
	})
	if err != nil {
		return store.Edge{}, err
	}
	n.notePublisher(ctx, publisherID)
	return e, nil
}

// Unfollow removes a follower's edge on publisher's topic.
func (n *Node) Unfollow(ctx context.Context, publisherID ObjectID, kind abi.FollowerKind, follower, topic string) (bool, error) {
	return opUnfollow.onHome(ctx, n, publisherID, abi.FollowRequest{Kind: kind, Follower: follower, Topic: topic})
}

// opUnfollow removes a follower's edge on the publisher's home.
var opUnfollow = objectOp("unfollow", 0, (*Node).unfollowLocal)

// unfollowLocal removes the edge of req's follower on req's topic.
func (n *Node) unfollowLocal(ctx context.Context, publisherID ObjectID, req abi.FollowRequest) (bool, error) {
	var removed bool
	err := n.between(ctx, publisherID, func(tx *store.Tx) error {
		var err error
		removed, err = tx.RemoveEdge(req.Kind, req.Follower, req.Topic)
		return err
	})
	return removed, err
}

// RemoveEdge removes an edge by id (an operator's unfollow).
func (n *Node) RemoveEdge(ctx context.Context, publisherID ObjectID, id int64) (bool, error) {
	if err := publisherID.Validate(); err != nil {
		return false, err
	}
	return opRemoveEdge.onHome(ctx, n, publisherID, id)
}

// opRemoveEdge removes an edge by id on the publisher's home.
var opRemoveEdge = objectOp("rmedge", 0, (*Node).removeEdgeLocal)

func (n *Node) removeEdgeLocal(ctx context.Context, publisherID ObjectID, id int64) (bool, error) {
	var removed bool
	err := n.between(ctx, publisherID, func(tx *store.Tx) error {
		var err error
		removed, err = tx.RemoveEdgeID(id)
		return err
	})
	if err == nil && removed {
		n.metrics.pruned.WithLabelValues("unfollow").Inc()
	}
	return removed, err
}

// Edges lists a publisher's edges.
func (n *Node) Edges(ctx context.Context, publisherID ObjectID) ([]store.Edge, error) {
	if err := publisherID.Validate(); err != nil {
		return nil, err
	}
	if _, err := n.programs.latest(ctx, publisherID.Program); err != nil {
		return nil, err
	}
	edges, err := opEdges.onHome(ctx, n, publisherID, struct{}{})
	if edges == nil {
		edges = []store.Edge{}
	}
	return edges, err
}

// opEdges lists a publisher's edges on its home.
var opEdges = objectOp("edges", 0, (*Node).edgesLocal)

func (n *Node) edgesLocal(ctx context.Context, publisherID ObjectID, _ struct{}) ([]store.Edge, error) {
	var edges []store.Edge
	err := n.between(ctx, publisherID, func(tx *store.Tx) error {
		var err error
		edges, err = tx.Edges()
		return err
	})
	return edges, err
}

// pruneConnection removes every edge conn holds on publisher: its socket is
// gone.
func (n *Node) pruneConnection(ctx context.Context, publisherID ObjectID, conn string) {
	_, err := opPrune.onHome(ctx, n, publisherID, conn)
	if err != nil && !errors.Is(err, ErrShuttingDown) {
		n.log.Debug("prune connection", slog.String("conn", conn), slog.Any("err", err))
	}
}

// opPrune removes a gone connection's edges on the publisher's home.
var opPrune = objectOp("prune", quickWait, (*Node).pruneLocal)

// pruneLocal logs its failure where it happened and answers done: a prune
// is best effort, since a publisher's pump also prunes the edges of sockets
// their node reports gone.
func (n *Node) pruneLocal(ctx context.Context, publisherID ObjectID, conn string) (struct{}, error) {
	err := n.between(ctx, publisherID, func(tx *store.Tx) error {
		k, err := tx.RemoveFollower(abi.FollowerConnection, conn)
		if k > 0 {
			n.metrics.pruned.WithLabelValues("socket_gone").Add(float64(k))
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrShuttingDown) {
		n.log.Debug("prune connection", slog.String("conn", conn), slog.Any("err", err))
	}
	return struct{}{}, nil
}

// between runs f on an existing object's file between its calls.
func (n *Node) between(ctx context.Context, id ObjectID, f func(*store.Tx) error) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if _, err := n.programs.latest(ctx, id.Program); err != nil {
		return err
	}
	if !n.objectExists(id) {
		return fmt.Errorf("%w: %s", ErrUnknownObject, id)
	}
	o, err := n.objects.acquire(id)
	if err != nil {
		return err
	}
	defer n.objects.release(o)
	return publisher{n, o}.Between(ctx, f)
}

// notePublisher remembers that id has edges, so a restarted node resumes
// its deliveries.
func (n *Node) notePublisher(ctx context.Context, id ObjectID) {
	if _, err := n.db.ExecContext(ctx, `INSERT OR IGNORE INTO publishers (object) VALUES (?)`, id.String()); err != nil {
		n.log.Warn("record publisher", slog.Any("err", err))
	}
}

// resumePublishers kicks every publisher with edges: after a restart, their
// pending deliveries go on (and connection edges of the old node are
// pruned).
func (n *Node) resumePublishers(ctx context.Context) error {
	rows, err := n.db.QueryContext(ctx, `SELECT object FROM publishers`)
	if err != nil {
		return err
	}
	var ids []ObjectID
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return err
		}
		if id, err := ParseObjectID(s); err == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	for _, id := range ids {
		// Only a publisher whose home this is: its pump opens the file.
		if n.ensureHome(ctx, id) == nil {
			n.kick(id)
		}
	}
	return rows.Err()
}

// followerPlaced routes, now, the edges that waited for follower to be
// served again: every publisher here whose lane found it unplaced makes
// those edges due and runs.
func (n *Node) followerPlaced(ctx context.Context, follower string) {
	for _, p := range n.pump.Placed(follower) {
		id, err := ParseObjectID(p)
		if err != nil || n.ensureHome(ctx, id) != nil {
			continue
		}
		due := 0
		err = n.between(ctx, id, func(tx *store.Tx) error {
			var err error
			due, err = tx.DueNow(follower)
			return err
		})
		if err != nil {
			n.log.Debug("route a placed follower", slog.String("publisher", p), slog.String("follower", follower), slog.Any("err", err))
			continue
		}
		if due > 0 {
			n.kick(id)
		}
	}
}

// nodeGone runs when a node's lease ends: every active publisher runs a
// round, pruning the edges of connections that lived there.
func (n *Node) nodeGone(id string) {
	n.log.Info("node gone", slog.String("gone", id))
	for _, o := range n.objects.activeIDs() {
		n.kick(o)
	}
	if n.replicas != nil {
		go n.takeOver(id)
		go n.recopy(id)
	}
}
