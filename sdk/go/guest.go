//go:build wasip1

package sdk

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/durable-host/host/abi"
)

//go:wasmimport host input_read
func hostInputRead(ptr unsafe.Pointer)

//go:wasmimport host result_read
func hostResultRead(ptr unsafe.Pointer)

//go:wasmimport host result_len
func hostResultLen() int32

//go:wasmimport host reply
func hostReply(ptr unsafe.Pointer, n int32)

//go:wasmimport host state_get
func hostStateGet(kp unsafe.Pointer, kn int32) int32

//go:wasmimport host state_put
func hostStatePut(kp unsafe.Pointer, kn int32, vp unsafe.Pointer, vn int32) int32

//go:wasmimport host state_delete
func hostStateDelete(kp unsafe.Pointer, kn int32) int32

//go:wasmimport host state_scan
func hostStateScan(pp unsafe.Pointer, pn int32, limit int32) int32

//go:wasmimport host publish
func hostPublish(tp unsafe.Pointer, tn int32, pp unsafe.Pointer, pn int32) int32

//go:wasmimport host follow
func hostFollow(rp unsafe.Pointer, rn int32) int32

//go:wasmimport host unfollow
func hostUnfollow(rp unsafe.Pointer, rn int32) int32

//go:wasmimport host log
func hostLog(level int32, p unsafe.Pointer, n int32)

//go:wasmimport host time_now
func hostTimeNow() int64

//go:wasmimport host random_fill
func hostRandomFill(p unsafe.Pointer, n int32)

//go:wasmimport host self_id
func hostSelfID() int32

//go:wasmimport host alarm_set
func hostAlarmSet(unixMs int64) int32

//go:wasmimport host alarm_get
func hostAlarmGet() int64

//go:wasmimport host alarm_delete
func hostAlarmDelete() int32

//go:wasmimport host object_call
func hostObjectCall(rp unsafe.Pointer, rn int32) int32

func strPtr(s string) (unsafe.Pointer, int32) {
	return unsafe.Pointer(unsafe.StringData(s)), int32(len(s))
}

func bytesPtr(b []byte) (unsafe.Pointer, int32) {
	return unsafe.Pointer(unsafe.SliceData(b)), int32(len(b))
}

// readResult copies the host's pending result of length n.
func readResult(n int32) []byte {
	b := make([]byte, n)
	if n > 0 {
		hostResultRead(unsafe.Pointer(&b[0]))
	}
	return b
}

func readInput(n int32) []byte {
	b := make([]byte, n)
	if n > 0 {
		hostInputRead(unsafe.Pointer(&b[0]))
	}
	return b
}

func statusErr(op string, st int32) error {
	switch st {
	case abi.StatusOK:
		return nil
	case abi.StatusTooLarge:
		return fmt.Errorf("%s: too large", op)
	case abi.StatusBadRequest:
		return fmt.Errorf("%s: bad request", op)
	case abi.StatusUnavailable:
		return fmt.Errorf("%s: unavailable", op)
	}
	return fmt.Errorf("%s: status %d", op, st)
}

// Get returns the value stored under key in this object's state.
func Get(key string) ([]byte, bool) {
	kp, kn := strPtr(key)
	n := hostStateGet(kp, kn)
	if n < 0 {
		return nil, false
	}
	return readResult(n), true
}

// Put stores value under key. It panics (failing the call) only when the key
// or value is over the ABI's limits; use PutChecked to handle that.
func Put(key string, value []byte) {
	if err := PutChecked(key, value); err != nil {
		panic(err)
	}
}

// PutChecked stores value under key and reports a refused write.
func PutChecked(key string, value []byte) error {
	kp, kn := strPtr(key)
	vp, vn := bytesPtr(value)
	return statusErr("put "+key, hostStatePut(kp, kn, vp, vn))
}

// Delete removes key from this object's state.
func Delete(key string) {
	kp, kn := strPtr(key)
	hostStateDelete(kp, kn)
}

// KV is one key/value pair from Scan.
type KV struct {
	Key   string
	Value []byte
}

// Scan returns up to limit pairs whose key starts with prefix, in key order.
func Scan(prefix string, limit int) []KV {
	pp, pn := strPtr(prefix)
	n := hostStateScan(pp, pn, int32(limit))
	if n <= 0 {
		return nil
	}
	pairs, err := abi.DecodePairs(readResult(n))
	if err != nil {
		panic(err)
	}
	out := make([]KV, len(pairs))
	for i, p := range pairs {
		out[i] = KV{Key: string(p.Key), Value: p.Value}
	}
	return out
}

