//! `host_sdk` is what a Rust program author uses to write a program for the
//! host: a WebAssembly module whose objects each own durable state, publish
//! events and follow other objects. It implements the ABI documented in the
//! Go package `abi` (abi/abi.go, abi/encoding.go) by hand and has no
//! dependencies beyond `std`.
//!
//! A program registers its handlers in one function and names it with
//! [`program!`], which defines the module's exports:
//!
//! ```ignore
//! use host_sdk::{Program, Result};
//!
//! host_sdk::program!(register);
//!
//! fn register(p: &mut Program) {
//!     p.method("inc", |_payload| -> Result<Vec<u8>> {
//!         let n = host_sdk::get_int("n") + 1;
//!         host_sdk::put_int("n", n)?;
//!         Ok(host_sdk::itoa(n))
//!     });
//! }
//! ```
//!
//! Build for `wasm32-unknown-unknown` with `-C panic=abort` (see README.md).
//! wasm32-unknown-unknown has no module initializer, so the SDK runs the
//! register function lazily, the first time the host calls any export (the
//! host calls `host_abi_version` when it checks a module, so a register
//! function that panics makes the upload fail cleanly).
//!
//! Each handler runs inside the object's transaction: if it returns an error
//! (or panics, which traps the instance), none of its writes and none of its
//! events happen.

#![allow(clippy::missing_safety_doc)]

use std::fmt;

/// The ABI version this SDK speaks (abi.Version).
pub const ABI_VERSION: i32 = 1;

/// Status codes returned by exports and host functions (abi.Status*).
pub mod status {
    pub const OK: i32 = 0;
    pub const ERROR: i32 = -1;
    pub const NOT_FOUND: i32 = -2;
    pub const REFUSED: i32 = -3;
    pub const TOO_LARGE: i32 = -4;
    pub const BAD_REQUEST: i32 = -5;
    pub const UNAVAILABLE: i32 = -6;
    pub const SKIP: i32 = -7;
}

/// Bits of the `host_handlers` export (abi.Handler*).
pub mod handlers {
    pub const FOLLOW: i32 = 1 << 0;
    pub const RECEIVE: i32 = 1 << 1;
    pub const EVENT: i32 = 1 << 2;
    pub const ALARM: i32 = 1 << 3;
}

/// Log levels (abi.Log*).
pub mod level {
    pub const DEBUG: i32 = 0;
    pub const INFO: i32 = 1;
    pub const WARN: i32 = 2;
    pub const ERROR: i32 = 3;
}

/// Limits a guest can rely on (abi.Max*).
pub mod limits {
    pub const MAX_KEY_LEN: usize = 1 << 10;
    pub const MAX_VALUE_LEN: usize = 1 << 20;
    pub const MAX_TOPIC_LEN: usize = 256;
    pub const MAX_PAYLOAD_LEN: usize = 1 << 20;
    pub const MAX_REPLY_LEN: usize = 4 << 20;
    pub const MAX_METHOD_LEN: usize = 256;
}

/// The host imports, module "host". Raw and unsafe: use the wrappers.
pub mod sys {
    #[cfg(target_arch = "wasm32")]
    #[link(wasm_import_module = "host")]
    extern "C" {
        #[link_name = "input_read"]
        pub fn input_read(ptr: *mut u8);
        #[link_name = "result_read"]
        pub fn result_read(ptr: *mut u8);
        #[link_name = "result_len"]
        pub fn result_len() -> i32;
        #[link_name = "reply"]
        pub fn reply(ptr: *const u8, len: i32);
        #[link_name = "state_get"]
        pub fn state_get(kp: *const u8, kn: i32) -> i32;
        #[link_name = "state_put"]
        pub fn state_put(kp: *const u8, kn: i32, vp: *const u8, vn: i32) -> i32;
        #[link_name = "state_delete"]
        pub fn state_delete(kp: *const u8, kn: i32) -> i32;
        #[link_name = "state_scan"]
        pub fn state_scan(pp: *const u8, pn: i32, limit: i32) -> i32;
        #[link_name = "publish"]
        pub fn publish(tp: *const u8, tn: i32, pp: *const u8, pn: i32) -> i32;
        #[link_name = "follow"]
        pub fn follow(rp: *const u8, rn: i32) -> i32;
        #[link_name = "unfollow"]
        pub fn unfollow(rp: *const u8, rn: i32) -> i32;
        #[link_name = "log"]
        pub fn log(level: i32, p: *const u8, n: i32);
        #[link_name = "time_now"]
        pub fn time_now() -> i64;
        #[link_name = "random_fill"]
        pub fn random_fill(p: *mut u8, n: i32);
        #[link_name = "self_id"]
        pub fn self_id() -> i32;
        #[link_name = "alarm_set"]
        pub fn alarm_set(unix_ms: i64) -> i32;
        #[link_name = "alarm_get"]
        pub fn alarm_get() -> i64;
        #[link_name = "alarm_delete"]
        pub fn alarm_delete() -> i32;
        #[link_name = "object_call"]
        pub fn object_call(rp: *const u8, rn: i32) -> i32;
    }

