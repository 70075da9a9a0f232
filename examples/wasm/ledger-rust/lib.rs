//! ledger-rust is the Rust twin of examples/wasm/ledger: objects calling
//! objects. A ledger object keeps entries; other objects add to it with
//! `host_sdk::call`, and a ledger that follows another's "jobs" topic adds
//! the entry each event names, once in effect however often the event
//! comes. See the Go program for the methods and their text payloads;
//! replies, stored state and errors match it byte for byte.

use host_sdk::{FollowOptions, Program, Result};

host_sdk::program!(register);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// The first n fields of p, one per line, the last holding the rest;
// missing ones are empty.
fn fields(p: &[u8], n: usize) -> Vec<String> {
    let s = text(p);
    let mut f: Vec<String> = s.splitn(n, '\n').map(str::to_string).collect();
    f.resize(n, String::new());
    f
}

// Keeps the handler busy for ms milliseconds, 0: until its budget ends.
fn spin(ms: i64) {
    let until = host_sdk::now() + ms * 1_000_000;
    while ms == 0 || host_sdk::now() < until {}
}

fn register(p: &mut Program) {
    p.method("add", |entry| {
        let e = text(entry);
        if e.starts_with("fail") {
            return host_sdk::fail(format!("refused: {}", e));
        }
        let n = host_sdk::get_int("total") + 1;
        host_sdk::put_int("total", n)?;
        host_sdk::put(format!("entry/{:08}", n), entry)?;
        Ok(host_sdk::itoa(n))
    });
    p.method("total", |_| Ok(host_sdk::itoa(host_sdk::get_int("total"))));
    p.method("entries", |_| {
        let mut b = Vec::new();
        for kv in host_sdk::scan("entry/", 0) {
            b.extend_from_slice(&kv.value);
            b.push(b'\n');
        }
        Ok(b)
    });
    p.method("call", |payload| {
        let f = fields(payload, 5);
        host_sdk::put_int("calls", host_sdk::get_int("calls") + 1)?;
        if let Ok(ms) = f[3].parse::<i64>() {
            spin(ms);
        }
        let r = host_sdk::call_with_key(&f[0], &f[1], f[4].as_bytes(), &f[2]);
        if f[3] == "fail" {
            return host_sdk::fail("failing after the call");
        }
        match r {
            Ok(reply) => Ok([b"ok ".as_slice(), &reply].concat()),
            Err(e) => Ok(format!("error {} {}", e.status, e.message).into_bytes()),
        }
    });
    p.method("spin", |payload| {
        spin(text(payload).parse::<i64>().unwrap_or(0));
        Ok(b"done".to_vec())
    });
    p.method("publish", |payload| {
        host_sdk::publish("jobs", payload)?;
        Ok(Vec::new())
    });
    p.method("follow", |payload| {
        host_sdk::follow(&text(payload), "jobs", FollowOptions::default())?;
        Ok(Vec::new())
    });
    p.method("once", |_| {
        if host_sdk::get("opened").is_some() {
            return Ok(b"again".to_vec());
        }
        host_sdk::put("opened", b"")?;
        Ok(b"first".to_vec())
    });
    p.on_receive(|e| -> Result<()> {
        let f = fields(&e.payload, 4);
        host_sdk::call(&f[0], "add", f[1].as_bytes())?;
        if !f[2].is_empty() {
            let mut key = [0u8; 8];
            host_sdk::random(&mut key);
            let hex: String = key.iter().map(|b| format!("{:02x}", b)).collect();
            if host_sdk::call_with_key(&f[2], "once", b"", &hex)? == b"first" {
                return host_sdk::fail("gate closed: first attempt");
            }
        }
        if let Ok(ms) = f[3].parse::<i64>() {
            spin(ms);
        }
        host_sdk::put_int("received", host_sdk::get_int("received") + 1)
    });
}
