// Package abi is the contract between a guest program and the host: the names
// of the guest's exports, the one host import module and its functions, how
// bytes cross the boundary, the status codes and the binary encodings of the
// records that cross it.
//
// It has no dependency on the host, so the Go SDK compiles it into guests and
// the Rust SDK mirrors it by hand. Changing anything here that a built guest
// relies on means raising [Version].
//
// # How bytes cross
//
// The host never writes into guest memory it did not get a pointer to, and the
// guest never has to export an allocator. Instead the guest pulls:
//
//   - An export receives lengths, not pointers. The guest allocates that many
//     bytes in its own memory and calls [ImportInputRead] with the pointer; the
//     host copies the call's input there.
//   - A host function that produces bytes (state_get, state_scan, ...) returns
//     their length (or a negative status) and keeps them as the call's pending
//     result; the guest allocates and calls [ImportResultRead] to copy them.
//   - The guest hands bytes to the host as (pointer, length) pairs; the host
//     copies them before the host function returns.
//   - A handler's reply is set with [ImportReply]; its status is the export's
//     return value.
//
// A pointer/length pair that falls outside the guest's memory traps the guest:
// the call fails and the instance is discarded. It never harms the host.
//
// # Exports a program provides
//
//	host_abi_version() -> i32          must return Version
//	host_handlers() -> i32             optional: which optional handlers exist
//	call(method_len, payload_len i32) -> i32 status      methods
//	follow(request_len i32) -> i32 status                optional: the follow hook
//	receive(event_len i32) -> i32 status                 optional: durable follower
//	event(event_len i32) -> i32 status                   optional: connection events
//	alarm() -> i32 status                                optional: the object's alarm fired
//
// Input of call is the method name followed by the payload. Input of follow is
// an encoded [FollowRequest]; input of receive and event an encoded [Event].
//
// Go guests are WASI reactors (GOOS=wasip1, -buildmode=c-shared); the host runs
// their _initialize once per instance. Rust guests may target
// wasm32-unknown-unknown and import nothing but this module.
package abi

import "errors"

// Version is the ABI version a guest reports through ExportVersion. The host
// refuses modules that report another version. The alarm imports and export,
// and object_call, did not raise it: a guest that uses none of them imports
// none and runs on a host from before them (which ignores an export it does
// not know), and one that does is refused there at upload, naming the
// import it lacks.
const Version = 1

// ImportModule is the module name of every host function.
const ImportModule = "host"

// Export names.
const (
	ExportVersion = "host_abi_version"
	ExportCall    = "call"
	ExportFollow  = "follow"
	ExportReceive = "receive"
	ExportEvent   = "event"
	// ExportAlarm is the alarm handler: alarm() -> i32 status, run in a
	// transaction of its own once the time an alarm_set asked for has
	// come. It has no input.
	ExportAlarm = "alarm"
	// ExportHandlers is optional: host_handlers() -> i32, a bit set of the
	// Handler* values naming which optional handlers the program registered.
	// The host reads it once per module after _initialize. Without it, the
	// presence of each export decides.
	ExportHandlers = "host_handlers"
)

// Handler bits for ExportHandlers.
const (
	HandlerFollow  int32 = 1 << 0
	HandlerReceive int32 = 1 << 1
	HandlerEvent   int32 = 1 << 2
	HandlerAlarm   int32 = 1 << 3
)