    // Off wasm (cargo check, doc tests on the build machine) the imports do
    // not exist; these stand-ins keep the crate compiling and abort if run.
    #[cfg(not(target_arch = "wasm32"))]
    mod stub {
        fn no() -> ! {
            panic!("host_sdk: host functions exist only inside the host's WebAssembly VM")
        }
        pub unsafe fn input_read(_: *mut u8) { no() }
        pub unsafe fn result_read(_: *mut u8) { no() }
        pub unsafe fn result_len() -> i32 { no() }
        pub unsafe fn reply(_: *const u8, _: i32) { no() }
        pub unsafe fn state_get(_: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn state_put(_: *const u8, _: i32, _: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn state_delete(_: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn state_scan(_: *const u8, _: i32, _: i32) -> i32 { no() }
        pub unsafe fn publish(_: *const u8, _: i32, _: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn follow(_: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn unfollow(_: *const u8, _: i32) -> i32 { no() }
        pub unsafe fn log(_: i32, _: *const u8, _: i32) { no() }
        pub unsafe fn time_now() -> i64 { no() }
        pub unsafe fn random_fill(_: *mut u8, _: i32) { no() }
        pub unsafe fn self_id() -> i32 { no() }
        pub unsafe fn alarm_set(_: i64) -> i32 { no() }
        pub unsafe fn alarm_get() -> i64 { no() }
        pub unsafe fn alarm_delete() -> i32 { no() }
        pub unsafe fn object_call(_: *const u8, _: i32) -> i32 { no() }
    }
    #[cfg(not(target_arch = "wasm32"))]
    pub use stub::*;
}

// ---------------------------------------------------------------------------
// Errors

/// What a handler returns instead of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The handler failed; the message is the error reply (StatusError).
    Failed(String),
    /// A follow is refused with a reason the follower sees (StatusRefused).
    /// [`follow`] returns it when the publisher refuses.
    Refused(String),
    /// From an `on_event` handler: send nothing to the connection
    /// (StatusSkip).
    Skip,
}

impl Error {
    /// An error reply with message `msg`.
    pub fn new(msg: impl Into<String>) -> Error {
        Error::Failed(msg.into())
    }
    /// A refusal with `reason`, for follow hooks.
    pub fn refuse(reason: impl Into<String>) -> Error {
        Error::Refused(reason.into())
    }
    /// The text the host sees: the message or the reason.
    pub fn message(&self) -> &str {
        match self {
            Error::Failed(m) | Error::Refused(m) => m,
            Error::Skip => "skip",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::Failed(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Error {
        Error::Failed(s.to_string())
    }
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for `Err(Error::new(msg))`.
pub fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::new(msg))
}

fn status_err(op: &str, st: i32) -> Result<()> {
    match st {
        status::OK => Ok(()),
        status::TOO_LARGE => fail(format!("{}: too large", op)),
        status::BAD_REQUEST => fail(format!("{}: bad request", op)),
        status::UNAVAILABLE => fail(format!("{}: unavailable", op)),
        _ => fail(format!("{}: status {}", op, st)),
    }
}

// ---------------------------------------------------------------------------
// Records crossing the boundary, encoded as in abi/encoding.go.

/// One published event, as delivered to `on_receive` and `on_event`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// "program/id" of the publisher.
    pub publisher: String,
    pub topic: String,
    /// Ascends per publisher, from 1.
    pub seq: u64,
    /// Unix nanoseconds at publish.
    pub time: i64,
    pub payload: Vec<u8>,
}

/// What a publisher's follow hook decides on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowRequest {
    pub topic: String,
    pub filter: String,
    /// "connection" or "object".
    pub kind: String,
    /// The follower's "program/id", or a connection id.
    pub follower: String,
    /// The follower's tenant ("" without tenancy).
    pub tenant: String,
    /// What the follower presented (a room key, a token ...).
    pub params: Vec<u8>,
}

/// The binary encodings of abi/encoding.go: unsigned and zig-zag varints
/// (Go's encoding/binary) and uvarint-length-prefixed byte strings.
pub mod wire {
    /// Follower kinds (abi.FollowerKind).
    pub const FOLLOWER_CONNECTION: u8 = 1;
    pub const FOLLOWER_OBJECT: u8 = 2;

    pub fn put_uvarint(dst: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            dst.push(v as u8 | 0x80);
            v >>= 7;
        }
        dst.push(v as u8);
    }

    pub fn put_varint(dst: &mut Vec<u8>, v: i64) {
        let mut ux = (v as u64) << 1;
        if v < 0 {
            ux = !ux;
        }
        put_uvarint(dst, ux);
    }

    pub fn put_bytes(dst: &mut Vec<u8>, b: &[u8]) {
        put_uvarint(dst, b.len() as u64);
        dst.extend_from_slice(b);
    }

    /// Reads records; any malformation makes the whole decode fail.
    pub struct Decoder<'a> {
        pub b: &'a [u8],
        pub ok: bool,
    }

    impl<'a> Decoder<'a> {
        pub fn new(b: &'a [u8]) -> Self {
            Decoder { b, ok: true }
        }
        pub fn uvarint(&mut self) -> u64 {
            if !self.ok {
                return 0;
            }
            let mut x: u64 = 0;
            let mut s: u32 = 0;
            for (i, &c) in self.b.iter().enumerate() {
                if i == 10 {
                    break; // overflow
                }
                if c < 0x80 {
                    if i == 9 && c > 1 {
                        break; // overflow
                    }
                    self.b = &self.b[i + 1..];
                    return x | (c as u64) << s;
                }
                x |= ((c & 0x7f) as u64) << s;
                s += 7;
            }
            self.ok = false;
            0
        }
        pub fn varint(&mut self) -> i64 {
            let ux = self.uvarint();
            let mut x = (ux >> 1) as i64;
            if ux & 1 != 0 {
                x = !x;
            }
            x
        }
        pub fn byte(&mut self) -> u8 {
            if !self.ok || self.b.is_empty() {
                self.ok = false;
                return 0;
            }
            let c = self.b[0];
            self.b = &self.b[1..];
            c
        }
        pub fn bytes(&mut self) -> &'a [u8] {
            let n = self.uvarint();
            if !self.ok {
                return &[];
            }
            if n > self.b.len() as u64 {
                self.ok = false;
                return &[];
            }
            let (v, rest) = self.b.split_at(n as usize);
            self.b = rest;
            v
        }
        pub fn string(&mut self) -> String {
            String::from_utf8_lossy(self.bytes()).into_owned()
        }
        /// True when everything decoded and nothing is left over.
        pub fn done(&self) -> bool {
            self.ok && self.b.is_empty()
        }
    }
}

impl Event {
    /// Encodes as abi.AppendEvent.
    pub fn encode(&self) -> Vec<u8> {
        let mut d = Vec::with_capacity(self.publisher.len() + self.topic.len() + self.payload.len() + 24);
        wire::put_bytes(&mut d, self.publisher.as_bytes());
        wire::put_bytes(&mut d, self.topic.as_bytes());
        wire::put_uvarint(&mut d, self.seq);
        wire::put_varint(&mut d, self.time);
        wire::put_bytes(&mut d, &self.payload);
        d
    }
    /// Decodes as abi.DecodeEvent.
    pub fn decode(b: &[u8]) -> Option<Event> {
        let mut d = wire::Decoder::new(b);
        let e = Event {
            publisher: d.string(),
            topic: d.string(),
            seq: d.uvarint(),
            time: d.varint(),
            payload: d.bytes().to_vec(),
        };
        if d.done() {
            Some(e)
        } else {
            None
        }
    }
}

fn kind_name(k: u8) -> &'static str {
    match k {
        wire::FOLLOWER_CONNECTION => "connection",
        wire::FOLLOWER_OBJECT => "object",
        _ => "unknown",
    }
}

/// Encodes a follow request as abi.AppendFollowRequest.
#[allow(clippy::too_many_arguments)]
pub fn encode_follow_request(
    publisher: &[u8],
    topic: &[u8],
    filter: &[u8],
    kind: u8,
    follower: &[u8],
    tenant: &[u8],
    params: &[u8],
) -> Vec<u8> {
    let mut d = Vec::new();
    wire::put_bytes(&mut d, publisher);
    wire::put_bytes(&mut d, topic);
    wire::put_bytes(&mut d, filter);
    d.push(kind);
    wire::put_bytes(&mut d, follower);
    wire::put_bytes(&mut d, tenant);
    wire::put_bytes(&mut d, params);
    d
}

impl FollowRequest {
    /// Decodes as abi.DecodeFollowRequest (the publisher field, which names
    /// this object, is dropped as in the Go SDK).
    pub fn decode(b: &[u8]) -> Option<FollowRequest> {
        let mut d = wire::Decoder::new(b);
        let _publisher = d.bytes();
        let r = FollowRequest {
            topic: d.string(),
            filter: d.string(),
            kind: kind_name(d.byte()).to_string(),
            follower: d.string(),
            tenant: d.string(),
            params: d.bytes().to_vec(),
        };
        if d.done() {
            Some(r)
        } else {
            None
        }
    }
}

/// Encodes state scan pairs as abi.AppendPairs.
pub fn encode_pairs(pairs: &[KV]) -> Vec<u8> {
    let mut d = Vec::new();
    for p in pairs {
        wire::put_bytes(&mut d, &p.key);
        wire::put_bytes(&mut d, &p.value);
    }
    d
}

