package vm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/durable-host/host/abi"
)

// Host is what a running handler reaches through the host imports: its own
// object's storage, log and edges. The caller passes one per call; ctx is the
// instance's context, cancelled when the call overruns its budget.
type Host interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
	Put(ctx context.Context, key, value []byte) error
	Delete(ctx context.Context, key []byte) error
	Scan(ctx context.Context, prefix []byte, limit int) ([]abi.Pair, error)
	Publish(ctx context.Context, topic string, payload []byte) error
	// Follow asks the publisher named in req to admit this object; a refusal
	// is a *RefusedError.
	Follow(ctx context.Context, req abi.FollowRequest) error
	Unfollow(ctx context.Context, req abi.FollowRequest) error
	// SetAlarm sets the object's one alarm to t, replacing any other, in
	// the call's transaction; a refusal wraps abi.ErrBadRequest.
	SetAlarm(ctx context.Context, t time.Time) error
	// Alarm is the pending alarm's time, as the call's transaction sees it.
	Alarm(ctx context.Context) (time.Time, bool, error)
	// DeleteAlarm cancels the pending alarm in the call's transaction.
	DeleteAlarm(ctx context.Context) error
	// Now is the wall clock the guest sees (time_now): the one its alarms
	// are scheduled by.
	Now() time.Time
	// Call runs another object's method (the call import) and returns its
	// reply; a failure the guest may handle is a *abi.CallError. ctx
	// ends when this handler's budget does.
	Call(ctx context.Context, req abi.CallRequest) ([]byte, error)
	// Deadline is the latest this handler may run until, whatever its
	// budget: a calling object's remaining budget. Zero: the budget
	// alone.
	Deadline() time.Time
	// Self is the object's "program/id".
	Self() string
	Log(level int32, msg string)
}

// Instance is one live instance of a module, used by one caller at a time.
// After any error other than a GuestError, RefusedError, ErrMethodNotFound or
// ErrSkip it is Broken and must be closed.
type Instance struct {
	e      *Engine
	module *Module
	mod    api.Module
	ctx    context.Context
	cancel context.CancelFunc

	version, call, follow, receive, event, alarm api.Function

	// Per call; touched only by the calling goroutine.
	host    Host
	input   []byte
	result  []byte
	reply   []byte
	stack   [2]uint64
	scratch []byte
	broken  bool
	out     *tail

	// began and budget are the running call's start and budget, for the
	// deadline a call it makes carries.
	began  time.Time
	budget time.Duration
	// deadline is when the running call's budget ends (Engine.now), 0
	// when idle; the watchdog reads it and sets expired before cancelling.
	deadline atomic.Int64
	expired  atomic.Bool
	// stop is the guest's stop flag (meter.go), raised by halt: when the
	// budget ends, or the engine closes. Written once under Engine.mu,
	// before the guest first runs.
	stop api.MutableGlobal
}

// Module returns the module this instance runs.
func (i *Instance) Module() *Module { return i.module }

// Broken reports whether the instance must be discarded.
func (i *Instance) Broken() bool { return i.broken }

// Close releases the instance.
func (i *Instance) Close(ctx context.Context) error {
	// Out of the watchdog's sight first: it may set the stop flag of a
	// live instance only.
	i.release()
	var err error
	if i.mod != nil {
		err = i.mod.Close(ctx)
	}
	return err
}

// halt stops the guest running on i, if any, and ends its host calls: the
// engine is closing. Called with Engine.mu held.
func (i *Instance) halt() {
	if i.stop != nil {
		i.stop.Set(1)
	}
	i.cancel()
}

func (i *Instance) release() {
	i.e.mu.Lock()
	delete(i.e.live, i)
	i.e.mu.Unlock()
	i.cancel()
}

// Call runs method with payload and returns the handler's reply.
func (i *Instance) Call(h Host, method string, payload []byte) ([]byte, error) {
	if len(method) > abi.MaxMethodLen {
		return nil, fmt.Errorf("%w: method name longer than %d bytes", ErrMethodNotFound, abi.MaxMethodLen)
	}
	in := append(append(i.scratch[:0], method...), payload...)
	i.scratch = in[:0]
	i.stack[0], i.stack[1] = uint64(len(method)), uint64(len(payload))
	st, err := i.invoke(h, i.call, in, 2)
	if err != nil {
		return nil, err
	}
	switch st {
	case abi.StatusOK:
		return i.takeReply(), nil
	case abi.StatusNotFound:
		return nil, fmt.Errorf("%w: %q", ErrMethodNotFound, method)
	case abi.StatusError:
		return nil, &GuestError{Message: string(i.reply)}
	case abi.StatusRefused:
		return nil, &RefusedError{Reason: string(i.reply)}
	}
	return nil, &GuestError{Message: fmt.Sprintf("handler returned status %d", st)}
}

// Follow runs the follow hook on req. A program without one admits everyone.
func (i *Instance) Follow(h Host, req *abi.FollowRequest) error {
	if i.follow == nil {
		return nil
	}
	i.scratch = abi.AppendFollowRequest(i.scratch[:0], req)
	i.stack[0] = uint64(len(i.scratch))
	st, err := i.invoke(h, i.follow, i.scratch, 1)
	i.scratch = i.scratch[:0]
	if err != nil {
		return err
	}
	switch st {
	case abi.StatusOK:
		return nil
	case abi.StatusRefused:
		return &RefusedError{Reason: string(i.reply)}
	case abi.StatusError:
		return &GuestError{Message: string(i.reply)}
	}
	return &GuestError{Message: fmt.Sprintf("follow hook returned status %d", st)}
}

