//go:build wasip1

// Command hostile is a test-only program that misbehaves on purpose, one way
// per method, so the host's defences can be tested against a real guest.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	sdk "github.com/durable-host/host/sdk/go"
)

// eventPrefix starts every frame the event export shapes. A variable, not
// a constant: its bytes are then in the module's data (a short constant
// is built from immediates in code), where a test can change them.
var eventPrefix = "EVENT:"

//go:wasmimport host state_get
func rawStateGet(kp uint32, kn int32) int32

//go:wasmimport host publish
func rawPublish(tp uint32, tn int32, pp uint32, pn int32) int32

//go:wasmimport host object_call
func rawObjectCall(rp uint32, rn int32) int32

var sink [][]byte

// leak is what alloc keeps across calls: it only grows until the instance
// is replaced.
var leak [][]byte

// recurse never returns: each frame keeps a buffer it reads after the
// inner call, so the compiler cannot turn it into a loop.
//
//go:noinline
func recurse(n int) int {
	var buf [256]byte
	buf[n%256] = byte(n)
	return recurse(n+1) + int(buf[(n*7)%256])
}

// payloadArg is the number after the colon of a payload "word:N".
func payloadArg(p string) int64 {
	_, n, _ := strings.Cut(strings.Trim(p, `"`), ":")
	v, _ := strconv.ParseInt(n, 10, 64)
	return v
}

// attempt runs f and reports what happened to it, for the sandbox probes.
func attempt(out map[string]string, what string, f func() error) {
	if err := f(); err != nil {
		out[what] = "error: " + err.Error()
		return
	}
	out[what] = "succeeded"
}