/// Decodes state scan pairs as abi.DecodePairs.
pub fn decode_pairs(b: &[u8]) -> Option<Vec<KV>> {
    let mut d = wire::Decoder::new(b);
    let mut out = Vec::new();
    while d.ok && !d.b.is_empty() {
        let key = d.bytes().to_vec();
        let value = d.bytes().to_vec();
        out.push(KV { key, value });
    }
    if d.done() {
        Some(out)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// Host functions, safe.

fn len32(n: usize) -> i32 {
    // Lengths over i32 cannot exist in a 32-bit memory; saturate so the host
    // refuses rather than wrapping.
    if n > i32::MAX as usize {
        i32::MAX
    } else {
        n as i32
    }
}

fn read_result(n: i32) -> Vec<u8> {
    if n <= 0 {
        return Vec::new();
    }
    let mut b = vec![0u8; n as usize];
    unsafe { sys::result_read(b.as_mut_ptr()) };
    b
}

fn read_input(n: i32) -> Vec<u8> {
    if n <= 0 {
        return Vec::new();
    }
    let mut b = vec![0u8; n as usize];
    unsafe { sys::input_read(b.as_mut_ptr()) };
    b
}

fn reply(b: &[u8]) {
    unsafe { sys::reply(b.as_ptr(), len32(b.len())) }
}

/// Returns the value stored under `key` in this object's state.
pub fn get(key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
    let k = key.as_ref();
    let n = unsafe { sys::state_get(k.as_ptr(), len32(k.len())) };
    if n < 0 {
        return None;
    }
    Some(read_result(n))
}

/// Stores `value` under `key`. Fails ("put KEY: too large") only when the
/// key or value is over the ABI's limits.
pub fn put(key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
    let (k, v) = (key.as_ref(), value.as_ref());
    let st = unsafe { sys::state_put(k.as_ptr(), len32(k.len()), v.as_ptr(), len32(v.len())) };
    if st == status::OK {
        return Ok(());
    }
    status_err(&format!("put {}", String::from_utf8_lossy(k)), st)
}

/// Removes `key` from this object's state.
pub fn delete(key: impl AsRef<[u8]>) {
    let k = key.as_ref();
    unsafe { sys::state_delete(k.as_ptr(), len32(k.len())) };
}

/// One key/value pair from [`scan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KV {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl KV {
    /// The key as text.
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }
}

/// Returns up to `limit` pairs whose key starts with `prefix`, in key order.
pub fn scan(prefix: impl AsRef<[u8]>, limit: i32) -> Vec<KV> {
    let p = prefix.as_ref();
    let n = unsafe { sys::state_scan(p.as_ptr(), len32(p.len()), limit) };
    if n <= 0 {
        return Vec::new();
    }
    decode_pairs(&read_result(n)).expect("host_sdk: malformed state scan result")
}

/// Appends an event to this object's log on `topic`. Followers see it when
/// the handler's transaction commits.
pub fn publish(topic: &str, payload: impl AsRef<[u8]>) -> Result<()> {
    let p = payload.as_ref();
    let st = unsafe { sys::publish(topic.as_ptr(), len32(topic.len()), p.as_ptr(), len32(p.len())) };
    status_err("publish", st)
}

/// The optional parts of a [`follow`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FollowOptions<'a> {
    /// "" for every event; see the host's README for the syntax.
    pub filter: &'a str,
    /// Presented to the publisher's follow hook.
    pub params: &'a [u8],
}

/// Makes this object a durable follower of `publisher`'s ("program/id")
/// `topic`. The publisher's follow hook runs before this returns; a refusal
/// comes back as [`Error::Refused`] with its reason. Delivery starts at the
/// publisher's current head and arrives through `on_receive`.
pub fn follow(publisher: &str, topic: &str, opt: FollowOptions<'_>) -> Result<()> {
    let req = encode_follow_request(
        publisher.as_bytes(),
        topic.as_bytes(),
        opt.filter.as_bytes(),
        wire::FOLLOWER_OBJECT,
        b"",
        b"",
        opt.params,
    );
    let st = unsafe { sys::follow(req.as_ptr(), len32(req.len())) };
    if st == status::REFUSED {
        let reason = read_result(unsafe { sys::result_len() });
        return Err(Error::Refused(String::from_utf8_lossy(&reason).into_owned()));
    }
    if st == status::BAD_REQUEST || st == status::UNAVAILABLE {
        let why = read_result(unsafe { sys::result_len() });
        if !why.is_empty() {
            return Err(Error::new(format!("follow {}: {}", publisher, String::from_utf8_lossy(&why))));
        }
    }
    status_err(&format!("follow {}", publisher), st)
}

/// Removes this object's edge on `publisher`'s `topic`.
pub fn unfollow(publisher: &str, topic: &str) -> Result<()> {
    let req = encode_follow_request(publisher.as_bytes(), topic.as_bytes(), b"", wire::FOLLOWER_OBJECT, b"", b"", b"");
    let st = unsafe { sys::unfollow(req.as_ptr(), len32(req.len())) };
    status_err(&format!("unfollow {}", publisher), st)
}

/// Writes a line to the node's log at info level, tagged with this object.
pub fn log(msg: &str) {
    log_at(level::INFO, msg)
}

/// Writes a line to the node's log at `lvl` (see [`level`]).
pub fn log_at(lvl: i32, msg: &str) {
    unsafe { sys::log(lvl, msg.as_ptr(), len32(msg.len())) }
}

/// The host's wall clock in Unix nanoseconds.
pub fn now() -> i64 {
    unsafe { sys::time_now() }
}

/// Fills `buf` with cryptographically random bytes from the host.
pub fn random(buf: &mut [u8]) {
    for chunk in buf.chunks_mut(1 << 16) {
        unsafe { sys::random_fill(chunk.as_mut_ptr(), chunk.len() as i32) }
    }
}

/// This object's "program/id".
pub fn self_id() -> String {
    let n = unsafe { sys::self_id() };
    String::from_utf8_lossy(&read_result(n)).into_owned()
}

/// Sets this object's alarm: at or after `unix_ms` (Unix milliseconds)
/// the program's `on_alarm` handler runs, once, in a transaction of its
/// own, on the object's home, after a restart or a takeover too. An object
/// has one alarm; setting it again replaces it. It is part of this
/// handler's transaction: if the handler fails, no alarm is set. A time
/// already past runs the alarm at once. It fails when the program
/// registers no `on_alarm` handler, or `unix_ms` is negative or more than
/// ten years ahead. Compute it from [`now`], the clock alarms run by.
pub fn set_alarm(unix_ms: i64) -> Result<()> {
    let st = unsafe { sys::alarm_set(unix_ms) };
    if st == status::BAD_REQUEST {
        let why = read_result(unsafe { sys::result_len() });
        if !why.is_empty() {
            return fail(format!("set alarm: {}", String::from_utf8_lossy(&why)));
        }
    }
    status_err("set alarm", st)
}

/// The pending alarm's time in Unix milliseconds, if one is set.
pub fn alarm() -> Option<i64> {
    let ms = unsafe { sys::alarm_get() };
    if ms < 0 {
        None
    } else {
        Some(ms)
    }
}