// Receive runs the durable follower handler on e.
func (i *Instance) Receive(h Host, e *abi.Event) error {
	if i.receive == nil {
		return ErrNoHandler
	}
	i.scratch = abi.AppendEvent(i.scratch[:0], e)
	i.stack[0] = uint64(len(i.scratch))
	st, err := i.invoke(h, i.receive, i.scratch, 1)
	i.scratch = i.scratch[:0]
	return i.outcome(abi.ExportReceive, st, err)
}

// outcome is the error of a handler without a reply (receive, alarm)
// that returned st, or failed with err.
func (i *Instance) outcome(export string, st int32, err error) error {
	switch {
	case err != nil:
		return err
	case st == abi.StatusOK:
		return nil
	case st == abi.StatusError:
		return &GuestError{Message: string(i.reply)}
	}
	return &GuestError{Message: fmt.Sprintf("%s returned status %d", export, st)}
}

// Alarm runs the alarm handler: the object's alarm is due.
func (i *Instance) Alarm(h Host) error {
	if i.alarm == nil {
		return ErrNoHandler
	}
	st, err := i.invoke(h, i.alarm, nil, 0)
	return i.outcome(abi.ExportAlarm, st, err)
}

// Event runs the connection event handler on e and returns the frame to send,
// or ErrSkip.
func (i *Instance) Event(h Host, e *abi.Event) ([]byte, error) {
	if i.event == nil {
		return nil, ErrNoHandler
	}
	i.scratch = abi.AppendEvent(i.scratch[:0], e)
	i.stack[0] = uint64(len(i.scratch))
	st, err := i.invoke(h, i.event, i.scratch, 1)
	i.scratch = i.scratch[:0]
	if err != nil {
		return nil, err
	}
	switch st {
	case abi.StatusOK:
		return i.takeReply(), nil
	case abi.StatusSkip:
		return nil, ErrSkip
	case abi.StatusError:
		return nil, &GuestError{Message: string(i.reply)}
	}
	return nil, &GuestError{Message: fmt.Sprintf("event returned status %d", st)}
}

func (i *Instance) takeReply() []byte {
	if i.reply == nil {
		return []byte{}
	}
	out := make([]byte, len(i.reply))
	copy(out, i.reply)
	return out
}

func (i *Instance) callRaw(h Host, f api.Function) (int32, error) {
	return i.invoke(h, f, nil, 0)
}

// invoke calls f with i.stack[:nparams] under the budget.
func (i *Instance) invoke(h Host, f api.Function, input []byte, nparams int) (int32, error) {
	if i.broken {
		return 0, &TrapError{Message: "instance is broken"}
	}
	i.host, i.input, i.reply, i.result = h, input, i.reply[:0], nil
	budget := i.e.budget
	if h != nil {
		// A callee runs no longer than its caller waits.
		if d := h.Deadline(); !d.IsZero() {
			budget = min(budget, int64(time.Until(d)))
		}
	}
	i.began = time.Now()
	i.budget = time.Duration(budget)
	i.deadline.Store(i.e.now() + budget)
	err := f.CallWithStack(i.ctx, i.stack[:max(nparams, 1)])
	i.deadline.Store(0)
	i.host, i.input, i.result = nil, nil, nil
	if err != nil {
		i.broken = true
		if i.expired.Load() {
			return 0, ErrBudget
		}
		if i.e.halted.Load() {
			return 0, ErrClosed
		}
		var exit *sys.ExitError
		if errors.As(err, &exit) {
			return 0, &TrapError{Message: fmt.Sprintf("exited with code %d", exit.ExitCode()), Output: i.out.String()}
		}
		var abiErr *abiViolation
		if errors.As(err, &abiErr) {
			return 0, &TrapError{Message: abiErr.Error()}
		}
		return 0, &TrapError{Message: firstLine(err.Error()), Output: i.out.String()}
	}
	return int32(uint32(i.stack[0])), nil
}

func firstLine(s string) string {
	for j := 0; j < len(s); j++ {
		if s[j] == '\n' {
			return s[:j]
		}
	}
	return s
}

// abiViolation is panicked inside a host function when the guest breaks the
// ABI (a pointer outside its memory, a length over a limit it cannot be
// told about); wazero turns the panic into a trap of the guest's call.
type abiViolation struct{ msg string }

func (a *abiViolation) Error() string { return "ABI violation: " + a.msg }

// tail keeps the first and the last bytes written by the guest to
// stdout/stderr: a Go runtime's fatal error is at the head of a long
// goroutine dump.
type tail struct {
	max  int
	head []byte
	buf  []byte
}

const headMax = 512

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if room := headMax - len(t.head); room > 0 {
		k := min(room, len(p))
		t.head = append(t.head, p[:k]...)
		p = p[k:]
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return n, nil
}

func (t *tail) String() string {
	if len(t.buf) == 0 {
		return string(t.head)
	}
	return string(t.head) + "\n…\n" + string(t.buf)
}
