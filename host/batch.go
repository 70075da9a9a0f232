package host

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
)

// Group commit: the calls queued at an object while it runs a handler run
// next back to back in one transaction, each inside its own savepoint, so
// a failing call rolls back alone and gets its own error. One commit (one
// fsync under --sync full, one replicated change set with copies on)
// covers the batch, and every reply, publish to followers and stream hint
// waits for it: the output gate. A call never sees another call's
// uncommitted effects except through the object's own state, which calls
// change one after another anyway.
//
// A lone call runs as before, in a transaction of its own: a batch only
// forms when calls wait, so one client's latency does not grow.
const (
	// maxBatchTime: no further call starts in a batch that has run for
	// this long.
	maxBatchTime = 10 * time.Millisecond
	// maxBatchChanges bounds a batch's change set, far below what one
	// replicated change set can carry (NATS's 1 MB payload): a call that
	// takes a batch past it is rolled back and runs first in the next
	// batch, where it is alone against the limit.
	maxBatchChanges = 256 << 10
	// maxBatchedCall: a call joins a batch behind others only if its
	// method's recent handler time on this object is under this. Its
	// predecessors' replies wait for the batch's commit, so a slow call
	// (or one never seen) starts a batch of its own instead of holding
	// them back.
	maxBatchedCall = time.Millisecond
	// maxTimedMethods bounds the methods whose handler time an object
	// keeps.
	maxTimedMethods = 64
)

// timeMethod records a method's handler time on the object: its recent
// time rises to a slower call at once and falls back by a quarter of the
// gap per call. Called locked.
func (o *object) timeMethod(method string, d time.Duration) {
	if o.methodTimes == nil {
		o.methodTimes = map[string]time.Duration{}
	}
	old, ok := o.methodTimes[method]
	switch {
	case !ok && len(o.methodTimes) >= maxTimedMethods:
		return
	case !ok || d > old:
		o.methodTimes[method] = d
	default:
		o.methodTimes[method] = old - (old-d)/4
	}
}

// callHandler runs a method's handler, timing it.
func (o *object) callHandler(h *objectHost, method string, payload []byte) ([]byte, error) {
	began := time.Now()
	h.method = method
	reply, err := o.inst.Call(h, method, payload)
	o.timeMethod(method, time.Since(began))
	return reply, err
}

// batchable reports whether method is known to be quick on this object
// and to call no other object: a call that waits for another object
// (another node, perhaps) would hold its batch's replies behind it.
func (o *object) batchable(method string) bool {
	d, ok := o.methodTimes[method]
	return ok && d < o.env.batchedCall && !o.callsOut[method]
}

// pendingCall is a call waiting at its object for a batch.
type pendingCall struct {
	ctx   context.Context
	req   *callRequest
	reply []byte
	err   error
	// taken is set (under the object's qmu) while a batch holds the
	// call: its caller cannot withdraw it then. A batch that gives it
	// back unrun clears it.
	taken bool
	done  chan struct{}
}

// submit runs a method call on the object and returns its reply once the
// transaction holding it committed. The caller that takes the object's
// lock runs the queued calls in batches until its own is done; the others
// wait for theirs.
func (o *object) submit(ctx context.Context, req *callRequest) ([]byte, error) {
	pc := &pendingCall{ctx: ctx, req: req, done: make(chan struct{})}
	o.qmu.Lock()
	o.queue = append(o.queue, pc)
	o.qmu.Unlock()
	gaveUp := ctx.Done()
	for {
		select {
		case <-pc.done:
			return pc.reply, pc.err
		case o.sem <- struct{}{}:
			o.runQueued(pc)
			inline := o.syncInline
			o.syncInline = false
			o.unlock()
			if inline && o.gate.round() {
				go o.gate.run() // others' replies wait too
			}
			<-pc.done // at once, or after the output gate's fsync
			return pc.reply, pc.err
		case <-gaveUp:
			if o.withdraw(pc) {
				return nil, fmt.Errorf("waiting for %s: %w", o.id, ctx.Err())
			}
			// A batch took it: its outcome is the call's. The batch may
			// also give it back unrun (it stopped growing), so this
			// caller still competes for the lock to run it (as a call
			// whose context ended: it fails at once).
			gaveUp = nil
		}
	}
}

