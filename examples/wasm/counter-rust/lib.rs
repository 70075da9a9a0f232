//! counter-rust is the Rust twin of examples/wasm/counter: an integer per
//! object.
//!
//! Methods: inc (adds 1), add ({"amount": N}), get. Each replies with the
//! value after the call. Every change publishes {"value": N} on topic
//! "changes". Replies, events and errors match the Go program byte for byte.

use host_sdk::json::{self, Struct, Type};
use host_sdk::{Program, Result};

host_sdk::program!(register);

// Shaped like the Go handler's `struct { Amount *int64 `json:"amount"` }`.
static ADD: Struct = Struct {
    name: "",
    go_type: r#"struct { Amount *int64 "json:\"amount\"" }"#,
    fields: &[("amount", Type::Int64)],
};

fn register(p: &mut Program) {
    p.method("inc", |_| add(1).map(host_sdk::itoa));
    p.json_method("add", &ADD, |a| match a.opt_int("amount") {
        Some(n) => add(n).map(json::int),
        None => host_sdk::fail(r#"add needs {"amount": N}"#),
    });
    p.method("get", |_| Ok(host_sdk::itoa(host_sdk::get_int("value"))));
}

fn add(n: i64) -> Result<i64> {
    let v = host_sdk::get_int("value").wrapping_add(n);
    host_sdk::put_int("value", v)?;
    host_sdk::publish("changes", json::Object::new().int("value", v).finish())?;
    Ok(v)
}
