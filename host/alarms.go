package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/store"
)

// Alarms: an object has at most one, kept in its file (store.Alarm), so
// setting one commits with the handler that set it and reaches the copies
// with everything else. The home runs it: a timer per object with a
// pending alarm, set from what the file holds after every commit that
// wrote it, at every activation (a takeover's too) and, at start, from a
// read-only look at every object file here. A timer is only a hint: the
// alarm's own transaction reads the file again and runs the handler only
// if an alarm is there and due, so a stale timer does nothing.
//
// A run that fails (an error, a trap, past its budget) is recorded in the
// file as a failed attempt and retried as durable deliveries are (the
// delivery config's RetryBase, doubling, MaxAttempts), then dropped; the
// count survives a restart because it is in the file.

// maxAlarmRuns bounds the alarm runs in progress on a node. Each holds its
// object active (its file, an instance) until it ends; a slow one (a
// handler looping to its budget) holds its slot that long, so the bound
// is far above the cores, and far below the active-object bound.
const maxAlarmRuns = 64

// gauge counts something in progress and keeps its high-water mark.
type gauge struct {
	mu        sync.Mutex
	now, high int
}

func (g *gauge) note(d int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now += d
	g.high = max(g.high, g.now)
}

// alarmTimers keeps one timer per object with a pending alarm on this
// node. It knows nothing of objects or files: the node tells it when
// each alarm is due, and it calls fire then (fire must not block: it
// starts the run).
type alarmTimers struct {
	clock delivery.Clock
	fire  func(ObjectID)

	// mu guards timers, running and closed; it is never held while
	// calling fire.
	mu     sync.Mutex
	timers map[ObjectID]alarmTimer
	// running holds the objects whose alarm run has started and not
	// ended (done): nothing fires for them meanwhile, since the run's end
	// schedules again from what the file holds then.
	running map[ObjectID]bool
	closed  bool
}

type alarmTimer struct {
	at   time.Time
	stop func() bool
}

func newAlarmTimers(clock delivery.Clock, fire func(ObjectID)) *alarmTimers {
	return &alarmTimers{clock: clock, fire: fire, timers: map[ObjectID]alarmTimer{}, running: map[ObjectID]bool{}}
}

// schedule makes id's timer fire at at, replacing the one it had; at a
// time already past it fires now.
func (s *alarmTimers) schedule(id ObjectID, at time.Time) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if old, ok := s.timers[id]; ok {
		if old.at.Equal(at) {
			s.mu.Unlock()
			return
		}
		old.stop()
		delete(s.timers, id)
	}
	d := at.Sub(s.clock.Now())
	if d <= 0 {
		start := !s.running[id]
		s.running[id] = true
		s.mu.Unlock()
		if start {
			s.fire(id)
		}
		return
	}
	stop := s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		cur, ok := s.timers[id]
		mine := ok && cur.at.Equal(at) && !s.closed
		if mine {
			delete(s.timers, id)
		}
		start := mine && !s.running[id]
		if start {
			s.running[id] = true
		}
		s.mu.Unlock()
		if start {
			s.fire(id)
		}
	})
	s.timers[id] = alarmTimer{at: at, stop: stop}
	s.mu.Unlock()
}

// done ends id's run: from now on its alarm fires again. The caller then
// schedules what the file holds.
func (s *alarmTimers) done(id ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, id)
}

// cancel drops id's timer.
func (s *alarmTimers) cancel(id ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.timers[id]; ok {
		t.stop()
		delete(s.timers, id)
	}
}

// pending is how many timers are set.
func (s *alarmTimers) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.timers)
}

// close stops every timer; nothing fires after it returns.
func (s *alarmTimers) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for id, t := range s.timers {
		t.stop()
		delete(s.timers, id)
	}
}

// alarmFileChanged schedules what id's file holds now: its pending
// alarm's next run, or nothing. Called with the object locked (the file
// is the caller's), after a commit that wrote the alarm and when the file
// opens as the home's.
func (n *Node) alarmFileChanged(id ObjectID, f *store.File) {
	a, ok, err := f.Alarm()
	switch {
	case err != nil:
		n.log.Warn("read an object's alarm", slog.String("object", id.String()), slog.Any("err", err))
	case ok:
		n.alarms.schedule(id, a.Next)
	default:
		n.alarms.cancel(id)
	}
}