// queued is the number of calls waiting.
func (o *object) queued() int {
	o.qmu.Lock()
	defer o.qmu.Unlock()
	return len(o.queue)
}

// withdraw removes pc from the queue unless a batch took it.
func (o *object) withdraw(pc *pendingCall) bool {
	o.qmu.Lock()
	defer o.qmu.Unlock()
	if pc.taken {
		return false
	}
	for i, q := range o.queue {
		if q == pc {
			o.queue = append(o.queue[:i], o.queue[i+1:]...)
			break
		}
	}
	return true
}

// take removes up to max calls from the head of the queue for a batch.
func (o *object) take(max int) []*pendingCall {
	o.qmu.Lock()
	defer o.qmu.Unlock()
	k := min(len(o.queue), max)
	batch := make([]*pendingCall, k)
	copy(batch, o.queue)
	for _, pc := range batch {
		pc.taken = true
	}
	n := copy(o.queue, o.queue[k:])
	clear(o.queue[n:])
	o.queue = o.queue[:n]
	return batch
}

// putBack returns calls a batch took but did not run to the head of the
// queue, in their order.
func (o *object) putBack(calls []*pendingCall) {
	o.qmu.Lock()
	defer o.qmu.Unlock()
	for _, pc := range calls {
		pc.taken = false
	}
	o.queue = append(calls[:len(calls):len(calls)], o.queue...)
}

// runQueued runs batches from the queue until self is done, or, under
// the output gate, until self is run and waits for its fsync (the queue is
// empty then). Called locked.
func (o *object) runQueued(self *pendingCall) {
	if o.queued() == 1 {
		// Alone: let callers that are about to queue (those the last
		// batch just answered) do so, so they share this commit instead
		// of waiting for the next. With nothing else to run this returns
		// at once.
		runtime.Gosched()
	}
	for {
		select {
		case <-self.done:
			return
		default:
		}
		size := max(o.env.maxBatch, 1)
		if o.solo {
			size = 1
		}
		batch := o.take(size)
		if len(batch) == 0 {
			return // self is behind the output gate
		}
		o.runBatch(batch)
	}
}

// runBatch runs the calls of one batch and answers each once the batch's
// commit (or its rollback) is done, and under the output gate once what
// they saw is durable. Called locked.
func (o *object) runBatch(batch []*pendingCall) {
	start := time.Now()
	o.gating = o.gate != nil
	// A lone call with nothing behind it or before it at the gate
	// fsyncs in its own commit: the gate's fsync, made after the commit,
	// costs a lone call more (measured: 60-90 µs at p50).
	o.deferSync = o.gating && !(len(batch) == 1 && o.queued() == 0 && o.gate.idle())
	if len(batch) == 1 {
		pc := batch[0]
		if err := pc.ctx.Err(); err != nil {
			// Its caller gave up: it never runs.
			pc.err = fmt.Errorf("waiting for %s: %w", o.id, err)
		} else {
			pc.reply, pc.err = o.call(pc.ctx, pc.req)
			if pc.err == nil {
				o.env.metrics.batchCalls.Observe(1)
			}
		}
		o.release(batch, start)
		return
	}
	ran := o.runGroup(batch, start)
	if rest := batch[len(ran):]; len(rest) > 0 {
		o.putBack(rest)
	}
	o.release(ran, start)
}

// release answers calls whose batch ended: at once, or under the output
// gate once every commit before now is durable (a call that only read may
// have seen one that is not), with the streams' hint and the pump's kick
// the batch's commits owe. Called locked.
func (o *object) release(calls []*pendingCall, start time.Time) {
	if !o.gating {
		o.answer(calls, start)
		return
	}
	o.gating, o.deferSync = false, false
	hint, kick := o.owedHint, o.owedKick
	o.owedHint, o.owedKick = false, false
	syncer := o.gate.after(func(err error) {
		if err != nil {
			o.env.log.Error("commit not made durable", slog.String("object", o.id.String()), slog.Any("err", err))
			for _, pc := range calls {
				if pc.err == nil {
					pc.reply, pc.err = nil, fmt.Errorf("%w: the commit could not be made durable: %v", ErrUnavailable, err)
				}
			}
		}
		if hint {
			o.env.hint(o.id)
		}
		if kick {
			o.env.kick(o.id)
		}
		o.answer(calls, start)
	})
	switch {
	case !syncer:
	case o.queued() == 0:
		// Nothing else to run: the caller holding the lock makes the
		// fsync itself once it lets go of it (syncInline), sparing a
		// lone call a goroutine's start and wake-up.
		o.syncInline = true
	default:
		go o.gate.run()
	}
}