/// Cancels this object's pending alarm, in this handler's transaction.
pub fn delete_alarm() -> Result<()> {
    status_err("delete alarm", unsafe { sys::alarm_delete() })
}

/// A failed [`call`]: the HTTP status the same failure has over the host's
/// API (422 the callee's own error, 404 no such object or method, 508 a
/// call back into an object already waiting in this chain of calls or a
/// chain deeper than eight objects, 504 out of budget, 503 unavailable ...)
/// and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub status: u32,
    pub message: String,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CallError {}

impl From<CallError> for Error {
    fn from(e: CallError) -> Error {
        Error::Failed(e.message)
    }
}

/// Runs `method` of another object (`target`, "program/id" in this
/// program's tenant) with `payload` and returns its reply. The callee runs
/// on its home, wherever that is, in its own transaction, while this
/// handler waits, and no longer than this handler's budget has left.
///
/// The callee's effects commit on their own: if this handler fails
/// afterwards, its own writes roll back and the callee's stay. Make the
/// callee's method safe to repeat or give the call a key
/// ([`call_with_key`]); a call from an `on_receive` handler gets one
/// derived from the event and the call's place in the handler, so a
/// redelivered event repeats no call's effect. One handler runs at a time
/// per object, so a call back into an object already waiting in the chain
/// fails at once (508).
pub fn call(target: &str, method: &str, payload: impl AsRef<[u8]>) -> Result<Vec<u8>, CallError> {
    call_with_key(target, method, payload, "")
}

/// [`call`] once in effect per `key`: the callee records the key with its
/// reply, and a call with the same key (from this object) gets that reply
/// without the method running again, for as long as the callee keeps the
/// record (a day by default). The same key with another method or payload
/// fails with status 422.
pub fn call_with_key(target: &str, method: &str, payload: impl AsRef<[u8]>, key: &str) -> Result<Vec<u8>, CallError> {
    let mut req = Vec::new();
    wire::put_bytes(&mut req, target.as_bytes());
    wire::put_bytes(&mut req, method.as_bytes());
    wire::put_bytes(&mut req, key.as_bytes());
    wire::put_bytes(&mut req, payload.as_ref());
    let n = unsafe { sys::object_call(req.as_ptr(), len32(req.len())) };
    if n >= 0 {
        return Ok(read_result(n));
    }
    let b = read_result(unsafe { sys::result_len() });
    let mut d = wire::Decoder::new(&b);
    let status = d.uvarint();
    let message = d.string();
    if !d.done() {
        return Err(CallError { status: 500, message: format!("call {}.{}: status {}", target, method, n) });
    }
    Err(CallError { status: status as u32, message })
}

