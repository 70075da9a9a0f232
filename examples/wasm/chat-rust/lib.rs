//! chat-rust is the Rust twin of examples/wasm/chat: a chat room per object.
//!
//! Methods:
//!   - post {"author": "...", "text": "..."}: stores the message and
//!     publishes it on topic "messages"; replies {"n": N}, its sequence
//!     number in the room.
//!   - history {"limit": N}: the most recent messages, oldest first
//!     (default 50).
//!   - set_key {"key": "..."}: protects the room; from then on a follower
//!     must present the key (as its follow params) to be admitted.
//!   - share {"tenant": "..."}: on a node with tenancy, lets that tenant's
//!     connections and objects follow the room; other tenants are refused.
//!   - remind {"in_ms": N, "text": "..."}: in N milliseconds the room posts
//!     the text as a message by "reminder". A room keeps its pending
//!     reminders in state and its one alarm at the earliest of them.
//!
//! Replies, events, stored state and errors match the Go program byte for
//! byte.

use host_sdk::json::{self, Struct, Type};
use host_sdk::{Error, Program};

host_sdk::program!(register);

const MAX_TEXT: usize = 4096;

// The Go program's `message` struct.
static MESSAGE: Struct = Struct {
    name: "message",
    go_type: "main.message",
    fields: &[("author", Type::String), ("text", Type::String), ("time", Type::Int64)],
};

static HISTORY: Struct = Struct {
    name: "",
    go_type: r#"struct { Limit int "json:\"limit\"" }"#,
    fields: &[("limit", Type::Int)],
};

static SET_KEY: Struct = Struct {
    name: "",
    go_type: r#"struct { Key string "json:\"key\"" }"#,
    fields: &[("key", Type::String)],
};

static REMIND: Struct = Struct {
    name: "",
    go_type: r#"struct { InMs int64 "json:\"in_ms\""; Text string "json:\"text\"" }"#,
    fields: &[("in_ms", Type::Int64), ("text", Type::String)],
};

/// Keys a pending reminder: remind/DUE_MS/ID, so a scan lists them
/// earliest first.
const REMIND_PREFIX: &str = "remind/";
const MAX_REMINDERS: usize = 100;
const MAX_REMIND_MS: i64 = 365 * 24 * 3600 * 1000;

static SHARE: Struct = Struct {
    name: "",
    go_type: r#"struct { Tenant string "json:\"tenant\"" }"#,
    fields: &[("tenant", Type::String)],
};

/// The tenant of "TENANT.PROGRAM/ID", "" without one.
fn tenant_of(self_id: &str) -> &str {
    let program = self_id.split('/').next().unwrap_or("");
    match program.find('.') {
        Some(i) => &program[..i],
        None => "",
    }
}

struct Message {
    author: String,
    text: String,
    time: i64,
}

impl Message {
    fn to_json(&self) -> Vec<u8> {
        json::Object::new().str("author", &self.author).str("text", &self.text).int("time", self.time).finish()
    }
}

fn msg_key(n: i64) -> String {
    format!("msg/{:016}", n)
}