// answer releases the replies of calls whose batch ended.
func (o *object) answer(calls []*pendingCall, start time.Time) {
	d := time.Since(start)
	for _, pc := range calls {
		o.env.metrics.observeCall(o.id.Program, d, pc.err)
		close(pc.done)
	}
}

// runGroup runs batch in one transaction and returns the calls it ran
// (a prefix of batch: the rest go back to the queue), each with its reply
// or error set. The first call's context holds the tenant's slot and
// readies the object for all.
func (o *object) runGroup(batch []*pendingCall, start time.Time) []*pendingCall {
	fail := func(calls []*pendingCall, err error) []*pendingCall {
		for _, pc := range calls {
			pc.reply, pc.err = nil, err
		}
		return calls
	}
	tu := o.env.usage.Of(tenancy.TenantOf(o.id.Program))
	release, err := tu.Acquire(batch[0].ctx)
	if err != nil {
		return fail(batch, err)
	}
	defer release()
	tx, err := o.begin(batch[0].ctx, tu)
	if err != nil {
		return fail(batch, err)
	}
	// The batch's state writes and events wait in memory for its commit:
	// a key the calls each write is written once, and a call that runs no
	// other statement runs no SQL (store.Tx.Defer).
	tx.Defer()
	// full gives the batch back when it met the file's storage limit:
	// SQLite may have rolled back the whole transaction then, and which
	// call did not fit is known only running them one per transaction.
	full := func() []*pendingCall {
		tx.Rollback()
		o.solo = true
		for _, pc := range batch {
			pc.reply, pc.err = nil, nil
		}
		return batch[:0]
	}
	committed := 0
	for i, pc := range batch {
		if i > 0 && (time.Since(start) >= o.env.batchTime || tx.Ops() >= maxBatchChanges || !o.batchable(pc.req.Method) || o.callsOut[batch[0].req.Method]) {
			batch = batch[:i]
			break
		}
		if err := pc.ctx.Err(); err != nil {
			pc.err = fmt.Errorf("waiting for %s: %w", o.id, err)
			continue
		}
		sp, err := tx.Savepoint()
		if err == nil {
			err = o.ready(pc.ctx) // a call before broke the instance
		}
		if err == nil {
			err = o.runHandler(pc.ctx, tx, tu, func(h *objectHost) error {
				var err error
				pc.reply, err = o.callOnce(h, pc.req)
				return err
			})
		}
		if err == nil && i > 0 && tx.Ops() > maxBatchChanges {
			// Too much for this batch: undone, it runs again first in
			// the next. Its reply was never sent.
			if rerr := sp.RollbackTo(); rerr != nil {
				tx.Rollback()
				return fail(batch[:i+1], rerr)
			}
			pc.reply = nil
			batch = batch[:i]
			break
		}
		if store.IsFull(err) {
			return full()
		}
		if err != nil {
			pc.reply, pc.err = nil, o.storageErr(tu, err)
			if rerr := sp.RollbackTo(); rerr != nil {
				// The transaction cannot be trusted any more: nothing in
				// it commits.
				tx.Rollback()
				return fail(batch[:i+1], fmt.Errorf("%w: %v", ErrUnavailable, rerr))
			}
			continue
		}
		if err := sp.Release(); err != nil {
			tx.Rollback()
			return fail(batch[:i+1], err)
		}
		committed++
	}
	if committed == 0 {
		tx.Rollback()
		return batch
	}
	if err := tx.Flush(); err != nil {
		if store.IsFull(err) {
			return full()
		}
		tx.Rollback()
		return fail(batch, err)
	}
	if err := o.commit(tx, tu); err != nil {
		for _, pc := range batch {
			if pc.err == nil {
				pc.reply, pc.err = nil, err
			}
		}
		return batch
	}
	o.calls += int64(committed)
	o.env.metrics.batchCalls.Observe(float64(committed))
	return batch
}