func init() {
	sdk.Method("ok", func(p []byte) ([]byte, error) { return []byte("ok"), nil })
	// loop never returns: the budget must stop it.
	sdk.Method("loop", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		for i := 0; ; i++ {
			if i < 0 {
				return nil, nil
			}
		}
	})
	// bomb allocates until the page limit stops it.
	sdk.Method("bomb", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		for {
			sink = append(sink, make([]byte, 8<<20))
		}
	})
	// trap executes unreachable through a nil dereference the SDK cannot
	// recover from: a runtime fatal error.
	sdk.Method("trap", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		var p *[1 << 30]byte
		p = (*[1 << 30]byte)(unsafe.Pointer(uintptr(0xfffffff0)))
		return p[:16], nil
	})
	// panic is recovered by the SDK and becomes an error reply.
	sdk.Method("panic", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		panic("on purpose")
	})
	// oob passes a pointer far outside memory to a host function.
	sdk.Method("oob", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		rawStateGet(0xFFFFFF00, 1024)
		return []byte("unreachable"), nil
	})
	// oob_len passes an in-bounds pointer with a length that overflows.
	sdk.Method("oob_len", func([]byte) ([]byte, error) {
		rawPublish(16, -1, 16, 0x7fffffff)
		return []byte("unreachable"), nil
	})
	// call_oob hands object_call a request far outside memory.
	sdk.Method("call_oob", func([]byte) ([]byte, error) {
		rawObjectCall(0xFFFFFF00, 1024)
		return []byte("unreachable"), nil
	})
	// call_bad makes calls the host refuses without trapping: a request
	// that does not decode, one over the size limit, a target that is no
	// object name. It replies with each refusal's status.
	sdk.Method("call_bad", func([]byte) ([]byte, error) {
		var out []string
		garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x0f}
		if n := rawObjectCall(uint32(uintptr(unsafe.Pointer(&garbage[0]))), int32(len(garbage))); n >= 0 {
			return nil, errors.New("a malformed call request was accepted")
		}
		for _, c := range []struct {
			target  string
			payload []byte
		}{{"x/y", make([]byte, 2<<20)}, {"no-slash", nil}} {
			_, err := sdk.Call(c.target, "m", c.payload)
			var ce *sdk.CallError
			if !errors.As(err, &ce) {
				return nil, fmt.Errorf("call %s: %v", c.target, err)
			}
			out = append(out, fmt.Sprint(ce.Status))
		}
		return []byte(strings.Join(out, " ")), nil
	})
	// publish_then_fail writes and publishes, then returns an error.
	sdk.Method("publish_then_fail", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		if err := sdk.Publish("t", []byte("must not be seen")); err != nil {
			return nil, err
		}
		return nil, errors.New("failed after publishing")
	})
	// big_reply replies with more than the host accepts.
	sdk.Method("big_reply", func([]byte) ([]byte, error) {
		return make([]byte, 8<<20), nil
	})
	// Delivery test hooks.
	sdk.OnFollow(func(r sdk.FollowRequest) error {
		sdk.PutInt("hook_runs", sdk.GetInt("hook_runs")+1)
		if string(r.Params) == "deny" {
			return sdk.Refuse("denied on purpose")
		}
		return nil
	})
	sdk.Method("hook_runs", func([]byte) ([]byte, error) { return sdk.Itoa(sdk.GetInt("hook_runs")), nil })
	// publish publishes the payload on topic "t" (or the topic given as
	// {"topic": ..., "payload": ..., "size": N} JSON when it parses).
	sdk.Method("publish", func(p []byte) ([]byte, error) {
		var in struct {
			Topic   string          `json:"topic"`
			Payload json.RawMessage `json:"payload"`
			Size    int             `json:"size"`
		}
		topic, body := "t", p
		if json.Unmarshal(p, &in) == nil && in.Topic != "" {
			topic, body = in.Topic, in.Payload
			if in.Size > 0 {
				body = []byte(`"` + strings.Repeat("x", in.Size) + `"`)
			}
		}
		return nil, sdk.Publish(topic, body)
	})
	sdk.JSONMethod("follow", func(in struct {
		Publisher string `json:"publisher"`
		Topic     string `json:"topic"`
		Filter    string `json:"filter"`
		Params    string `json:"params"`
	}) (bool, error) {
		return true, sdk.Follow(in.Publisher, in.Topic, sdk.FollowOptions{Filter: in.Filter, Params: []byte(in.Params)})
	})
	// receive fails on "fail", loops on "loop", fails until a wall-clock
	// time on "fail_until:UNIX_MS", spins for a while on "spin:MS" (or
	// sleeps on "sleep:MS") and then records it; else it records the event.
	sdk.OnReceive(func(e sdk.Event) error {
		p := string(e.Payload)
		switch {
		case p == `"fail"`:
			return errors.New("receive failed on purpose")
		case p == `"loop"`:
			for i := 0; ; i++ {
				if i < 0 {
					return nil
				}
			}
		case strings.HasPrefix(p, `"fail_until:`):
			if time.Now().UnixMilli() < payloadArg(p) {
				return errors.New("receive failing on purpose for a while")
			}
		case strings.HasPrefix(p, `"spin:`):
			d := time.Duration(payloadArg(p)) * time.Millisecond
			for start := time.Now(); time.Since(start) < d; {
			}
		case strings.HasPrefix(p, `"sleep:`):
			// As slow as spin, without holding a CPU: WASI's poll_oneoff.
			time.Sleep(time.Duration(payloadArg(p)) * time.Millisecond)
		}
		n := sdk.GetInt("received") + 1
		sdk.PutInt("received", n)
		sdk.Put(fmt.Sprintf("got/%06d", n), []byte(fmt.Sprintf("%s %s %d %s", e.Publisher, e.Topic, e.Seq, e.Payload)))
		return nil
	})
	sdk.Method("received", func([]byte) ([]byte, error) {
		var out []string
		for _, kv := range sdk.Scan("got/", 100000) {
			out = append(out, string(kv.Value))
		}
		return json.Marshal(out)
	})
	// event shapes connection frames: eventPrefix + payload, or nothing when
	// the payload mentions skip; on "readstate" it reaches for the
	// object's state, which an event handler does not have.
	sdk.OnEvent(func(e sdk.Event) ([]byte, error) {
		if strings.Contains(string(e.Payload), "skip") {
			return nil, sdk.ErrSkip
		}
		if strings.Contains(string(e.Payload), "readstate") {
			v, _ := sdk.Get("touched")
			return append([]byte("STATE:"), v...), nil
		}
		return append([]byte(eventPrefix), e.Payload...), nil
	})
	// shape answers the prefix the event export puts on frames, after
	// sleeping for the milliseconds its payload gives: a hot update test
	// makes v2 by changing the prefix's bytes in this module, and tells
	// by it which version a call ran on.
	sdk.Method("shape", func(p []byte) ([]byte, error) {
		if ms, err := strconv.Atoi(string(p)); err == nil && ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		return []byte(eventPrefix), nil
	})
	// recurse recurses without bound: the goroutine stack grows until the
	// page limit (or Go's stack limit) stops it.
	sdk.Method("recurse", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		return sdk.Itoa(int64(recurse(0))), nil
	})
	// publish_storm publishes size-byte payloads (1 MiB by default) on
	// topic "storm" until total bytes (1 GiB by default) went out, ignoring
	// errors: the host's per-call caps must end it. Payload:
	// {"size": N, "total": M}.
	sdk.Method("publish_storm", func(p []byte) ([]byte, error) {
		in := struct{ Size, Total int }{1 << 20, 1 << 30}
		json.Unmarshal(p, &in)
		sdk.Put("touched", []byte("yes"))
		buf := make([]byte, max(in.Size, 1))
		for i := range buf {
			buf[i] = 'x'
		}
		var sent, failed int64
		for done := 0; done < in.Total; done += len(buf) {
			if sdk.Publish("storm", buf) != nil {
				failed++
			} else {
				sent++
			}
		}
		return json.Marshal(map[string]int64{"sent": sent, "failed": failed})
	})
	// alloc leaks: each call writes and publishes, then keeps a fresh
	// 1 MiB buffer in a global, so calls on one instance creep up to the
	// page limit. It replies with the MiB held and the calls committed.
	sdk.Method("alloc", func([]byte) ([]byte, error) {
		calls := sdk.GetInt("allocs") + 1
		sdk.PutInt("allocs", calls)
		if err := sdk.Publish("alloc", sdk.Itoa(calls)); err != nil {
			return nil, err
		}
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		leak = append(leak, b)
		return json.Marshal(map[string]int64{"held_mib": int64(len(leak)), "calls": calls})
	})
	// wasi_fs tries the filesystem through WASI and reports each attempt;
	// the payload, when not empty, is one more path to write. The host
	// grants no directory, so every attempt must fail. It also reports the
	// environment and arguments it was given.
	sdk.Method("wasi_fs", func(p []byte) ([]byte, error) {
		out := map[string]string{}
		attempt(out, "open /etc/passwd", func() error {
			f, err := os.Open("/etc/passwd")
			if err == nil {
				f.Close()
			}
			return err
		})
		attempt(out, "read /etc/passwd", func() error { _, err := os.ReadFile("/etc/passwd"); return err })
		attempt(out, "readdir /", func() error { _, err := os.ReadDir("/"); return err })
		attempt(out, "readdir .", func() error { _, err := os.ReadDir("."); return err })
		attempt(out, "write /tmp/x", func() error { return os.WriteFile("/tmp/x", []byte("hostile"), 0o644) })
		attempt(out, "mkdir /tmp/hostile", func() error { return os.Mkdir("/tmp/hostile", 0o755) })
		if len(p) > 0 {
			attempt(out, "write "+string(p), func() error { return os.WriteFile(string(p), []byte("hostile"), 0o644) })
		}
		out["env"] = strings.Join(os.Environ(), " ")
		out["args"] = strings.Join(os.Args, " ")
		return json.Marshal(out)
	})
	// wasi_net tries the network: a TCP dial, a UDP datagram, a listener
	// and a raw socket. Go's net on wasip1 is an in-process fake unless the
	// host preopens sockets, which it does not: nothing may reach the
	// host's network. Payload: {"tcp": "HOST:PORT", "udp": "HOST:PORT"}.
	sdk.Method("wasi_net", func(p []byte) ([]byte, error) {
		in := struct{ TCP, UDP string }{"127.0.0.1:80", "127.0.0.1:53"}
		json.Unmarshal(p, &in)
		out := map[string]string{}
		attempt(out, "dial tcp", func() error {
			c, err := net.Dial("tcp", in.TCP)
			if err == nil {
				c.Close()
			}
			return err
		})
		attempt(out, "send udp", func() error {
			c, err := net.Dial("udp", in.UDP)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("hostile"))
			return err
		})
		attempt(out, "listen tcp", func() error {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				l.Close()
			}
			return err
		})
		attempt(out, "socket", func() error {
			fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
			if err == nil {
				syscall.Close(fd)
			}
			return err
		})
		return json.Marshal(out)
	})
	sdk.Method("get", func([]byte) ([]byte, error) {
		v, _ := sdk.Get("touched")
		return v, nil
	})
	// remember keeps the payload in the instance's memory, not in state;
	// recall returns it: what one object leaves in an instance, another
	// object must never see.
	sdk.Method("remember", func(p []byte) ([]byte, error) {
		remembered = append([]byte(nil), p...)
		return nil, nil
	})
	sdk.Method("recall", func([]byte) ([]byte, error) { return remembered, nil })
	alarms()
}