// scheduleStoredAlarms sets a timer for every pending alarm in the object
// files of this node, read through read-only connections: no object is
// activated until its alarm is due. Run at start, after the files of
// objects taken over elsewhere were retired.
func (n *Node) scheduleStoredAlarms(ctx context.Context) {
	found := 0
	for _, id := range objectFiles(filepath.Join(n.cfg.DataDir, "objects")) {
		if ctx.Err() != nil {
			return
		}
		a, ok, err := store.ReadAlarm(ctx, n.objectPath(id))
		if err != nil {
			n.log.Warn("read an object's alarm", slog.String("object", id.String()), slog.Any("err", err))
			continue
		}
		if ok {
			n.alarms.schedule(id, a.Next)
			found++
		}
	}
	if found > 0 {
		n.log.Info("pending alarms scheduled", slog.Int("count", found))
	}
}

// fireAlarm runs id's alarm on a goroutine of its own, counted with the
// pumps so Shutdown waits for it.
func (n *Node) fireAlarm(id ObjectID) {
	n.goCounted(func() {
		// Alarms due together run a few at a time: each activates its
		// object (a file, an instance) and holds it until it is done, so
		// thousands at once would hold thousands of files and instances
		// past the active-object bound.
		select {
		case n.alarmSlots <- struct{}{}:
		case <-n.bgContext.Done():
			n.alarms.done(id)
			return
		}
		defer func() { <-n.alarmSlots }()
		n.alarmsRunning.note(+1)
		defer n.alarmsRunning.note(-1)
		n.runAlarm(n.bgContext, id)
	})
}

// runAlarm runs id's alarm if this node is its home and it is due. When
// the node cannot tell (the directory or its lease is not current), it
// looks again after the first backoff without counting an attempt.
func (n *Node) runAlarm(ctx context.Context, id ObjectID) {
	later := func(why error) {
		n.alarms.done(id)
		if ctx.Err() == nil {
			n.log.Debug("alarm postponed", slog.String("object", id.String()), slog.Any("err", why))
			n.alarms.schedule(id, n.dcfg.Clock.Now().Add(n.dcfg.RetryBase))
		}
	}
	if err := n.ensureHome(ctx, id); err != nil {
		if errors.Is(err, errNotHome) {
			n.alarms.done(id)
			return // its home schedules it from its own file
		}
		later(err)
		return
	}
	if !n.cluster.LeaseValid() {
		later(errors.New("this node's lease is not current"))
		return
	}
	o, err := n.objects.acquire(id)
	if err != nil {
		n.alarms.done(id)
		return // shutting down: the next start finds the alarm in the file
	}
	defer n.objects.release(o)
	if err := o.lock(ctx); err != nil {
		n.alarms.done(id)
		return
	}
	defer o.unlock()
	res := o.alarm(ctx, n.dcfg)
	n.metrics.alarmRan(res)
	n.alarms.done(id)
	// A postponed run set its own timer: the file still says "due now",
	// and scheduling from it would run it again at once, and again.
	if res != alarmPostponed && o.file != nil && ctx.Err() == nil {
		n.alarmFileChanged(id, o.file)
	}
}

// alarmResult is how one alarm run ended, a label of host_alarms_total.
type alarmResult string

const (
	alarmOK      alarmResult = "ok"      // the handler committed
	alarmRetry   alarmResult = "retry"   // it failed; it runs again after the backoff
	alarmDropped alarmResult = "dropped" // it failed its last attempt and is gone
	alarmNone    alarmResult = ""        // nothing was due: a stale timer, or shutting down
	// postponed: it failed where no attempt could be recorded (its file
	// would not open or write); it runs again after the longest backoff,
	// which its timer already says.
	alarmPostponed alarmResult = "postponed"
)

// errNotDue rolls back an alarm run that found nothing due.
var errNotDue = errors.New("no alarm due")

