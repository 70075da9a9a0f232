// Package sdk is what a Go program author imports to write a program for the
// host: a WebAssembly module whose objects each own durable state, publish
// events and follow other objects.
//
// # A program in five minutes
//
//	package main
//
//	import sdk "github.com/durable-host/host/sdk/go"
//
//	func init() {
//		sdk.Method("inc", func(payload []byte) ([]byte, error) {
//			n := sdk.GetInt("n") + 1
//			sdk.PutInt("n", n)
//			return sdk.Itoa(n), nil
//		})
//	}
//
//	func main() {}
//
// Build it as a WASI reactor and upload it:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o counter.wasm .
//	host upload counter.wasm --name counter
//	host call counter/c1 inc
//
// Register handlers in init: the host runs init once per instance, then calls
// handlers one at a time. Each object (program/id) has its own instance and
// its own SQLite file; the state functions ([Get], [Put], [Delete], [Scan])
// read and write that file inside the handler's transaction, and [Publish]
// appends to the object's event log in the same transaction. If the handler
// returns an error, panics, traps or runs past its 10 s budget, none of its
// writes and none of its events happen.
//
// # Following
//
// An object follows another object's topic with [Follow]; the publisher's
// follow hook ([OnFollow]) decides, and the follower's [OnReceive] handler then
// gets each event at least once, with exactly-once effect on its state: the
// host skips events the follower has already committed. A program with an
// [OnEvent] handler shapes what its WebSocket connections receive; without
// one, connections get the platform's forward envelope.
//
// An OnEvent handler runs on the node holding the sockets, which is usually
// not the object's home, in an instance with no object behind it: it must
// shape the frame from the event alone. [Get], [Put], [Scan], [Publish] and
// [Follow] fail the handler there, and each socket gets an error frame
// instead. The handler runs once per event on each node for all the sockets
// attached to one object, and their frames are the same bytes, so do not
// count on it running once per socket.
//
// # Alarms
//
// An object wakes itself with an alarm: [SetAlarm] in any handler, and the
// handler registered with [OnAlarm] runs at or after that time, once, in a
// transaction of its own on the object's home (activating the object if it
// was idle, after a restart or a takeover too). An object has one alarm;
// setting it again moves it, [DeleteAlarm] cancels it, [Alarm] reads it.
// Setting it is part of the handler's transaction, so a failed handler sets
// nothing. The alarm is cleared when its handler commits, unless the
// handler set the next one: keep a schedule of several wake-ups in state
// and set the alarm to the earliest.
//
//	sdk.OnAlarm(func() error {
//		return sdk.PublishJSON("ticks", map[string]int64{"at": sdk.Now()})
//	})
//	sdk.Method("start", func([]byte) ([]byte, error) {
//		return nil, sdk.SetAlarm(time.Unix(0, sdk.Now()).Add(time.Minute))
//	})
//
// A failed run (an error, a panic, past the budget) is retried after 0.5 s,
// doubling, and dropped after 8 failed runs. Compute alarm times from
// [Now], the host's clock that alarms are scheduled by (a test's injected
// clock too), rather than time.Now. A program must register OnAlarm before
// its handlers call SetAlarm: without one, SetAlarm fails.
//
// # Calling other objects
//
// A handler calls another object's method with [Call]; the callee runs on
// its home (this node or another) in its own transaction while the caller
// waits, and its reply or its error ([CallError]: an HTTP status and a
// message) comes back:
//
//	reply, err := sdk.Call("inventory/sku42", "reserve", payload)
//	var ce *sdk.CallError
//	if errors.As(err, &ce) && ce.Status == 422 {
//		// the callee refused: its own error, in ce.Message
//	}
//
// The callee commits on its own. If the caller fails after the call, the
// caller's writes roll back and the callee's stay. So make the callee's
// method safe to repeat, or key it: [CallWithKey] records the key with
// the reply in the callee, and a repeat gets the recorded reply without
// running the method again. A call from an [OnReceive] handler is keyed
// for you by the event and the call's place in the handler: a
// redelivered event repeats none of its calls' effects, provided the
// handler makes the same calls in the same order.
//
// One handler runs at a time per object, and the caller's object stays
// busy while it waits, so a call back into an object already waiting in
// the chain (A calls B calls A) fails at once with status 508, as does a
// chain of more than eight objects. The callee runs no longer than the
// caller's budget has left.
package sdk
