package host

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
)

// Object calls: a handler calls another object's method through the
// object_call import. The callee runs on its home (here or on another
// node, through opCall like a client's call) in its own transaction,
// which commits on its own: the caller's later failure does not undo it.
//
// The caller waits inside the import holding its object's lock, so a
// call carries its chain, the objects it passed through: a call to one of
// them would wait for itself and fails at once (ErrCallCycle), as does a
// chain longer than abi.MaxCallDepth. The callee runs no longer than its
// caller's budget (the request's deadline, carried across nodes), and on
// its caller's tenant slot.
//
// A call with an idempotency key runs once in effect: the callee records
// the key with a hash of the method and payload and with the reply, in
// the method's transaction, and answers a repeat from the record. A call
// from a receive handler without a key of its own gets one derived from
// the event and the call's index in the handler, so a redelivered event
// repeats none of its calls' effects.

// Defaults of the recorded calls' bounds.
const (
	// DefaultCallRecordAge is how long a call's record answers repeats:
	// an idempotency key older than this runs the method again.
	DefaultCallRecordAge = 24 * time.Hour
	// DefaultCallRecords bounds the records an object keeps: past it the
	// oldest go first.
	DefaultCallRecords = 10_000
	// pruneCallsEvery: an object prunes its records every this many
	// recorded calls (and at its first), so the count bound may be
	// passed by this many.
	pruneCallsEvery = 64
)

// ErrCallCycle: an object call would wait for an object already waiting
// in its chain, or the chain is too long (HTTP 508 Loop Detected).
var ErrCallCycle error = &statusError{msg: "object call refused", status: http.StatusLoopDetected}

// ErrKeyReused: an idempotency key came again with another method or
// payload than the one it was recorded with (HTTP 422, as the IETF
// Idempotency-Key draft answers it).
var ErrKeyReused error = &statusError{msg: "idempotency key reused with another request", status: http.StatusUnprocessableEntity}

// chainKey marks the context of a call made by an object: its value is
// the chain, the objects that wait for it, the first caller first.
type chainKey struct{}

func chainOf(ctx context.Context) []string {
	c, _ := ctx.Value(chainKey{}).([]string)
	return c
}

// Call runs the object call req on its callee's home. A failure the
// guest can handle is an *abi.CallError with the status and message the
// same failure has over HTTP, its names as the guest's tenant writes
// them; ctx ending (this handler's budget) is not.
func (h *objectHost) Call(ctx context.Context, req abi.CallRequest) ([]byte, error) {
	reply, err := h.call(ctx, req)
	if err != nil && ctx.Err() == nil {
		var ce *abi.CallError
		if !errors.As(err, &ce) {
			who := principal{Tenant: tenancy.TenantOf(h.o.id.Program)}
			err = &abi.CallError{Status: api.Status(err), Message: who.Strip(api.Message(err, h.o.env.budget))}
		}
	}
	return reply, err
}

func (h *objectHost) call(ctx context.Context, req abi.CallRequest) ([]byte, error) {
	index := h.calls
	h.calls++
	h.calledOut = true
	self := h.o.id.String()
	program, id, ok := strings.Cut(req.Target, "/")
	if !ok {
		return nil, fmt.Errorf("%w: call target %q must be PROGRAM/ID", ErrBadRequest, names.Clip(req.Target))
	}
	// A plain name is in the caller's tenant; another tenant's objects
	// are unknown, as to a client of this tenant.
	who := principal{Tenant: tenancy.TenantOf(h.o.id.Program)}
	target, err := names.ResolveObject(who, program, id)
	if err != nil {
		return nil, err
	}
	if len(req.Method) > abi.MaxMethodLen {
		return nil, fmt.Errorf("%w: method name longer than %d bytes", ErrBadRequest, abi.MaxMethodLen)
	}
	if len(req.Key) > abi.MaxIdempotencyKeyLen {
		return nil, fmt.Errorf("%w: idempotency key longer than %d bytes", ErrTooLarge, abi.MaxIdempotencyKeyLen)
	}
	chain := append(append([]string(nil), chainOf(h.ctx)...), self)
	if err := checkChain(chain, target.String()); err != nil {
		return nil, err
	}
	key := req.Key
	if key != "" {
		key = "key:" + key
	} else if h.event != nil {
		key = fmt.Sprintf("receive:%s:%s:%d:%d", h.event.Publisher, h.topic, h.event.Seq, index)
	}
	if key != "" {
		// A caller's keys are its own: another object's same key is
		// another call.
		key = "call:" + self + ":" + key
	}
	return h.o.env.call(ctx, target, callRequest{Method: req.Method, Payload: req.Payload, Key: key, Chain: chain})
}

