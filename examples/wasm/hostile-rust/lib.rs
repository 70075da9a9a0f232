//! hostile-rust is a test-only program that misbehaves on purpose, one way
//! per method, so the host's defences can be tested against a real Rust
//! guest built with the Rust SDK.

use host_sdk::{sys, Program};

host_sdk::program!(register);

fn register(p: &mut Program) {
    p.method("ok", |_| Ok(b"ok".to_vec()));
    // Registers no on_alarm handler, so the host refuses this alarm.
    p.method("set_alarm", |_| {
        host_sdk::set_alarm(host_sdk::now() / 1_000_000)?;
        Ok(Vec::new())
    });
    // panic aborts: a trap, reported as a TrapError.
    p.method("panic", |_| {
        host_sdk::put("touched", "yes")?;
        let v: Vec<u8> = Vec::new();
        let i = host_sdk::get_int("nothing") as usize + 3;
        Ok(vec![v[i]]) // index out of bounds
    });
    p.method("explicit_panic", |_| -> host_sdk::Result<Vec<u8>> {
        host_sdk::put("touched", "yes")?;
        panic!("on purpose")
    });
    // oob passes a pointer far outside memory to a host function.
    p.method("oob", |_| {
        host_sdk::put("touched", "yes")?;
        unsafe { sys::state_get(0xFFFF_FF00usize as *const u8, 1024) };
        Ok(b"unreachable".to_vec())
    });
    // oob_len passes an in-bounds pointer with a length that overflows.
    p.method("oob_len", |_| {
        unsafe { sys::publish(16 as *const u8, -1, 16 as *const u8, 0x7fff_ffff) };
        Ok(b"unreachable".to_vec())
    });
    // big_reply replies with more than the host accepts.
    p.method("big_reply", |_| Ok(vec![0u8; 8 << 20]));
    // loop never returns: the budget must stop it.
    p.method("loop", |_| {
        host_sdk::put("touched", "yes")?;
        let mut i: u64 = 0;
        loop {
            i = unsafe { std::ptr::read_volatile(&i) }.wrapping_add(1);
        }
    });
    // bomb allocates until the page limit stops it.
    p.method("bomb", |_| {
        let mut sink: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut v = vec![0u8; 8 << 20];
            v[0] = 1;
            sink.push(v);
            if sink.len() == usize::MAX {
                return Ok(Vec::new());
            }
        }
    });
    // recurse overflows the (64 KiB) stack: the stack sits first in memory,
    // so overflowing it is an out-of-bounds access, a trap.
    p.method("recurse", |_| Ok(vec![recurse(1 << 20, 0) as u8]));
    // publish_storm publishes 1 MiB payloads aiming at 1 GiB, ignoring
    // errors: the host's per-call caps must end it and commit nothing.
    p.method("publish_storm", |_| {
        host_sdk::put("touched", "yes")?;
        let buf = vec![b'x'; 1 << 20];
        let mut sent = 0u32;
        for _ in 0..1024 {
            if host_sdk::publish("storm", &buf).is_ok() {
                sent += 1;
            }
        }
        Ok(sent.to_string().into_bytes())
    });
    // alloc leaks 1 MiB per call into a global, so calls on one instance
    // creep up to the page limit; it writes and publishes first, and
    // replies with the MiB held.
    p.method("alloc", |_| {
        let calls = host_sdk::get_int("allocs") + 1;
        host_sdk::put_int("allocs", calls)?;
        host_sdk::publish("alloc", calls.to_string())?;
        let held = LEAK.with(|l| {
            let mut v = vec![0u8; 1 << 20];
            for i in (0..v.len()).step_by(4096) {
                v[i] = 1;
            }
            let mut l = l.borrow_mut();
            l.push(v);
            l.len()
        });
        Ok(format!("{{\"held_mib\":{},\"calls\":{}}}", held, calls).into_bytes())
    });
    p.method("fail", |_| host_sdk::fail("failed on purpose"));
    p.method("get", |_| Ok(host_sdk::get("touched").unwrap_or_default()));
    p.method("self", |_| Ok(host_sdk::self_id().into_bytes()));
    p.method("random", |_| {
        let mut b = [0u8; 32];
        host_sdk::random(&mut b);
        Ok(if b.iter().any(|&c| c != 0) { b"random".to_vec() } else { b"zeros".to_vec() })
    });
    p.method("scan", |_| {
        host_sdk::put("a/1", "x")?;
        host_sdk::put("a/2", "yy")?;
        host_sdk::put("b/1", "z")?;
        let mut out = Vec::new();
        for kv in host_sdk::scan("a/", 10) {
            out.extend_from_slice(&kv.key);
            out.push(b'=');
            out.extend_from_slice(&kv.value);
            out.push(b';');
        }
        host_sdk::delete("a/1");
        out.extend_from_slice(if host_sdk::get("a/1").is_none() { b"deleted" } else { b"kept" });
        Ok(out)
    });
    p.method("follow", |payload| {
        match host_sdk::follow("chat/room", "messages", host_sdk::FollowOptions { filter: "", params: payload }) {
            Ok(()) => Ok(b"followed".to_vec()),
            Err(host_sdk::Error::Refused(r)) => Ok(format!("refused: {}", r).into_bytes()),
            Err(e) => Err(e),
        }
    });
    p.method("unfollow", |_| host_sdk::unfollow("chat/room", "messages").map(|()| b"unfollowed".to_vec()));
    p.method("log", |_| {
        host_sdk::log("hello from rust");
        Ok(Vec::new())
    });
    p.on_receive(|e| {
        host_sdk::put(format!("got/{}/{}/{}", e.publisher, e.topic, e.seq), &e.payload)?;
        if e.payload == b"fail" {
            return host_sdk::fail("receive failed on purpose");
        }
        Ok(())
    });
    p.on_event(|e| {
        if e.payload == b"skip" {
            return Err(host_sdk::Error::Skip);
        }
        let mut out = format!("{}:{}:{}:{}:", e.publisher, e.topic, e.seq, e.time).into_bytes();
        out.extend_from_slice(&e.payload);
        Ok(out)
    });
}

thread_local! {
    // What alloc keeps across calls: it only grows until the instance is
    // replaced.
    static LEAK: std::cell::RefCell<Vec<Vec<u8>>> = std::cell::RefCell::new(Vec::new());
}

#[inline(never)]
fn recurse(n: u32, acc: u64) -> u64 {
    // Each frame keeps a buffer that is read after the inner call returns,
    // so the recursion cannot become a loop.
    let mut buf = [0u8; 256];
    unsafe { std::ptr::write_volatile(&mut buf[(n % 256) as usize], n as u8) };
    if n == 0 {
        return acc;
    }
    let r = recurse(n - 1, acc);
    r ^ unsafe { std::ptr::read_volatile(&buf[(n % 256) as usize]) } as u64
}
