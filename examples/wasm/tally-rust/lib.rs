//! tally-rust is the Rust twin of examples/wasm/tally: a durable follower.
//! A tally object follows a chat room and counts messages per author in its
//! own state.
//!
//! Methods:
//!   - follow {"publisher": "chat/room1", "topic": "messages", "params": "key"}
//!   - unfollow {"publisher": "chat/room1", "topic": "messages"}
//!   - counts: {"authors": {"ann": 3, ...}, "duplicates": 0, "total": N}
//!
//! Its receive handler runs once per event in effect: the host skips events
//! this object already committed. It still checks, and counts any event seen
//! twice under "duplicates", which must stay 0.
//!
//! Replies, stored state and errors match the Go program byte for byte (Go's
//! json.Marshal writes map keys sorted, so "counts" lists its fields in that
//! order, and the authors in key order, which is the state's scan order).

use host_sdk::json::{self, Struct, Type};
use host_sdk::{FollowOptions, Program};

host_sdk::program!(register);

// The Go program's `followReq` struct.
static FOLLOW_REQ: Struct = Struct {
    name: "followReq",
    go_type: "main.followReq",
    fields: &[
        ("publisher", Type::String),
        ("topic", Type::String),
        ("filter", Type::String),
        ("params", Type::String),
    ],
};

// What the receive handler reads from a chat message: Go's
// `struct { Author string `json:"author"` }`.
static MESSAGE: Struct = Struct {
    name: "",
    go_type: r#"struct { Author string "json:\"author\"" }"#,
    fields: &[("author", Type::String)],
};

fn topic(f: &json::Fields) -> &str {
    match f.str("topic") {
        "" => "messages",
        t => t,
    }
}

fn register(p: &mut Program) {
    p.json_method("follow", &FOLLOW_REQ, |f| {
        let opt = FollowOptions { filter: f.str("filter"), params: f.str("params").as_bytes() };
        host_sdk::follow(f.str("publisher"), topic(f), opt)?;
        Ok(json::bool(true))
    });
    p.json_method("unfollow", &FOLLOW_REQ, |f| {
        host_sdk::unfollow(f.str("publisher"), topic(f))?;
        Ok(json::bool(true))
    });
    p.method("counts", |_| {
        let mut authors = json::Object::new();
        for kv in host_sdk::scan("author/", 10000) {
            let name = kv.key_str();
            let n = std::str::from_utf8(&kv.value).ok().and_then(|s| s.trim().parse::<i64>().ok()).unwrap_or(0);
            authors = authors.int(name.strip_prefix("author/").unwrap_or(&name), n);
        }
        Ok(json::Object::new()
            .raw("authors", &authors.finish())
            .int("duplicates", host_sdk::get_int("duplicates"))
            .int("total", host_sdk::get_int("total"))
            .finish())
    });
    p.on_receive(|e| {
        let seen = format!("seen/{}/{:016}", e.publisher, e.seq);
        if host_sdk::get(&seen).is_some() {
            return host_sdk::put_int("duplicates", host_sdk::get_int("duplicates").wrapping_add(1));
        }
        host_sdk::put(&seen, b"")?;
        // As Go's json.Unmarshal into the struct, errors ignored: a payload
        // that is not such an object counts for "anonymous".
        let author = match json::decode(&e.payload, &MESSAGE) {
            Ok(f) if !f.str("author").is_empty() => f.str("author").to_string(),
            _ => "anonymous".to_string(),
        };
        let key = format!("author/{}", author);
        host_sdk::put_int(&key, host_sdk::get_int(&key).wrapping_add(1))?;
        host_sdk::put_int("total", host_sdk::get_int("total").wrapping_add(1))
    });
}