// checkChain refuses a call to target from the end of chain: target
// waits in it already, or the chain would pass abi.MaxCallDepth.
func checkChain(chain []string, target string) error {
	for i, o := range chain {
		if o == target {
			return fmt.Errorf("%w: call cycle %s → %s: %s is waiting for this call already", ErrCallCycle,
				strings.Join(chain[i:], " → "), target, target)
		}
	}
	if len(chain)+1 > abi.MaxCallDepth {
		return fmt.Errorf("%w: call chain %s → %s is deeper than %d objects", ErrCallCycle,
			strings.Join(chain, " → "), target, abi.MaxCallDepth)
	}
	return nil
}

// Deadline is the end of the calling object's budget for a call an
// object made; zero for a client's.
func (h *objectHost) Deadline() time.Time {
	if len(chainOf(h.ctx)) == 0 {
		return time.Time{}
	}
	d, _ := h.ctx.Deadline()
	return d
}

// requestHash is what a key's record keeps of its request.
func requestHash(method string, payload []byte) []byte {
	s := sha256.New()
	s.Write([]byte(method))
	s.Write([]byte{0})
	s.Write(payload)
	return s.Sum(nil)
}

// callOnce runs a call's method in h's transaction, or answers a repeat
// of its key from the record; a key's first successful run is recorded
// in the same transaction. Called locked.
func (o *object) callOnce(h *objectHost, c *callRequest) ([]byte, error) {
	if c.Key == "" {
		return o.callHandler(h, c.Method, c.Payload)
	}
	hash := requestHash(c.Method, c.Payload)
	now := o.env.now()
	rec, ok, err := h.tx.RecordedCall(c.Key)
	if err != nil {
		return nil, err
	}
	if ok && !rec.At.Before(now.Add(-o.env.callRecordAge)) {
		if !rec.SameRequest(hash) {
			return nil, fmt.Errorf("%w: key %q was first used for another method or payload; use a new key for a new request", ErrKeyReused, names.Clip(displayKey(c.Key)))
		}
		o.env.metrics.callRepeats.Inc()
		return rec.Reply, nil
	}
	reply, err := o.callHandler(h, c.Method, c.Payload)
	if err != nil {
		return nil, err
	}
	if err := h.tx.RecordCall(c.Key, store.CallRecord{Request: hash, Reply: reply, At: now}); err != nil {
		return nil, err
	}
	if o.recorded%pruneCallsEvery == 0 {
		if _, err := h.tx.PruneCalls(now.Add(-o.env.callRecordAge), o.env.callRecords); err != nil {
			return nil, err
		}
	}
	o.recorded++
	return reply, nil
}

// displayKey is the key as its caller gave it.
func displayKey(k string) string {
	if s, ok := strings.CutPrefix(k, "http:"); ok {
		return s
	}
	if _, s, ok := strings.Cut(k, ":key:"); ok {
		return s
	}
	return k
}

// CallWithKey is Call once in effect per key: the first call with key
// runs the method and records its reply with it, in the method's
// transaction; a repeat with the same method and payload gets the
// recorded reply without running it, one with another fails with
// ErrKeyReused. A record lasts DefaultCallRecordAge (Config.CallRecordAge).
func (n *Node) CallWithKey(ctx context.Context, id ObjectID, method string, payload []byte, key string) ([]byte, error) {
	if key == "" {
		return n.Call(ctx, id, method, payload)
	}
	if len(key) > abi.MaxIdempotencyKeyLen {
		return nil, fmt.Errorf("%w: idempotency key is %d bytes, the limit is %d", ErrTooLarge, len(key), abi.MaxIdempotencyKeyLen)
	}
	return n.call(ctx, id, callRequest{Method: method, Payload: payload, Key: "http:" + key})
}