// alarms registers the alarm probes: methods that set, read and delete
// the alarm (with any value, as a guest may), and an alarm handler that
// does what "alarm_mode" says: count and publish (""), fail, loop past
// its budget, trap, or set the next alarm a second later ("rearm").
func alarms() {
	sdk.Method("alarm_at", func(p []byte) ([]byte, error) {
		ms, err := strconv.ParseInt(string(p), 10, 64)
		if err != nil {
			return nil, err
		}
		return nil, sdk.SetAlarm(time.UnixMilli(ms))
	})
	sdk.Method("alarm_in", func(p []byte) ([]byte, error) {
		ms, _ := strconv.ParseInt(string(p), 10, 64)
		return nil, sdk.SetAlarm(time.Unix(0, sdk.Now()).Add(time.Duration(ms) * time.Millisecond))
	})
	sdk.Method("alarm_then_fail", func(p []byte) ([]byte, error) {
		if err := sdk.SetAlarm(time.Unix(0, sdk.Now())); err != nil {
			return nil, err
		}
		sdk.PutInt("touched_by_failing_call", 1)
		return nil, errors.New("fails after setting an alarm")
	})
	sdk.Method("alarm_get", func([]byte) ([]byte, error) {
		t, ok := sdk.Alarm()
		if !ok {
			return []byte("-1"), nil
		}
		return sdk.Itoa(t.UnixMilli()), nil
	})
	sdk.Method("alarm_delete", func([]byte) ([]byte, error) { return nil, sdk.DeleteAlarm() })
	sdk.Method("alarm_mode", func(p []byte) ([]byte, error) {
		sdk.Put("alarm_mode", p)
		return nil, nil
	})
	sdk.Method("alarm_runs", func([]byte) ([]byte, error) { return sdk.Itoa(sdk.GetInt("alarm_runs")), nil })
	sdk.OnAlarm(func() error {
		// Every run counts itself, but only a committed run's count stays.
		sdk.PutInt("alarm_runs", sdk.GetInt("alarm_runs")+1)
		mode, _ := sdk.Get("alarm_mode")
		switch string(mode) {
		case "fail":
			return errors.New("the alarm handler fails")
		case "loop":
			for {
			}
		case "trap":
			var p *int
			return fmt.Errorf("%d", *p)
		case "rearm":
			return sdk.SetAlarm(time.Unix(0, sdk.Now()).Add(time.Second))
		}
		return sdk.PublishJSON("alarms", map[string]int64{"runs": sdk.GetInt("alarm_runs")})
	})
}

var remembered []byte

func main() {}