// Publish appends an event to this object's log on topic. It becomes visible
// to followers when the handler's transaction commits.
func Publish(topic string, payload []byte) error {
	tp, tn := strPtr(topic)
	pp, pn := bytesPtr(payload)
	return statusErr("publish", hostPublish(tp, tn, pp, pn))
}

// FollowOptions are the optional parts of a follow.
type FollowOptions struct {
	Filter string // "" for every event; see the host's README for the syntax
	Params []byte // presented to the publisher's follow hook
}

// Follow makes this object a durable follower of publisher's ("program/id")
// topic. The publisher's follow hook runs before Follow returns; its refusal
// comes back as an error. Delivery starts at the publisher's current head and
// arrives through OnReceive.
func Follow(publisher, topic string, opt FollowOptions) error {
	req := abi.AppendFollowRequest(nil, &abi.FollowRequest{
		Publisher: publisher, Topic: topic, Filter: opt.Filter,
		Kind: abi.FollowerObject, Params: opt.Params,
	})
	rp, rn := bytesPtr(req)
	st := hostFollow(rp, rn)
	switch st {
	case abi.StatusRefused:
		return Refuse(string(readResult(hostResultLen())))
	case abi.StatusBadRequest, abi.StatusUnavailable:
		if why := readResult(hostResultLen()); len(why) > 0 {
			return fmt.Errorf("follow %s: %s", publisher, why)
		}
	}
	return statusErr("follow "+publisher, st)
}

// Unfollow removes this object's edge on publisher's topic.
func Unfollow(publisher, topic string) error {
	req := abi.AppendFollowRequest(nil, &abi.FollowRequest{Publisher: publisher, Topic: topic, Kind: abi.FollowerObject})
	rp, rn := bytesPtr(req)
	return statusErr("unfollow "+publisher, hostUnfollow(rp, rn))
}

// Log writes a line to the node's log, tagged with this object.
func Log(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	p, n := strPtr(s)
	hostLog(abi.LogInfo, p, n)
}

// Now returns the host's wall clock in Unix nanoseconds.
func Now() int64 { return hostTimeNow() }

// Random fills b with cryptographically random bytes from the host.
func Random(b []byte) {
	for len(b) > 0 {
		chunk := b[:min(len(b), abi.MaxRandomLen)]
		p, n := bytesPtr(chunk)
		hostRandomFill(p, n)
		b = b[len(chunk):]
	}
}

// Self returns this object's "program/id".
func Self() string { return string(readResult(hostSelfID())) }

// SetAlarm sets this object's alarm: at or after t (to the millisecond)
// the handler registered with [OnAlarm] runs, once, in a transaction of its
// own, on the object's home, even if the node restarted or the object
// moved meanwhile. An object has one alarm; setting it again replaces it.
// It is part of this handler's transaction: if the handler fails, no alarm
// is set. A time already past runs the alarm at once.
//
// It fails when the program registers no OnAlarm handler, or t is before
// 1970 or more than ten years ahead.
func SetAlarm(t time.Time) error {
	st := hostAlarmSet(t.UnixMilli())
	if st == abi.StatusBadRequest {
		if why := readResult(hostResultLen()); len(why) > 0 {
			return fmt.Errorf("set alarm: %s", why)
		}
	}
	return statusErr("set alarm", st)
}