/// Formats `n` in decimal as bytes, handy for replies.
pub fn itoa(n: i64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Reads a decimal integer stored under `key` (0 when absent or not a
/// number).
pub fn get_int(key: impl AsRef<[u8]>) -> i64 {
    match get(key) {
        Some(v) => std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        None => 0,
    }
}

/// Stores `n` under `key` in decimal.
pub fn put_int(key: impl AsRef<[u8]>, n: i64) -> Result<()> {
    put(key, itoa(n))
}

/// Compares two byte strings in time that depends only on their lengths
/// (for keys and tokens in follow hooks).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut v = 0u8;
    for i in 0..a.len() {
        v |= a[i] ^ b[i];
    }
    // A volatile read keeps the compiler from short-circuiting the loop
    // (std::hint::black_box is not stable on every supported rustc).
    unsafe { std::ptr::read_volatile(&v) == 0 }
}

// ---------------------------------------------------------------------------
// Handlers and the exports.

type MethodFn = Box<dyn Fn(&[u8]) -> Result<Vec<u8>>>;
type FollowFn = Box<dyn Fn(&FollowRequest) -> Result<()>>;
type ReceiveFn = Box<dyn Fn(&Event) -> Result<()>>;
type EventFn = Box<dyn Fn(&Event) -> Result<Vec<u8>>>;
type AlarmFn = Box<dyn Fn() -> Result<()>>;

/// The handlers of a program. The function named in [`program!`] fills it.
#[derive(Default)]
pub struct Program {
    methods: Vec<(Vec<u8>, MethodFn)>,
    on_follow: Option<FollowFn>,
    on_receive: Option<ReceiveFn>,
    on_event: Option<EventFn>,
    on_alarm: Option<AlarmFn>,
}

impl Program {
    /// Registers a method handler: it gets the request payload and returns
    /// the reply. An error becomes an error reply and rolls the call back.
    /// Registering a name twice replaces the first handler.
    pub fn method<F>(&mut self, name: &str, h: F) -> &mut Self
    where
        F: Fn(&[u8]) -> Result<Vec<u8>> + 'static,
    {
        let name = name.as_bytes().to_vec();
        self.methods.retain(|(n, _)| *n != name);
        self.methods.push((name, Box::new(h)));
        self
    }

    /// Registers a method whose payload is a JSON object shaped like `shape`
    /// and whose reply is JSON (build it with [`json::Object`] and friends).
    /// An empty payload decodes as all fields absent. A payload that is not
    /// the expected JSON gets the error reply
    /// "bad request: payload is not the expected JSON: DETAIL", DETAIL worded
    /// as Go's encoding/json words it, as the Go SDK's JSONMethod does.
    pub fn json_method<F>(&mut self, name: &str, shape: &'static json::Struct, h: F) -> &mut Self
    where
        F: Fn(&json::Fields) -> Result<Vec<u8>> + 'static,
    {
        self.method(name, move |payload| {
            let fields = if payload.is_empty() {
                json::Fields::empty(shape)
            } else {
                json::decode(payload, shape)
                    .map_err(|e| Error::new(format!("bad request: payload is not the expected JSON: {}", e)))?
            };
            h(&fields)
        })
    }

    /// Registers the follow hook: it runs once when someone asks to follow
    /// this object, never during delivery. Return `Ok(())` to admit,
    /// `Err(Error::refuse(reason))` to refuse.
    pub fn on_follow<F>(&mut self, h: F) -> &mut Self
    where
        F: Fn(&FollowRequest) -> Result<()> + 'static,
    {
        self.on_follow = Some(Box::new(h));
        self
    }

    /// Registers the durable follower handler. An error fails the delivery
    /// attempt: the host retries with backoff.
    pub fn on_receive<F>(&mut self, h: F) -> &mut Self
    where
        F: Fn(&Event) -> Result<()> + 'static,
    {
        self.on_receive = Some(Box::new(h));
        self
    }

    /// Registers the handler that shapes what this program's WebSocket
    /// connections receive: return the frame, or `Err(Error::Skip)`.
    ///
    /// It runs on the node holding the sockets, usually not the object's
    /// home, in an instance with no object behind it: shape the frame from
    /// the event alone. `get`, `put`, `scan`, `publish` and `follow` fail
    /// the handler there. It runs once per event on each node for every
    /// socket attached to one object, not once per socket.
    pub fn on_event<F>(&mut self, h: F) -> &mut Self
    where
        F: Fn(&Event) -> Result<Vec<u8>> + 'static,
    {
        self.on_event = Some(Box::new(h));
        self
    }

    /// Registers the alarm handler: it runs when the alarm set with
    /// [`set_alarm`] is due, in a transaction of its own that also clears
    /// the alarm unless the handler sets another (or deletes it). An error
    /// (or a panic, or running past the budget) fails the run: nothing it
    /// wrote commits, and the host runs it again after 0.5 s, doubling,
    /// and drops the alarm after 8 failed runs.
    pub fn on_alarm<F>(&mut self, h: F) -> &mut Self
    where
        F: Fn() -> Result<()> + 'static,
    {
        self.on_alarm = Some(Box::new(h));
        self
    }
}

/// The machinery behind [`program!`]; not for direct use.
#[doc(hidden)]
pub mod rt {
    use super::*;

    static mut PROGRAM: Option<Program> = None;

    /// Returns the program, registering it on first use. The guest is
    /// single-threaded and the host never re-enters an instance, so the
    /// static is only ever touched by one export at a time.
    fn program(register: fn(&mut Program)) -> &'static Program {
        unsafe {
            if PROGRAM.is_none() {
                install_panic_hook();
                let mut p = Program::default();
                register(&mut p);
                PROGRAM = Some(p);
            }
            PROGRAM.as_ref().unwrap()
        }
    }

    /// Panics abort (a trap: the host fails the call, discards the instance
    /// and reports a TrapError). Before that, the message goes to the node's
    /// log at error level, so the author can see why.
    fn install_panic_hook() {
        std::panic::set_hook(Box::new(|info| {
            let msg = format!("panic: {}", info);
            log_at(level::ERROR, &msg);
            reply(msg.as_bytes());
        }));
    }

    /// Turns a handler's result into a status and a reply.
    fn finish(r: Result<Vec<u8>>) -> i32 {
        match r {
            Ok(out) => {
                if !out.is_empty() {
                    reply(&out);
                }
                status::OK
            }
            Err(Error::Failed(m)) => {
                reply(m.as_bytes());
                status::ERROR
            }
            Err(Error::Refused(m)) => {
                reply(m.as_bytes());
                status::REFUSED
            }
            Err(Error::Skip) => status::SKIP,
        }
    }

    pub fn version(register: fn(&mut Program)) -> i32 {
        program(register);
        ABI_VERSION
    }

    pub fn handlers(register: fn(&mut Program)) -> i32 {
        let p = program(register);
        let mut h = 0;
        if p.on_follow.is_some() {
            h |= super::handlers::FOLLOW;
        }
        if p.on_receive.is_some() {
            h |= super::handlers::RECEIVE;
        }
        if p.on_event.is_some() {
            h |= super::handlers::EVENT;
        }
        if p.on_alarm.is_some() {
            h |= super::handlers::ALARM;
        }
        h
    }

    pub fn call(register: fn(&mut Program), method_len: i32, payload_len: i32) -> i32 {
        let p = program(register);
        if method_len < 0 || payload_len < 0 {
            return status::BAD_REQUEST;
        }
        let input = read_input(method_len.saturating_add(payload_len));
        let (method, payload) = input.split_at((method_len as usize).min(input.len()));
        match p.methods.iter().find(|(n, _)| n.as_slice() == method) {
            Some((_, h)) => finish(h(payload)),
            None => status::NOT_FOUND,
        }
    }

    pub fn follow(register: fn(&mut Program), n: i32) -> i32 {
        let p = program(register);
        let h = match &p.on_follow {
            Some(h) => h,
            None => return status::OK,
        };
        match FollowRequest::decode(&read_input(n)) {
            Some(r) => finish(h(&r).map(|()| Vec::new())),
            None => status::BAD_REQUEST,
        }
    }

    pub fn receive(register: fn(&mut Program), n: i32) -> i32 {
        let p = program(register);
        let h = match &p.on_receive {
            Some(h) => h,
            None => return status::NOT_FOUND,
        };
        match Event::decode(&read_input(n)) {
            Some(e) => finish(h(&e).map(|()| Vec::new())),
            None => status::BAD_REQUEST,
        }
    }

    pub fn event(register: fn(&mut Program), n: i32) -> i32 {
        let p = program(register);
        let h = match &p.on_event {
            Some(h) => h,
            None => return status::NOT_FOUND,
        };
        match Event::decode(&read_input(n)) {
            Some(e) => finish(h(&e)),
            None => status::BAD_REQUEST,
        }
    }

    pub fn alarm(register: fn(&mut Program)) -> i32 {
        match &program(register).on_alarm {
            Some(h) => finish(h().map(|()| Vec::new())),
            None => status::NOT_FOUND,
        }
    }
}

/// Defines the module's exports (host_abi_version, host_handlers, call,
/// follow, receive, event, alarm) for a program whose handlers `register`
/// (a `fn(&mut Program)`) registers. Use it once, at the crate root.
#[macro_export]
macro_rules! program {
    ($register:path) => {
        #[no_mangle]
        pub extern "C" fn host_abi_version() -> i32 {
            $crate::rt::version($register)
        }
        #[no_mangle]
        pub extern "C" fn host_handlers() -> i32 {
            $crate::rt::handlers($register)
        }
        #[no_mangle]
        pub extern "C" fn call(method_len: i32, payload_len: i32) -> i32 {
            $crate::rt::call($register, method_len, payload_len)
        }
        #[no_mangle]
        pub extern "C" fn follow(request_len: i32) -> i32 {
            $crate::rt::follow($register, request_len)
        }
        #[no_mangle]
        pub extern "C" fn receive(event_len: i32) -> i32 {
            $crate::rt::receive($register, event_len)
        }
        #[no_mangle]
        pub extern "C" fn event(event_len: i32) -> i32 {
            $crate::rt::event($register, event_len)
        }
        #[no_mangle]
        pub extern "C" fn alarm() -> i32 {
            $crate::rt::alarm($register)
        }
    };
}

// ---------------------------------------------------------------------------
// JSON

/// A tiny JSON helper, enough for programs without serde: decode a JSON
/// object's scalar fields the way Go's encoding/json decodes them into a
/// struct (same acceptance, same error wording), and write objects, arrays
/// and strings the way Go's json.Marshal writes them (no spaces, HTML-safe
/// escaping), so Rust and Go programs can be byte-for-byte twins.
pub mod json {
    use std::fmt::Write as _;

    /// The Go type of a field, for decoding and error messages.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Type {
        /// Go `string`.
        String,
        /// Go `int64` (or `*int64`: use [`Fields::opt_int`]).
        Int64,
        /// Go `int` (64-bit on wasm).
        Int,
        /// Go `bool`.
        Bool,
    }

    impl Type {
        fn go_name(self) -> &'static str {
            match self {
                Type::String => "string",
                Type::Int64 => "int64",
                Type::Int => "int",
                Type::Bool => "bool",
            }
        }
    }

    /// The shape of an expected JSON object, described as the Go struct a
    /// twin Go program decodes into (only used for error wording).
    #[derive(Debug)]
    pub struct Struct {
        /// The Go struct's name ("" for an anonymous struct), as in
        /// "Go struct field NAME.field of type T".
        pub name: &'static str,
        /// The Go type as `%v` prints it, as in "Go value of type T" when the
        /// payload is not an object.
        pub go_type: &'static str,
        /// JSON field names and types.
        pub fields: &'static [(&'static str, Type)],
    }

    /// A decoded field.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Value {
        Str(String),
        Int(i64),
        Bool(bool),
    }

    /// The fields of a decoded object, in the order of the [`Struct`].
    #[derive(Debug, Clone)]
    pub struct Fields {
        shape: &'static Struct,
        values: Vec<Option<Value>>,
    }

    impl Fields {
        /// All fields absent.
        pub fn empty(shape: &'static Struct) -> Fields {
            Fields { shape, values: vec![None; shape.fields.len()] }
        }
        fn index(&self, name: &str) -> Option<usize> {
            self.shape.fields.iter().position(|(n, _)| *n == name)
        }
        /// The raw decoded value of `name`, None when absent or null.
        pub fn get(&self, name: &str) -> Option<&Value> {
            self.index(name).and_then(|i| self.values[i].as_ref())
        }
        /// A string field; "" when absent (Go's zero value).
        pub fn str(&self, name: &str) -> &str {
            match self.get(name) {
                Some(Value::Str(s)) => s,
                _ => "",
            }
        }
        /// An integer field; None when absent or null (Go's `*int64`).
        pub fn opt_int(&self, name: &str) -> Option<i64> {
            match self.get(name) {
                Some(Value::Int(n)) => Some(*n),
                _ => None,
            }
        }
        /// An integer field; 0 when absent.
        pub fn int(&self, name: &str) -> i64 {
            self.opt_int(name).unwrap_or(0)
        }
        /// A bool field; false when absent.
        pub fn bool(&self, name: &str) -> bool {
            matches!(self.get(name), Some(Value::Bool(true)))
        }
    }

    /// Decodes `b`, which must be a JSON object or null, into the fields of
    /// `shape`, as Go's json.Unmarshal into the matching struct: keys match
    /// field names exactly or case-insensitively, unknown keys and nulls are
    /// ignored, the last duplicate wins, strings are unquoted with invalid
    /// UTF-8 and lone surrogates replaced by U+FFFD. The error is worded as
    /// Go words it.
    pub fn decode(b: &[u8], shape: &'static Struct) -> Result<Fields, String> {
        check_valid(b)?;
        let mut out = Fields::empty(shape);
        let mut p = Parser { b, i: 0 };
        p.ws();
        let kind = p.kind();
        if kind == Kind::Null {
            return Ok(out);
        }
        if kind != Kind::Object {
            return Err(format!("json: cannot unmarshal {} into Go value of type {}", kind.name(), shape.go_type));
        }
        let mut first_err: Option<String> = None;
        p.i += 1; // {
        loop {
            p.ws();
            if p.b[p.i] == b'}' {
                break;
            }
            let ks = p.i;
            p.skip_value();
            let key = unquote(&p.b[ks..p.i]);
            p.ws();
            p.i += 1; // :
            p.ws();
            let vs = p.i;
            let vkind = p.kind();
            p.skip_value();
            let raw = &p.b[vs..p.i];
            if let Some(fi) = field_index(shape, &key) {
                let (fname, ty) = shape.fields[fi];
                let v = match (vkind, ty) {
                    (Kind::Null, _) => Ok(None),
                    (Kind::String, Type::String) => Ok(Some(Value::Str(unquote(raw)))),
                    (Kind::Bool, Type::Bool) => Ok(Some(Value::Bool(raw == b"true"))),
                    (Kind::Number, Type::Int64) | (Kind::Number, Type::Int) => {
                        match std::str::from_utf8(raw).ok().and_then(|s| s.parse::<i64>().ok()) {
                            Some(n) => Ok(Some(Value::Int(n))),
                            None => Err(format!("number {}", String::from_utf8_lossy(raw))),
                        }
                    }
                    (k, _) => Err(k.name().to_string()),
                };
                match v {
                    Ok(Some(v)) => out.values[fi] = Some(v),
                    Ok(None) => {}
                    Err(what) => {
                        if first_err.is_none() {
                            first_err = Some(format!(
                                "json: cannot unmarshal {} into Go struct field {}.{} of type {}",
                                what,
                                shape.name,
                                fname,
                                ty.go_name()
                            ));
                        }
                    }
                }
            }
            p.ws();
            if p.b[p.i] == b',' {
                p.i += 1;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    fn field_index(shape: &Struct, key: &str) -> Option<usize> {
        if let Some(i) = shape.fields.iter().position(|(n, _)| *n == key) {
            return Some(i);
        }
        let folded = fold(key);
        shape.fields.iter().position(|(n, _)| fold(n) == folded)
    }

    // Go matches keys to field names under simple Unicode case folding; for
    // the ASCII names fields have, that is ASCII case plus the two non-ASCII
    // letters that fold to ASCII: the Kelvin sign and the long s.
    fn fold(s: &str) -> String {
        s.chars()
            .map(|c| match c {
                '\u{212A}' => 'K',
                '\u{017F}' => 'S',
                c => c.to_ascii_uppercase(),
            })
            .collect()
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Null,
        Bool,
        Number,
        String,
        Array,
        Object,
    }

    impl Kind {
        fn name(self) -> &'static str {
            match self {
                Kind::Null => "null",
                Kind::Bool => "bool",
                Kind::Number => "number",
                Kind::String => "string",
                Kind::Array => "array",
                Kind::Object => "object",
            }
        }
    }

    /// Walks input already checked by check_valid.
    struct Parser<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Parser<'a> {
        fn ws(&mut self) {
            while self.i < self.b.len() && is_space(self.b[self.i]) {
                self.i += 1;
            }
        }
        fn kind(&self) -> Kind {
            match self.b[self.i] {
                b'n' => Kind::Null,
                b't' | b'f' => Kind::Bool,
                b'"' => Kind::String,
                b'[' => Kind::Array,
                b'{' => Kind::Object,
                _ => Kind::Number,
            }
        }
        /// Skips one value without recursion.
        fn skip_value(&mut self) {
            let mut depth = 0usize;
            loop {
                match self.b[self.i] {
                    b'"' => {
                        self.i += 1;
                        while self.b[self.i] != b'"' {
                            if self.b[self.i] == b'\\' {
                                self.i += 1;
                            }
                            self.i += 1;
                        }
                        self.i += 1;
                    }
                    b'{' | b'[' => {
                        depth += 1;
                        self.i += 1;
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        self.i += 1;
                    }
                    c if depth > 0 => {
                        let _ = c;
                        self.i += 1;
                    }
                    _ => {
                        // A scalar at depth 0: runs to a delimiter.
                        while self.i < self.b.len() && !matches!(self.b[self.i], b',' | b'}' | b']' | b':') && !is_space(self.b[self.i]) {
                            self.i += 1;
                        }
                        return;
                    }
                }
                if depth == 0 {
                    return;
                }
            }
        }
    }

    fn is_space(c: u8) -> bool {
        c == b' ' || c == b'\t' || c == b'\r' || c == b'\n'
    }

    const MAX_DEPTH: usize = 10000;

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum St {
        BeginValueOrEmpty,
        BeginValue,
        BeginStringOrEmpty,
        BeginString,
        EndValue,
        EndTop,
        InString,
        InStringEsc,
        EscU(u8),
        Neg,
        One,
        Zero,
        Dot,
        Dot0,
        E,
        ESign,
        E0,
        Lit(&'static [u8], u8),
        Error,
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Ps {
        ObjectKey,
        ObjectValue,
        ArrayValue,
    }

    /// Go's encoding/json scanner (checkValid), ported state for state so
    /// that syntax errors read exactly as Go's.
    struct Scanner {
        step: St,
        stack: Vec<Ps>,
        end_top: bool,
        err: Option<String>,
    }

    impl Scanner {
        fn error(&mut self, c: u8, context: &str) {
            self.step = St::Error;
            if self.err.is_none() {
                self.err = Some(format!("invalid character {} {}", quote_char(c), context));
            }
        }

        fn push(&mut self, c: u8, ps: Ps, next: St) {
            self.stack.push(ps);
            if self.stack.len() <= MAX_DEPTH {
                self.step = next;
            } else {
                self.error(c, "exceeded max depth");
            }
        }

        fn pop(&mut self) {
            self.stack.pop();
            if self.stack.is_empty() {
                self.step = St::EndTop;
                self.end_top = true;
            } else {
                self.step = St::EndValue;
            }
        }

        fn feed(&mut self, c: u8) {
            match self.step {
                St::BeginValueOrEmpty => {
                    if is_space(c) {
                        return;
                    }
                    if c == b']' {
                        return self.end_value(c);
                    }
                    self.begin_value(c)
                }
                St::BeginValue => self.begin_value(c),
                St::BeginStringOrEmpty => {
                    if is_space(c) {
                        return;
                    }
                    if c == b'}' {
                        let n = self.stack.len();
                        self.stack[n - 1] = Ps::ObjectValue;
                        return self.end_value(c);
                    }
                    self.begin_string(c)
                }
                St::BeginString => self.begin_string(c),
                St::EndValue => self.end_value(c),
                St::EndTop => {
                    if !is_space(c) {
                        self.error(c, "after top-level value");
                    }
                }
                St::InString => {
                    if c == b'"' {
                        self.step = St::EndValue;
                    } else if c == b'\\' {
                        self.step = St::InStringEsc;
                    } else if c < 0x20 {
                        self.error(c, "in string literal");
                    }
                }
                St::InStringEsc => match c {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => self.step = St::InString,
                    b'u' => self.step = St::EscU(0),
                    _ => self.error(c, "in string escape code"),
                },
                St::EscU(n) => {
                    if c.is_ascii_hexdigit() {
                        self.step = if n == 3 { St::InString } else { St::EscU(n + 1) };
                    } else {
                        self.error(c, "in \\u hexadecimal character escape");
                    }
                }
                St::Neg => match c {
                    b'0' => self.step = St::Zero,
                    b'1'..=b'9' => self.step = St::One,
                    _ => self.error(c, "in numeric literal"),
                },
                St::One => {
                    if !c.is_ascii_digit() {
                        self.zero(c)
                    }
                }
                St::Zero => self.zero(c),
                St::Dot => {
                    if c.is_ascii_digit() {
                        self.step = St::Dot0;
                    } else {
                        self.error(c, "after decimal point in numeric literal");
                    }
                }
                St::Dot0 => {
                    if c.is_ascii_digit() {
                    } else if c == b'e' || c == b'E' {
                        self.step = St::E;
                    } else {
                        self.end_value(c)
                    }
                }
                St::E => {
                    if c == b'+' || c == b'-' {
                        self.step = St::ESign;
                    } else {
                        self.e_sign(c)
                    }
                }
                St::ESign => self.e_sign(c),
                St::E0 => {
                    if !c.is_ascii_digit() {
                        self.end_value(c)
                    }
                }
                St::Lit(word, i) => {
                    let want = word[i as usize];
                    if c != want {
                        let w = std::str::from_utf8(word).unwrap_or("");
                        return self.error(c, &format!("in literal {} (expecting {})", w, quote_char(want)));
                    }
                    if i as usize + 1 == word.len() {
                        self.step = St::EndValue;
                    } else {
                        self.step = St::Lit(word, i + 1);
                    }
                }
                St::Error => {}
            }
        }

        fn zero(&mut self, c: u8) {
            if c == b'.' {
                self.step = St::Dot;
            } else if c == b'e' || c == b'E' {
                self.step = St::E;
            } else {
                self.end_value(c)
            }
        }

        fn e_sign(&mut self, c: u8) {
            if c.is_ascii_digit() {
                self.step = St::E0;
            } else {
                self.error(c, "in exponent of numeric literal");
            }
        }

        fn begin_value(&mut self, c: u8) {
            if is_space(c) {
                return;
            }
            match c {
                b'{' => self.push(c, Ps::ObjectKey, St::BeginStringOrEmpty),
                b'[' => self.push(c, Ps::ArrayValue, St::BeginValueOrEmpty),
                b'"' => self.step = St::InString,
                b'-' => self.step = St::Neg,
                b'0' => self.step = St::Zero,
                b't' => self.step = St::Lit(b"true", 1),
                b'f' => self.step = St::Lit(b"false", 1),
                b'n' => self.step = St::Lit(b"null", 1),
                b'1'..=b'9' => self.step = St::One,
                _ => self.error(c, "looking for beginning of value"),
            }
        }

        fn begin_string(&mut self, c: u8) {
            if is_space(c) {
                return;
            }
            if c == b'"' {
                self.step = St::InString;
                return;
            }
            self.error(c, "looking for beginning of object key string")
        }

        fn end_value(&mut self, c: u8) {
            let n = self.stack.len();
            if n == 0 {
                self.step = St::EndTop;
                self.end_top = true;
                return self.feed(c);
            }
            if is_space(c) {
                self.step = St::EndValue;
                return;
            }
            match self.stack[n - 1] {
                Ps::ObjectKey => {
                    if c == b':' {
                        self.stack[n - 1] = Ps::ObjectValue;
                        self.step = St::BeginValue;
                        return;
                    }
                    self.error(c, "after object key")
                }
                Ps::ObjectValue => {
                    if c == b',' {
                        self.stack[n - 1] = Ps::ObjectKey;
                        self.step = St::BeginString;
                        return;
                    }
                    if c == b'}' {
                        return self.pop();
                    }
                    self.error(c, "after object key:value pair")
                }
                Ps::ArrayValue => {
                    if c == b',' {
                        self.step = St::BeginValue;
                        return;
                    }
                    if c == b']' {
                        return self.pop();
                    }
                    self.error(c, "after array element")
                }
            }
        }
    }

    /// Reports whether `b` is one valid JSON value, with Go's wording for
    /// the first syntax error ("invalid character 'x' looking for beginning
    /// of value", "unexpected end of JSON input", ...).
    pub fn check_valid(b: &[u8]) -> Result<(), String> {
        let mut s = Scanner { step: St::BeginValue, stack: Vec::new(), end_top: false, err: None };
        for &c in b {
            s.feed(c);
            if let Some(e) = s.err.take() {
                return Err(e);
            }
        }
        // eof
        if s.end_top {
            return Ok(());
        }
        s.feed(b' ');
        if let Some(e) = s.err.take() {
            return Err(e);
        }
        if s.end_top {
            return Ok(());
        }
        Err("unexpected end of JSON input".to_string())
    }

    // Go's quoteChar: the byte as strconv.Quote shows the rune of that value.
    fn quote_char(c: u8) -> String {
        match c {
            b'\'' => "'\\''".to_string(),
            b'"' => "'\"'".to_string(),
            b'\\' => "'\\\\'".to_string(),
            0x07 => "'\\a'".to_string(),
            0x08 => "'\\b'".to_string(),
            0x0c => "'\\f'".to_string(),
            b'\n' => "'\\n'".to_string(),
            b'\r' => "'\\r'".to_string(),
            b'\t' => "'\\t'".to_string(),
            0x0b => "'\\v'".to_string(),
            0x20..=0x7e => format!("'{}'", c as char),
            0x00..=0x1f | 0x7f => format!("'\\x{:02x}'", c),
            0x80..=0xa0 | 0xad => format!("'\\u{:04x}'", c),
            _ => format!("'{}'", c as char),
        }
    }

    /// Decodes one UTF-8 sequence at the start of `s` as Go's
    /// utf8.DecodeRune: None for an invalid or truncated one.
    fn decode_rune(s: &[u8]) -> Option<(char, usize)> {
        let n = match s[0] {
            0x00..=0x7f => 1,
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => return None,
        };
        if s.len() < n {
            return None;
        }
        let st = std::str::from_utf8(&s[..n]).ok()?;
        st.chars().next().map(|c| (c, n))
    }

    fn hex4(s: &[u8]) -> Option<u32> {
        if s.len() < 6 || s[0] != b'\\' || s[1] != b'u' {
            return None;
        }
        let t = std::str::from_utf8(&s[2..6]).ok()?;
        u32::from_str_radix(t, 16).ok()
    }

    /// Unquotes a valid JSON string literal (quotes included) as Go does.
    pub fn unquote(q: &[u8]) -> String {
        let s = &q[1..q.len() - 1];
        let mut out = String::with_capacity(s.len());
        let mut r = 0;
        while r < s.len() {
            let c = s[r];
            if c == b'\\' {
                match s[r + 1] {
                    b'b' => out.push('\u{8}'),
                    b'f' => out.push('\u{c}'),
                    b'n' => out.push('\n'),
                    b'r' => out.push('\r'),
                    b't' => out.push('\t'),
                    b'u' => {
                        let mut rr = hex4(&s[r..]).unwrap_or(0xfffd);
                        r += 6;
                        if (0xd800..0xe000).contains(&rr) {
                            let lo = hex4(&s[r..]);
                            if let (true, Some(lo)) = ((0xd800..0xdc00).contains(&rr), lo) {
                                if (0xdc00..0xe000).contains(&lo) {
                                    let cp = 0x10000 + ((rr - 0xd800) << 10) + (lo - 0xdc00);
                                    out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                                    r += 6;
                                    continue;
                                }
                            }
                            rr = 0xfffd;
                        }
                        out.push(char::from_u32(rr).unwrap_or('\u{fffd}'));
                        continue;
                    }
                    other => out.push(other as char),
                }
                r += 2;
                continue;
            }
            if c < 0x80 {
                out.push(c as char);
                r += 1;
                continue;
            }
            match decode_rune(&s[r..]) {
                Some((ch, n)) => {
                    out.push(ch);
                    r += n;
                }
                None => {
                    out.push('\u{fffd}');
                    r += 1;
                }
            }
        }
        out
    }

    /// Appends `s` as a JSON string the way Go's json.Marshal writes it:
    /// `"`, `\` and control characters escaped (\b \f \n \r \t short, others
    /// \u00XX), `<`, `>`, `&`, U+2028 and U+2029 as \u escapes.
    pub fn write_string(out: &mut Vec<u8>, s: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push(b'"');
        let b = s.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c < 0x80 {
                let safe = c >= 0x20 && c != b'"' && c != b'\\' && c != b'<' && c != b'>' && c != b'&';
                if safe {
                    i += 1;
                    continue;
                }
                out.extend_from_slice(&b[start..i]);
                match c {
                    b'\\' | b'"' => out.extend_from_slice(&[b'\\', c]),
                    0x08 => out.extend_from_slice(b"\\b"),
                    0x0c => out.extend_from_slice(b"\\f"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    _ => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]),
                }
                i += 1;
                start = i;
                continue;
            }
            // U+2028 and U+2029 are E2 80 A8 / E2 80 A9.
            if c == 0xe2 && i + 2 < b.len() && b[i + 1] == 0x80 && (b[i + 2] == 0xa8 || b[i + 2] == 0xa9) {
                out.extend_from_slice(&b[start..i]);
                out.extend_from_slice(if b[i + 2] == 0xa8 { b"\\u2028" } else { b"\\u2029" });
                i += 3;
                start = i;
                continue;
            }
            i += 1;
        }
        out.extend_from_slice(&b[start..]);
        out.push(b'"');
    }

    /// `s` as a JSON string (see [`write_string`]).
    pub fn string(s: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(s.len() + 2);
        write_string(&mut out, s);
        out
    }

    /// Builds a JSON object, fields in the order they are added (Go writes
    /// struct fields in declaration order and map keys sorted).
    pub struct Object {
        buf: Vec<u8>,
    }

    impl Default for Object {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Object {
        pub fn new() -> Object {
            Object { buf: vec![b'{'] }
        }
        fn key(&mut self, k: &str) {
            if self.buf.len() > 1 {
                self.buf.push(b',');
            }
            write_string(&mut self.buf, k);
            self.buf.push(b':');
        }
        /// Adds a string field.
        pub fn str(mut self, k: &str, v: &str) -> Self {
            self.key(k);
            write_string(&mut self.buf, v);
            self
        }
        /// Adds an integer field.
        pub fn int(mut self, k: &str, v: i64) -> Self {
            self.key(k);
            let _ = write!(Sink(&mut self.buf), "{}", v);
            self
        }
        /// Adds a boolean field.
        pub fn bool(mut self, k: &str, v: bool) -> Self {
            self.key(k);
            self.buf.extend_from_slice(if v { b"true" } else { b"false" });
            self
        }
        /// Adds a field whose value is already JSON.
        pub fn raw(mut self, k: &str, v: &[u8]) -> Self {
            self.key(k);
            self.buf.extend_from_slice(v);
            self
        }
        /// The object's bytes.
        pub fn finish(mut self) -> Vec<u8> {
            self.buf.push(b'}');
            self.buf
        }
    }

    /// A JSON array of values that are already JSON; `[]` when empty (as Go
    /// writes an empty, non-nil slice).
    pub fn array<I, T>(items: I) -> Vec<u8>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let mut out = vec![b'['];
        for (i, it) in items.into_iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(it.as_ref());
        }
        out.push(b']');
        out
    }

    /// An integer as JSON.
    pub fn int(n: i64) -> Vec<u8> {
        n.to_string().into_bytes()
    }

    /// A boolean as JSON.
    pub fn bool(v: bool) -> Vec<u8> {
        if v { b"true".to_vec() } else { b"false".to_vec() }
    }

    struct Sink<'a>(&'a mut Vec<u8>);

    impl std::fmt::Write for Sink<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
}
