package vm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/durable-host/host/abi"
)

var i32 = api.ValueTypeI32

type hostFunc struct {
	name    string
	params  []api.ValueType
	results []api.ValueType
	fn      func(i *Instance, m api.Module, stack []uint64)
}

var hostFuncs = []hostFunc{
	{abi.ImportInputRead, []api.ValueType{i32}, nil, hInputRead},
	{abi.ImportResultRead, []api.ValueType{i32}, nil, hResultRead},
	{abi.ImportResultLen, nil, []api.ValueType{i32}, hResultLen},
	{abi.ImportReply, []api.ValueType{i32, i32}, nil, hReply},
	{abi.ImportStateGet, []api.ValueType{i32, i32}, []api.ValueType{i32}, hStateGet},
	{abi.ImportStatePut, []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, hStatePut},
	{abi.ImportStateDelete, []api.ValueType{i32, i32}, []api.ValueType{i32}, hStateDelete},
	{abi.ImportStateScan, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}, hStateScan},
	{abi.ImportPublish, []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, hPublish},
	{abi.ImportFollow, []api.ValueType{i32, i32}, []api.ValueType{i32}, hFollow},
	{abi.ImportUnfollow, []api.ValueType{i32, i32}, []api.ValueType{i32}, hUnfollow},
	{abi.ImportLog, []api.ValueType{i32, i32, i32}, nil, hLog},
	{abi.ImportTimeNow, nil, []api.ValueType{api.ValueTypeI64}, hTimeNow},
	{abi.ImportRandomFill, []api.ValueType{i32, i32}, nil, hRandomFill},
	{abi.ImportSelfID, nil, []api.ValueType{i32}, hSelfID},
	{abi.ImportAlarmSet, []api.ValueType{api.ValueTypeI64}, []api.ValueType{i32}, hAlarmSet},
	{abi.ImportAlarmGet, nil, []api.ValueType{api.ValueTypeI64}, hAlarmGet},
	{abi.ImportAlarmDelete, nil, []api.ValueType{i32}, hAlarmDelete},
	{abi.ImportCall, []api.ValueType{i32, i32}, []api.ValueType{i32}, hCall},
}

var knownImport = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range hostFuncs {
		m[f.name] = true
	}
	return m
}()