/// Stores a message and publishes it; returns its number.
fn post(author: &str, text: &str) -> host_sdk::Result<i64> {
    if text.is_empty() {
        return host_sdk::fail(r#"post needs {"text": "..."}"#);
    }
    if text.len() > MAX_TEXT {
        return host_sdk::fail(format!("text is {} bytes, at most {}", text.len(), MAX_TEXT));
    }
    let author = match author {
        "" => "anonymous",
        a => a,
    };
    let msg = Message { author: author.to_string(), text: text.to_string(), time: host_sdk::now() };
    let n = host_sdk::get_int("count").wrapping_add(1);
    host_sdk::put_int("count", n)?;
    let body = msg.to_json();
    host_sdk::put(msg_key(n), &body)?;
    host_sdk::publish("messages", &body)?;
    Ok(n)
}

/// Sets the room's alarm at its earliest pending reminder, or deletes it
/// when none is left.
fn set_next_alarm() -> host_sdk::Result<()> {
    match host_sdk::scan(REMIND_PREFIX, 1).first() {
        Some(kv) => host_sdk::set_alarm(due_of(&kv.key_str())),
        None => host_sdk::delete_alarm(),
    }
}

/// The due time, Unix ms, in a reminder's key.
fn due_of(key: &str) -> i64 {
    key.trim_start_matches(REMIND_PREFIX).split('/').next().and_then(|d| d.parse().ok()).unwrap_or(0)
}

fn register(p: &mut Program) {
    p.json_method("post", &MESSAGE, |m| {
        let n = post(m.str("author"), m.str("text"))?;
        Ok(json::Object::new().int("n", n).finish())
    });
    p.json_method("remind", &REMIND, |a| {
        let text = a.str("text");
        if text.is_empty() || text.len() > MAX_TEXT {
            return host_sdk::fail(format!(r#"remind needs {{"in_ms": N, "text": "..."}} with at most {} bytes of text"#, MAX_TEXT));
        }
        let in_ms = a.int("in_ms");
        if !(0..=MAX_REMIND_MS).contains(&in_ms) {
            return host_sdk::fail(format!("in_ms must be from 0 to {} (a year), not {}", MAX_REMIND_MS, in_ms));
        }
        let pending = host_sdk::scan(REMIND_PREFIX, MAX_REMINDERS as i32 + 1);
        if pending.len() >= MAX_REMINDERS {
            return host_sdk::fail(format!("the room has {} reminders pending, the most it keeps", pending.len()));
        }
        let at = (host_sdk::now() + in_ms * 1_000_000) / 1_000_000;
        let id = host_sdk::get_int("reminders") + 1;
        host_sdk::put_int("reminders", id)?;
        host_sdk::put(format!("{}{:016}/{}", REMIND_PREFIX, at, id), text)?;
        set_next_alarm()?;
        Ok(json::Object::new().int("at", at).finish())
    });
    p.on_alarm(|| {
        let now = host_sdk::now() / 1_000_000;
        for kv in host_sdk::scan(REMIND_PREFIX, MAX_REMINDERS as i32) {
            if due_of(&kv.key_str()) > now {
                break;
            }
            post("reminder", &String::from_utf8_lossy(&kv.value))?;
            host_sdk::delete(&kv.key);
        }
        set_next_alarm()
    });
    p.json_method("history", &HISTORY, |a| {
        let mut limit = a.int("limit");
        if limit <= 0 {
            limit = 50;
        }
        if limit > 1000 {
            limit = 1000;
        }
        let n = host_sdk::get_int("count");
        let mut out = Vec::new();
        let mut i = n.wrapping_sub(limit).wrapping_add(1);
        while i <= n {
            if i >= 1 {
                if let Some(b) = host_sdk::get(msg_key(i)) {
                    if let Ok(f) = json::decode(&b, &MESSAGE) {
                        let m = Message { author: f.str("author").to_string(), text: f.str("text").to_string(), time: f.int("time") };
                        out.push(m.to_json());
                    }
                }
            }
            i += 1;
        }
        Ok(json::array(out))
    });
    p.json_method("set_key", &SET_KEY, |a| {
        host_sdk::put("key", a.str("key"))?;
        Ok(json::bool(true))
    });
    p.json_method("share", &SHARE, |a| {
        let t = a.str("tenant");
        if t.is_empty() {
            return Err(Error::new("share needs a tenant"));
        }
        host_sdk::put(format!("share/{}", t), &[1u8])?;
        Ok(json::bool(true))
    });
    p.on_follow(|r| {
        // With tenancy, self is TENANT.chat/ID: followers of another tenant
        // need the room shared with theirs.
        let me = host_sdk::self_id();
        if r.tenant != tenant_of(&me) && host_sdk::get(format!("share/{}", r.tenant)).is_none() {
            return Err(Error::refuse(format!("this room is not shared with tenant {}", r.tenant)));
        }
        let key = match host_sdk::get("key") {
            Some(k) if !k.is_empty() => k,
            _ => return Ok(()),
        };
        if !host_sdk::constant_time_eq(&key, &r.params) {
            return Err(Error::refuse("this room needs its key"));
        }
        Ok(())
    });
}