// alarm runs the object's alarm handler, if its alarm is due, in a
// transaction of its own that also clears the alarm unless the handler set
// or deleted it itself. A failed run is recorded in the file, to be
// retried with cfg's backoff or dropped after cfg.MaxAttempts. Called
// locked.
func (o *object) alarm(ctx context.Context, cfg delivery.Config) alarmResult {
	now := cfg.Clock.Now()
	var due store.Alarm
	err := o.handle(ctx, func(h *objectHost) error {
		a, ok, err := h.tx.Alarm()
		if err != nil {
			return err
		}
		due = a
		if !ok || a.Next.After(now) {
			return errNotDue
		}
		if !o.module.Has(abi.HandlerAlarm) {
			return fmt.Errorf("%s has no alarm handler (the version running now does not register one)", o.id)
		}
		if err := o.inst.Alarm(h); err != nil {
			return err
		}
		if h.alarmWritten {
			return nil // the handler set its next alarm, or deleted it
		}
		return h.tx.DeleteAlarm()
	})
	switch {
	case err == nil:
		if due.Attempts == 0 {
			o.env.metrics.alarmLate(now.Sub(due.Time))
		}
		return alarmOK
	case errors.Is(err, errNotDue):
		return alarmNone // the caller schedules what the file holds
	case ctx.Err() != nil || errors.Is(err, errDeactivated) || errors.Is(err, ErrShuttingDown):
		return alarmNone // not the handler's failure: the file still holds it
	}
	return o.alarmFailed(due, now, cfg, err)
}

// alarmFailed records a failed run of a: one more attempt, the next after
// the backoff, or the alarm dropped after the last. Called locked.
func (o *object) alarmFailed(a store.Alarm, now time.Time, cfg delivery.Config, cause error) alarmResult {
	if a.Next.IsZero() && o.file != nil {
		// It failed before the handler ran (the instance did not start):
		// an attempt like any other.
		var ok bool
		var err error
		if a, ok, err = o.file.Alarm(); err == nil && !ok {
			return alarmNone
		}
	}
	log := o.env.log.With(slog.String("object", o.id.String()), slog.Int("attempt", a.Attempts+1), slog.Any("err", cause))
	if o.file == nil || a.Next.IsZero() {
		// The file never opened: nothing to count in. Try again at the
		// longest wait, without an attempt.
		log.Warn("alarm could not run")
		o.env.alarmRetry(o.id, now.Add(cfg.MaxBackoff()))
		return alarmPostponed
	}
	a.Attempts++
	result := alarmRetry
	err := o.between(func(tx *store.Tx) error {
		if a.Attempts >= cfg.MaxAttempts {
			result = alarmDropped
			return tx.DeleteAlarm()
		}
		a.Next = now.Add(cfg.Backoff(a.Attempts))
		return tx.SetAlarm(a)
	})
	if err != nil {
		log.Warn("record a failed alarm", slog.Any("record_err", err))
		o.env.alarmRetry(o.id, now.Add(cfg.MaxBackoff()))
		return alarmPostponed
	}
	if result == alarmDropped {
		log.Warn("alarm dropped after its last failed attempt")
	} else {
		log.Info("alarm failed; it runs again", slog.Time("next", a.Next))
	}
	return result
}

// SetAlarm sets the object's alarm in the call's transaction. A program
// without an alarm handler is refused here, where its author sees why,
// rather than when the alarm comes due.
func (h *objectHost) SetAlarm(_ context.Context, t time.Time) error {
	if !h.o.module.Has(abi.HandlerAlarm) {
		return fmt.Errorf("%w: program %s has no alarm handler: register one (sdk.OnAlarm in Go, an `alarm` handler in Rust) before setting alarms", abi.ErrBadRequest, h.o.id.Program)
	}
	if limit := h.o.env.now().Add(abi.MaxAlarmAheadMs * time.Millisecond); t.After(limit) {
		return fmt.Errorf("%w: alarm time %s is more than %d days ahead (give Unix milliseconds)", abi.ErrBadRequest, t.UTC().Format(time.RFC3339), abi.MaxAlarmAheadMs/(24*3600*1000))
	}
	h.alarmWritten = true
	return h.fail(h.tx.SetAlarm(store.Alarm{Time: t, Next: t}))
}

// Alarm reads the pending alarm's time in the call's transaction.
func (h *objectHost) Alarm(context.Context) (time.Time, bool, error) {
	a, ok, err := h.tx.Alarm()
	return a.Time, ok, h.fail(err)
}

// DeleteAlarm cancels the pending alarm in the call's transaction.
func (h *objectHost) DeleteAlarm(context.Context) error {
	h.alarmWritten = true
	return h.fail(h.tx.DeleteAlarm())
}