func (e *Engine) defineHostModule(ctx context.Context) error {
	b := e.rt.NewHostModuleBuilder(abi.ImportModule)
	for _, f := range hostFuncs {
		fn := f.fn
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
				inst, _ := ctx.Value(instKey{}).(*Instance)
				if inst == nil {
					panic(&abiViolation{"host function called outside a handler"})
				}
				fn(inst, m, stack)
			}), f.params, f.results).
			Export(f.name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// read copies n bytes at ptr out of guest memory; out of bounds or over
// limit traps.
func read(m api.Module, ptr, n uint64, limit int) []byte {
	v, ok := view(m, ptr, n, limit)
	if !ok {
		panic(&abiViolation{"length over the limit"})
	}
	// The view goes stale if memory grows; copy.
	return append([]byte(nil), v...)
}

// view returns guest memory without copying, for values consumed before the
// host function returns. A range outside memory traps; a range over limit
// reports false (the caller answers StatusTooLarge).
func view(m api.Module, ptr, n uint64, limit int) ([]byte, bool) {
	p, l := uint32(ptr), uint32(n)
	if uint64(p)+uint64(l) > uint64(m.Memory().Size()) {
		panic(&abiViolation{"pointer outside guest memory"})
	}
	if int(l) > limit {
		return nil, false
	}
	v, _ := m.Memory().Read(p, l)
	return v, true
}

func write(m api.Module, ptr uint64, b []byte) {
	if !m.Memory().Write(uint32(ptr), b) {
		panic(&abiViolation{"pointer outside guest memory"})
	}
}

func status(s int32) uint64 { return uint64(uint32(s)) }

func needHost(i *Instance) Host {
	if i.host == nil {
		panic(&abiViolation{"state and events are only reachable inside a handler, not during initialization"})
	}
	return i.host
}

func hInputRead(i *Instance, m api.Module, s []uint64) { write(m, s[0], i.input) }

func hResultRead(i *Instance, m api.Module, s []uint64) { write(m, s[0], i.result) }

func hResultLen(i *Instance, m api.Module, s []uint64) { s[0] = uint64(len(i.result)) }

func hReply(i *Instance, m api.Module, s []uint64) {
	v, ok := view(m, s[0], s[1], abi.MaxReplyLen)
	if !ok {
		panic(&abiViolation{"reply larger than the limit"})
	}
	i.reply = append(i.reply[:0], v...)
}

// hostErr maps a Host error to a status, or traps for errors that must end
// the call (a cancelled context: the budget ran out). A Host returns
// abi.ErrTooLarge, abi.ErrBadRequest or abi.ErrUnavailable (wrapped) to
// answer with that status rather than fail the call.
func hostErr(i *Instance, err error) uint64 {
	if err == nil {
		return status(abi.StatusOK)
	}
	if i.ctx.Err() != nil {
		panic(err)
	}
	var ref *RefusedError
	switch {
	case errors.As(err, &ref):
		i.result = []byte(ref.Reason)
		return status(abi.StatusRefused)
	case errors.Is(err, abi.ErrTooLarge):
		return status(abi.StatusTooLarge)
	case errors.Is(err, abi.ErrBadRequest):
		i.result = []byte(err.Error())
		return status(abi.StatusBadRequest)
	case errors.Is(err, abi.ErrUnavailable):
		i.result = []byte(err.Error())
		return status(abi.StatusUnavailable)
	}
	// Storage failures are not the guest's to handle: fail the call.
	panic(err)
}

func hStateGet(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	k, ok := view(m, s[0], s[1], abi.MaxKeyLen)
	if !ok {
		s[0] = status(abi.StatusTooLarge)
		return
	}
	v, found, err := h.Get(i.ctx, k)
	if err != nil {
		s[0] = hostErr(i, err)
		return
	}
	if !found {
		s[0] = status(abi.StatusNotFound)
		return
	}
	i.result = v
	s[0] = uint64(len(v))
}

func hStatePut(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	k, ok1 := view(m, s[0], s[1], abi.MaxKeyLen)
	v, ok2 := view(m, s[2], s[3], abi.MaxValueLen)
	if !ok1 || !ok2 {
		s[0] = status(abi.StatusTooLarge)
		return
	}
	s[0] = hostErr(i, h.Put(i.ctx, k, v))
}

func hStateDelete(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	k, ok := view(m, s[0], s[1], abi.MaxKeyLen)
	if !ok {
		s[0] = status(abi.StatusTooLarge)
		return
	}
	s[0] = hostErr(i, h.Delete(i.ctx, k))
}

func hStateScan(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	p, ok := view(m, s[0], s[1], abi.MaxKeyLen)
	if !ok {
		s[0] = status(abi.StatusTooLarge)
		return
	}
	limit := int(int32(uint32(s[2])))
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	pairs, err := h.Scan(i.ctx, p, limit)
	if err != nil {
		s[0] = hostErr(i, err)
		return
	}
	i.result = abi.AppendPairs(nil, pairs)
	if len(i.result) > abi.MaxReplyLen {
		i.result = nil
		s[0] = status(abi.StatusTooLarge)
		return
	}
	s[0] = uint64(len(i.result))
}

func hPublish(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	t, ok1 := view(m, s[0], s[1], abi.MaxTopicLen)
	p, ok2 := view(m, s[2], s[3], abi.MaxPayloadLen)
	if !ok1 || !ok2 {
		s[0] = status(abi.StatusTooLarge)
		return
	}
	if len(t) == 0 {
		s[0] = status(abi.StatusBadRequest)
		return
	}
	s[0] = hostErr(i, h.Publish(i.ctx, string(t), p))
}

func followReq(m api.Module, s []uint64) (abi.FollowRequest, int32) {
	b, ok := view(m, s[0], s[1], abi.MaxFollowRequestLen)
	if !ok {
		return abi.FollowRequest{}, abi.StatusTooLarge
	}
	r, err := abi.DecodeFollowRequest(append([]byte(nil), b...))
	if err != nil {
		return r, abi.StatusBadRequest
	}
	return r, abi.StatusOK
}

func hFollow(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	r, st := followReq(m, s)
	if st != abi.StatusOK {
		s[0] = status(st)
		return
	}
	s[0] = hostErr(i, h.Follow(i.ctx, r))
}

func hUnfollow(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	r, st := followReq(m, s)
	if st != abi.StatusOK {
		s[0] = status(st)
		return
	}
	s[0] = hostErr(i, h.Unfollow(i.ctx, r))
}

func hLog(i *Instance, m api.Module, s []uint64) {
	n := min(uint32(s[2]), abi.MaxLogLen)
	v, _ := view(m, s[1], uint64(n), abi.MaxLogLen)
	if i.host != nil {
		i.host.Log(int32(uint32(s[0])), string(v))
		return
	}
	i.e.cfg.Logger.Info("guest", slog.String("msg", string(v)))
}

func hTimeNow(i *Instance, _ api.Module, s []uint64) {
	now := time.Now()
	if i.host != nil {
		now = i.host.Now()
	}
	s[0] = uint64(now.UnixNano())
}

func hRandomFill(_ *Instance, m api.Module, s []uint64) {
	v, ok := view(m, s[0], s[1], abi.MaxRandomLen)
	if !ok {
		panic(&abiViolation{"random_fill asks for more than 64 KiB"})
	}
	_, _ = rand.Read(v)
}

func hSelfID(i *Instance, _ api.Module, s []uint64) {
	h := needHost(i)
	i.result = []byte(h.Self())
	s[0] = uint64(len(i.result))
}

func hAlarmSet(i *Instance, _ api.Module, s []uint64) {
	h := needHost(i)
	ms := int64(s[0])
	if ms < 0 {
		i.result = []byte("alarm time must be Unix milliseconds, not negative")
		s[0] = status(abi.StatusBadRequest)
		return
	}
	s[0] = hostErr(i, h.SetAlarm(i.ctx, time.UnixMilli(ms)))
}

func hAlarmGet(i *Instance, _ api.Module, s []uint64) {
	t, ok, err := needHost(i).Alarm(i.ctx)
	if err != nil {
		// Reading the file failed: not the guest's to handle.
		panic(err)
	}
	if !ok {
		s[0] = uint64(^uint64(0)) // -1
		return
	}
	s[0] = uint64(t.UnixMilli())
}

func hAlarmDelete(i *Instance, _ api.Module, s []uint64) {
	s[0] = hostErr(i, needHost(i).DeleteAlarm(i.ctx))
}

// hCall runs another object's method while the guest waits inside the
// import: the caller's instance and its object's lock stay held, which
// the host makes safe by refusing cycles. The callee's context ends with
// this handler's budget.
func hCall(i *Instance, m api.Module, s []uint64) {
	h := needHost(i)
	b, ok := view(m, s[0], s[1], abi.MaxCallRequestLen)
	if !ok {
		i.result = abi.AppendCallError(nil, &abi.CallError{Status: 413, Message: fmt.Sprintf("call request larger than %d bytes", abi.MaxCallRequestLen)})
		s[0] = status(abi.StatusError)
		return
	}
	req, err := abi.DecodeCallRequest(append([]byte(nil), b...))
	if err != nil {
		i.result = abi.AppendCallError(nil, &abi.CallError{Status: 400, Message: "malformed call request"})
		s[0] = status(abi.StatusError)
		return
	}
	ctx, cancel := context.WithDeadline(i.ctx, i.began.Add(i.budget))
	defer cancel()
	reply, err := h.Call(ctx, req)
	var ce *abi.CallError
	switch {
	case err == nil:
		i.result = reply
		s[0] = uint64(len(reply))
	case ctx.Err() != nil:
		// This handler's budget ended while it waited: it fails as one
		// past its budget, whether or not the watchdog saw it yet.
		i.expired.Store(true)
		panic(err)
	case errors.As(err, &ce):
		i.result = abi.AppendCallError(nil, ce)
		s[0] = status(abi.StatusError)
	default:
		s[0] = hostErr(i, err)
	}
}