// Alarm returns the time of this object's pending alarm, if one is set.
func Alarm() (time.Time, bool) {
	ms := hostAlarmGet()
	if ms < 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// DeleteAlarm cancels this object's pending alarm, in this handler's
// transaction.
func DeleteAlarm() error { return statusErr("delete alarm", hostAlarmDelete()) }

// Call runs method on another object ("program/id", in this program's
// tenant) with payload and returns its reply. The callee runs on its
// home, wherever that is, in its own transaction, while this handler
// waits; it runs no longer than what is left of this handler's budget.
//
// The callee's effects commit on their own: if this handler fails
// afterwards, its own writes roll back and the callee's stay. Make the
// callee's method safe to repeat, or give the call a key (CallWithKey):
// a call from an OnReceive handler gets one derived from the event and
// the call's place in the handler, so a redelivered event repeats no
// call's effect.
//
// A failure is a *CallError: the callee's own error (Status 422), no
// such object or method (404), a call back into an object already
// waiting in this chain of calls or a chain deeper than eight objects
// (508), the budget (504), an unreachable home (503) ...
func Call(target, method string, payload []byte) ([]byte, error) {
	return CallWithKey(target, method, payload, "")
}

// CallWithKey is Call once in effect per key: the callee records the key
// with its reply, and a call with the same key (from this object) gets
// that reply without the method running again, for as long as the
// callee keeps the record (a day by default). The same key with another
// method or payload fails with Status 422.
func CallWithKey(target, method string, payload []byte, key string) ([]byte, error) {
	req := abi.AppendCallRequest(nil, &abi.CallRequest{Target: target, Method: method, Key: key, Payload: payload})
	rp, rn := bytesPtr(req)
	n := hostObjectCall(rp, rn)
	if n >= 0 {
		return readResult(n), nil
	}
	ce, err := abi.DecodeCallError(readResult(hostResultLen()))
	if err != nil {
		ce = abi.CallError{Status: 500, Message: fmt.Sprintf("call %s.%s: status %d", target, method, n)}
	}
	return nil, &CallError{Status: ce.Status, Message: ce.Message}
}

func reply(b []byte) {
	p, n := bytesPtr(b)
	hostReply(p, n)
}

// run calls f, turning an error or a panic into an error reply.
func run(f func() ([]byte, error)) (status int32) {
	defer func() {
		if r := recover(); r != nil {
			reply([]byte(fmt.Sprintf("panic: %v\n%s", r, debug.Stack())))
			status = abi.StatusError
		}
	}()
	out, err := f()
	if err != nil {
		var ref *refusal
		switch {
		case errors.As(err, &ref):
			reply([]byte(ref.reason))
			return abi.StatusRefused
		case errors.Is(err, ErrSkip):
			return abi.StatusSkip
		}
		reply([]byte(err.Error()))
		return abi.StatusError
	}
	if out != nil {
		reply(out)
	}
	return abi.StatusOK
}

//go:wasmexport host_abi_version
func exportVersion() int32 { return abi.Version }

//go:wasmexport host_handlers
func exportHandlers() int32 {
	var h int32
	if onFollow != nil {
		h |= abi.HandlerFollow
	}
	if onRecv != nil {
		h |= abi.HandlerReceive
	}
	if onEvent != nil {
		h |= abi.HandlerEvent
	}
	if onAlarm != nil {
		h |= abi.HandlerAlarm
	}
	return h
}

//go:wasmexport call
func exportCall(methodLen, payloadLen int32) int32 {
	in := readInput(methodLen + payloadLen)
	h, ok := methods[string(in[:methodLen])]
	if !ok {
		return abi.StatusNotFound
	}
	return run(func() ([]byte, error) { return h(in[methodLen:]) })
}

//go:wasmexport follow
func exportFollow(n int32) int32 {
	if onFollow == nil {
		return abi.StatusOK
	}
	r, err := abi.DecodeFollowRequest(readInput(n))
	if err != nil {
		return abi.StatusBadRequest
	}
	return run(func() ([]byte, error) {
		return nil, onFollow(FollowRequest{
			Topic: r.Topic, Filter: r.Filter, Kind: r.Kind.String(),
			Follower: r.Follower, Tenant: r.Tenant, Params: r.Params,
		})
	})
}

func readEvent(n int32) (Event, bool) {
	e, err := abi.DecodeEvent(readInput(n))
	if err != nil {
		return Event{}, false
	}
	return Event{Publisher: e.Publisher, Topic: e.Topic, Seq: e.Seq, Time: e.Time, Payload: e.Payload}, true
}

//go:wasmexport receive
func exportReceive(n int32) int32 {
	if onRecv == nil {
		return abi.StatusNotFound
	}
	e, ok := readEvent(n)
	if !ok {
		return abi.StatusBadRequest
	}
	return run(func() ([]byte, error) { return nil, onRecv(e) })
}

//go:wasmexport event
func exportEvent(n int32) int32 {
	if onEvent == nil {
		return abi.StatusNotFound
	}
	e, ok := readEvent(n)
	if !ok {
		return abi.StatusBadRequest
	}
	return run(func() ([]byte, error) { return onEvent(e) })
}

//go:wasmexport alarm
func exportAlarm() int32 {
	if onAlarm == nil {
		return abi.StatusNotFound
	}
	return run(func() ([]byte, error) { return nil, onAlarm() })
}