// Import names, all in ImportModule. Signatures use wasm i32 (pointers,
// lengths, statuses) and i64 (times).
const (
	// input_read(ptr i32): copy the current export's input to ptr.
	ImportInputRead = "input_read"
	// result_read(ptr i32): copy the pending result of the last host function
	// that produced bytes to ptr.
	ImportResultRead = "result_read"
	// result_len() -> i32: the length of the pending result.
	ImportResultLen = "result_len"
	// reply(ptr, len i32): set the handler's reply (or error message).
	ImportReply = "reply"
	// state_get(key_ptr, key_len i32) -> i32: value length, or StatusNotFound.
	ImportStateGet = "state_get"
	// state_put(key_ptr, key_len, val_ptr, val_len i32) -> i32 status.
	ImportStatePut = "state_put"
	// state_delete(key_ptr, key_len i32) -> i32 status.
	ImportStateDelete = "state_delete"
	// state_scan(prefix_ptr, prefix_len, limit i32) -> i32: length of the
	// encoded pairs (see EncodePairs), pending for result_read.
	ImportStateScan = "state_scan"
	// publish(topic_ptr, topic_len, payload_ptr, payload_len i32) -> i32
	// status: append an event to this object's log, in the handler's
	// transaction.
	ImportPublish = "publish"
	// follow(request_ptr, request_len i32) -> i32 status: make this object a
	// durable follower of another object's topic. The request is an encoded
	// FollowRequest; the host fills in the follower fields. The publisher's
	// follow hook runs before this returns; on StatusRefused the reason is
	// pending (result_len, result_read).
	ImportFollow = "follow"
	// unfollow(request_ptr, request_len i32) -> i32 status.
	ImportUnfollow = "unfollow"
	// log(level, ptr, len i32).
	ImportLog = "log"
	// time_now() -> i64: wall clock, Unix nanoseconds.
	ImportTimeNow = "time_now"
	// random_fill(ptr, len i32): fill with cryptographically random bytes.
	ImportRandomFill = "random_fill"
	// self_id() -> i32: length of this object's "program/id", pending for
	// result_read.
	ImportSelfID = "self_id"
	// alarm_set(unix_ms i64) -> i32 status: set the object's one alarm
	// (replacing any other) to run the alarm export at or after unix_ms,
	// in the handler's transaction. A time already past runs it at once.
	// StatusBadRequest (the reason pending for result_read) for a
	// negative time, more than MaxAlarmAheadMs ahead, or a program
	// without an alarm handler.
	ImportAlarmSet = "alarm_set"
	// alarm_get() -> i64: the pending alarm's time in Unix milliseconds,
	// or -1 when none is set.
	ImportAlarmGet = "alarm_get"
	// alarm_delete() -> i32 status: cancel the pending alarm, in the
	// handler's transaction.
	ImportAlarmDelete = "alarm_delete"
	// object_call(request_ptr, request_len i32) -> i32: run a method of
	// another object on its home, in that object's own transaction, and
	// wait for it. The request is an encoded CallRequest. It returns the
	// reply's length, pending for result_read, or StatusError with an
	// encoded CallError pending (result_len, result_read): the failure's
	// HTTP status and message. The callee commits on its own: the
	// caller's later failure does not undo it. A call to an object
	// already in the chain of calls that led here, or past MaxCallDepth
	// objects, fails at once; the callee runs at most until the caller's
	// budget ends.
	ImportCall = "object_call"
)

// MaxCallDepth bounds a chain of object calls: a call that would make
// more than this many objects wait on each other fails at once (HTTP
// status 508).
const MaxCallDepth = 8

// Status codes returned by exports and host functions. Non-negative lengths
// are returned where a function produces bytes, so statuses are negative,
// except StatusOK.
const (
	StatusOK int32 = 0
	// StatusError: the handler failed; its reply is the error message.
	StatusError int32 = -1
	// StatusNotFound: no such key (state_get) or no such method (call).
	StatusNotFound int32 = -2
	// StatusRefused: a follow was refused; the reply (from a follow hook) or
	// the pending result (from the follow import) says why.
	StatusRefused int32 = -3
	// StatusTooLarge: a key, value, topic or payload exceeds its limit.
	StatusTooLarge int32 = -4
	// StatusBadRequest: malformed input to a host function.
	StatusBadRequest int32 = -5
	// StatusUnavailable: the host cannot do it now (for example the target
	// object of a follow is unknown).
	StatusUnavailable int32 = -6
	// StatusSkip: from event, the connection gets nothing for this event.
	StatusSkip int32 = -7
)

// Errors that mean a status, the one set every part of the host uses: a
// host function answers a guest with the status, the HTTP API with the
// matching code, and nothing translates between them.
var (
	// ErrTooLarge is StatusTooLarge (HTTP 413).
	ErrTooLarge = errors.New("too large")
	// ErrBadRequest is StatusBadRequest (HTTP 400).
	ErrBadRequest = errors.New("bad request")
	// ErrUnavailable is StatusUnavailable (HTTP 503).
	ErrUnavailable = errors.New("unavailable")
)

// Limits a guest can rely on; the host refuses larger inputs with
// StatusTooLarge.
const (
	MaxKeyLen     = 1 << 10
	MaxValueLen   = 1 << 20
	MaxTopicLen   = 256
	MaxPayloadLen = 1 << 20
	MaxReplyLen   = 4 << 20
	MaxMethodLen  = 256
	// MaxFollowRequestLen bounds an encoded follow request (StatusTooLarge).
	MaxFollowRequestLen = 64 << 10
	// MaxCallRequestLen bounds an encoded call request: the payload's
	// limit and room for the target, method and key.
	MaxCallRequestLen = MaxPayloadLen + 4<<10
	// MaxIdempotencyKeyLen bounds a call's idempotency key.
	MaxIdempotencyKeyLen = 256
	// MaxLogLen: log lines are truncated to this many bytes.
	MaxLogLen = 16 << 10
	// MaxRandomLen: one random_fill may ask for at most this many bytes;
	// more traps the guest (the SDKs split larger requests).
	MaxRandomLen = 64 << 10
	// MaxAlarmAheadMs is how far ahead an alarm may be set, in
	// milliseconds (about ten years); further is refused with
	// StatusBadRequest, as a unit mistake (seconds or nanoseconds for
	// milliseconds) more likely than a plan.
	MaxAlarmAheadMs = 10 * 365 * 24 * 3600 * 1000
)

// Log levels for ImportLog.
const (
	LogDebug int32 = 0
	LogInfo  int32 = 1
	LogWarn  int32 = 2
	LogError int32 = 3
)
