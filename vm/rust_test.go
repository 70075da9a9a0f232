package vm_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// The Rust examples are twins of the Go ones: through the public surface
// (replies, errors, published events, stored state) they must be
// indistinguishable. These tests run one script against both and compare.

// needRust skips when no wasm-capable rustc built the Rust examples.
func needRust(t testing.TB) {
	t.Helper()
	if _, ok := vmtest.Examples(t)["counter-rust"]; !ok {
		t.Skip("no rustc with the wasm32 target: Rust examples not built")
	}
}

type step struct {
	method  string
	payload string
}

// outcome is everything observable about one call.
type outcome struct {
	reply     string
	err       string // "" or the error's kind and message
	published []string
}

func describeErr(err error) string {
	if err == nil {
		return ""
	}
	var ge *vm.GuestError
	var re *vm.RefusedError
	var te *vm.TrapError
	switch {
	case errors.As(err, &ge):
		return "guest: " + ge.Message
	case errors.As(err, &re):
		return "refused: " + re.Reason
	case errors.Is(err, vm.ErrMethodNotFound):
		return "not found: " + err.Error()
	case errors.As(err, &te):
		return "trap"
	}
	return fmt.Sprintf("%T: %v", err, err)
}

// times matches the time a chat message carries: it comes from the host's
// clock, so the twins differ there and nowhere else.
var times = regexp.MustCompile(`"time":[0-9]+`)

func normalize(s string, from, to int64, t *testing.T) string {
	return times.ReplaceAllStringFunc(s, func(m string) string {
		var v int64
		fmt.Sscanf(m, `"time":%d`, &v)
		if v < from || v > to || v <= 0 {
			t.Errorf("time %d outside the call's window [%d, %d]", v, from, to)
		}
		return `"time":T`
	})
}

// runScript runs steps against a fresh instance of program and returns the
// outcome of each and the final state.
func runScript(t *testing.T, e *vm.Engine, program string, steps []step) ([]outcome, []string) {
	t.Helper()
	inst := instance(t, e, program)
	h := newMemHost()
	var outs []outcome
	for _, s := range steps {
		before := len(h.published)
		from := time.Now().UnixNano()
		var payload []byte
		if s.payload != "" {
			payload = []byte(s.payload)
		}
		out, err := inst.Call(h, s.method, payload)
		to := time.Now().UnixNano()
		// Replies (history) carry the times of earlier calls.
		o := outcome{reply: normalize(string(out), 1, to, t), err: describeErr(err)}
		for _, p := range h.published[before:] {
			o.published = append(o.published, normalize(p, from, to, t))
		}
		outs = append(outs, o)
		if inst.Broken() {
			t.Fatalf("%s: %s %q broke the instance: %v", program, s.method, s.payload, err)
		}
	}
	var state []string
	for k, v := range h.state {
		state = append(state, k+"="+normalize(string(v), 1, time.Now().UnixNano(), t))
	}
	sort.Strings(state)
	return outs, state
}

func compareTwins(t *testing.T, goProg, rustProg string, steps []step) {
	t.Helper()
	e := newEngine(t, 0, 0)
	gouts, gstate := runScript(t, e, goProg, steps)
	routs, rstate := runScript(t, e, rustProg, steps)
	for i, s := range steps {
		g, r := gouts[i], routs[i]
		if g.reply != r.reply || g.err != r.err || strings.Join(g.published, "\n") != strings.Join(r.published, "\n") {
			t.Errorf("%s %q:\n go:   reply %q err %q published %q\n rust: reply %q err %q published %q",
				s.method, s.payload, g.reply, g.err, g.published, r.reply, r.err, r.published)
		} else if testing.Verbose() {
			t.Logf("%s %q: reply %q err %q published %q", s.method, s.payload, g.reply, g.err, g.published)
		}
	}
	if strings.Join(gstate, "\n") != strings.Join(rstate, "\n") {
		t.Errorf("final state:\n go:   %q\n rust: %q", gstate, rstate)
	}
}

// badJSON are payloads Go's encoding/json refuses in every way the scanner
// and the decoder know, plus edge cases it accepts.
var badJSON = []string{
	`{"amount":`, `{"amount": x}`, `nul`, `tru`, `fals`, `{"amount":1} x`, `{"a":1,}`, `   `,
	`{"a" 1}`, `{"a":1 "b":2}`, `[1 2]`, `{1:2}`, `-`, `-x`, `1.`, `1.x`, `1e`, `1e+`, `01`, `"\x"`,
	`"\u12g4"`, "\"a\x01\"", "\x00", "\xff", "\x7f", "\xa0", "\xad", "\xe9", `'a'`, `"a`, `{"a":"b"`,
	`[`, `]`, `}`, `{]`, `[}`, `{"a":[1,{"b":[}]}`, "\t\r\n", `{"amount":1}}`, `"\`, `\`,
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	`{"amount":{"nested":[1,2,{"x":"}"}]},"amount":2}`, `null`, `5`, `"s"`, `[1]`, `true`, `{}`, `[]`,
	`{"x":"\ud800"}`, `{"x":1e400}`, `-0`, `{"amount":-0}`,
}

func TestRustCounterTwin(t *testing.T) {
	needRust(t)
	steps := []step{
		{"get", ""}, {"inc", ""}, {"inc", "ignored payload"}, {"get", ""},
		{"add", `{"amount": 39}`}, {"add", `{"AMOUNT": 1}`}, {"add", `{"Amount": 1, "amount": 2}`},
		{"add", `{"amount": -45}`}, {"add", ``}, {"add", `{}`}, {"add", `{"amount": null}`},
		{"add", `{"amount": "x"}`}, {"add", `{"amount": 1.5}`}, {"add", `{"amount": 1e2}`}, {"add", `{"amount": 1.0}`},
		{"add", `{"amount": 99999999999999999999}`}, {"add", `{"amount": true}`}, {"add", `{"amount": {}}`},
		{"add", `{"amount": []}`}, {"add", `{"amount": "x", "amount": 5}`}, {"add", `{"am\u006funt": 3}`},
		{"add", `{"other": "x", "amount": 1}`}, {"add", `{"amount": 9223372036854775807}`}, {"inc", ""},
		{"add", `{"amount": -9223372036854775808}`}, {"get", ""},
		{"nope", ""}, {"", ""}, {"Inc", ""},
	}
	for _, p := range badJSON {
		steps = append(steps, step{"add", p})
	}
	compareTwins(t, "counter", "counter-rust", steps)
}

func TestRustChatTwin(t *testing.T) {
	needRust(t)
	steps := []step{
		{"history", ""}, {"post", `{"author": "ann", "text": "hello"}`}, {"post", `{"text": "no author"}`},
		{"post", `{"author": "", "text": "empty author"}`}, {"post", `{"author": "bob"}`}, {"post", `{"text": ""}`},
		{"post", ``}, {"post", `{"Text": "case", "AUTHOR": "Cy"}`},
		{"post", `{"author": "a<b>&c", "text": "h\u00e9llo \u2028 \u2029 \n\t\r\b\f \"q\" \\ / \u0001 \u007f é 😀 \ud83d\ude00 \ud800 \udc00x"}`},
		{"post", "{\"author\": \"raw\xff\xfe bytes \xe2\x82 and \xed\xa0\x80\", \"text\": \"\xf0\x9f\x98\x80\xc0\xaf\"}"},
		{"post", `{"text": 5}`}, {"post", `{"author": 5, "text": true}`}, {"post", `{"text": "a", "time": "x"}`},
		{"post", `{"text": "a", "time": 1.5}`}, {"post", `{"text": "with time", "time": 5}`},
		{"post", `{"text": "` + strings.Repeat("x", 4096) + `"}`}, {"post", `{"text": "` + strings.Repeat("x", 4097) + `"}`},
		{"post", `{"text": "` + strings.Repeat("é", 2049) + `"}`},
		{"history", ""}, {"history", `{}`}, {"history", `{"limit": 2}`}, {"history", `{"limit": 1.5}`},
		{"history", `{"limit": "x"}`}, {"history", `{"limit": -1}`}, {"history", `{"limit": 2000}`},
		{"history", `{"limit": 1000}`}, {"history", `{"limit": null}`}, {"history", `[]`},
		{"set_key", `{"key": "k1"}`}, {"set_key", ``}, {"set_key", `{"key": 1}`}, {"set_key", `{"key": "s3cret"}`},
		{"nope", ""},
	}
	for _, p := range badJSON {
		steps = append(steps, step{"post", p}, step{"history", p}, step{"set_key", p})
	}
	compareTwins(t, "chat", "chat-rust", steps)
}

func TestRustChatFollowHook(t *testing.T) {
	needRust(t)
	e := newEngine(t, 0, 0)
	req := func(params string) *abi.FollowRequest {
		return &abi.FollowRequest{Publisher: "chat/room", Topic: "messages", Kind: abi.FollowerObject,
			Follower: "other/1", Params: []byte(params)}
	}
	results := map[string][]string{}
	for _, prog := range []string{"chat", "chat-rust"} {
		inst := instance(t, e, prog)
		if !inst.Module().Has(abi.HandlerFollow) || inst.Module().Has(abi.HandlerReceive) || inst.Module().Has(abi.HandlerEvent) {
			t.Fatalf("%s: handlers %b, want follow only", prog, inst.Module().Handlers)
		}
		h := newMemHost()
		var got []string
		got = append(got, describeErr(inst.Follow(h, req(""))), describeErr(inst.Follow(h, req("anything"))))
		if _, err := inst.Call(h, "set_key", []byte(`{"key":"s3cret"}`)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"", "s3cre", "s3cret", "s3cretx", "S3CRET"} {
			got = append(got, describeErr(inst.Follow(h, req(p))))
		}
		conn := req("s3cret")
		conn.Kind = abi.FollowerConnection
		got = append(got, describeErr(inst.Follow(h, conn)))
		if _, err := inst.Call(h, "set_key", []byte(`{"key":""}`)); err != nil {
			t.Fatal(err)
		}
		got = append(got, describeErr(inst.Follow(h, req("whatever"))))
		if inst.Broken() {
			t.Fatalf("%s: broken", prog)
		}
		results[prog] = got
	}
	want := []string{"", "", "refused: this room needs its key", "refused: this room needs its key", "",
		"refused: this room needs its key", "refused: this room needs its key", "", ""}
	for prog, got := range results {
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%s: follow outcomes %q, want %q", prog, got, want)
		}
	}
	for _, prog := range []string{"counter", "counter-rust"} {
		inst := instance(t, e, prog)
		if inst.Module().Handlers != 0 {
			t.Errorf("%s: handlers %b, want none", prog, inst.Module().Handlers)
		}
		if err := inst.Follow(newMemHost(), req("x")); err != nil {
			t.Errorf("%s: follow without a hook: %v", prog, err)
		}
	}
}

// logHost records log lines and answers follows with a refusal.
type logHost struct {
	*memHost
	logs    []string
	refuse  string
	follows []abi.FollowRequest
}

func (h *logHost) Log(level int32, msg string) {
	h.logs = append(h.logs, fmt.Sprintf("%d %s", level, msg))
}
func (h *logHost) Follow(_ context.Context, r abi.FollowRequest) error {
	h.follows = append(h.follows, r)
	if h.refuse != "" {
		return &vm.RefusedError{Reason: h.refuse}
	}
	return nil
}
func (h *logHost) Unfollow(_ context.Context, r abi.FollowRequest) error {
	h.follows = append(h.follows, r)
	return nil
}

func TestRustHostileGuest(t *testing.T) {
	needRust(t)
	e := newEngine(t, 2*time.Second, 256)
	isTrap := func(err error) bool { var te *vm.TrapError; return errors.As(err, &te) }
	cases := []struct {
		method string
		check  func(error) bool
	}{
		{"panic", isTrap},
		{"explicit_panic", isTrap},
		{"oob", func(err error) bool {
			var te *vm.TrapError
			return errors.As(err, &te) && strings.Contains(te.Message, "outside guest memory")
		}},
		{"oob_len", isTrap},
		{"big_reply", isTrap},
		{"bomb", isTrap},
		{"loop", func(err error) bool { return errors.Is(err, vm.ErrBudget) }},
		{"recurse", isTrap},
	}
	for _, c := range cases {
		t.Run(c.method, func(t *testing.T) {
			inst := instance(t, e, "hostile-rust")
			h := &logHost{memHost: newMemHost()}
			start := time.Now()
			out, err := inst.Call(h, c.method, nil)
			if !c.check(err) {
				t.Fatalf("%s: unexpected result %q %T %v", c.method, out, err, err)
			}
			t.Logf("%s: %v", c.method, err)
			if !inst.Broken() {
				t.Fatalf("%s: a trap must break the instance", c.method)
			}
			if time.Since(start) > 4*time.Second {
				t.Fatalf("%s took %v", c.method, time.Since(start))
			}
			if c.method == "explicit_panic" {
				if len(h.logs) != 1 || !strings.HasPrefix(h.logs[0], "3 panic: ") || !strings.Contains(h.logs[0], "on purpose") {
					t.Fatalf("panic log: %q", h.logs)
				}
			}
			// The broken instance refuses further calls; a fresh one works.
			if _, err := inst.Call(h, "ok", nil); !isTrap(err) {
				t.Fatalf("broken instance answered: %v", err)
			}
			inst2 := instance(t, e, "hostile-rust")
			if out, err := inst2.Call(newMemHost(), "ok", nil); err != nil || string(out) != "ok" {
				t.Fatalf("fresh instance: %q %v", out, err)
			}
		})
	}
}

func TestRustSDKSurface(t *testing.T) {
	needRust(t)
	e := newEngine(t, 0, 0)
	inst := instance(t, e, "hostile-rust")
	want := abi.HandlerReceive | abi.HandlerEvent
	if inst.Module().Handlers != want {
		t.Fatalf("handlers %b, want %b", inst.Module().Handlers, want)
	}
	h := &logHost{memHost: newMemHost()}
	call := func(method, payload string) (string, error) {
		t.Helper()
		out, err := inst.Call(h, method, []byte(payload))
		if inst.Broken() {
			t.Fatalf("%s broke the instance: %v", method, err)
		}
		return string(out), err
	}
	if _, err := call("fail", ""); describeErr(err) != "guest: failed on purpose" {
		t.Fatalf("fail: %v", err)
	}
	if out, err := call("self", ""); err != nil || out != "test/1" {
		t.Fatalf("self: %q %v", out, err)
	}
	if out, err := call("random", ""); err != nil || out != "random" {
		t.Fatalf("random: %q %v", out, err)
	}
	if out, err := call("scan", ""); err != nil || out != "a/1=x;a/2=yy;deleted" {
		t.Fatalf("scan: %q %v", out, err)
	}
	if _, err := call("log", ""); err != nil || len(h.logs) != 1 || h.logs[0] != "1 hello from rust" {
		t.Fatalf("log: %v %q", err, h.logs)
	}
	if out, err := call("follow", "key"); err != nil || out != "followed" {
		t.Fatalf("follow: %q %v", out, err)
	}
	f := h.follows[0]
	if f.Publisher != "chat/room" || f.Topic != "messages" || f.Kind != abi.FollowerObject || string(f.Params) != "key" {
		t.Fatalf("follow request %+v", f)
	}
	h.refuse = "this room needs its key"
	if out, err := call("follow", "bad"); err != nil || out != "refused: this room needs its key" {
		t.Fatalf("refused follow: %q %v", out, err)
	}
	if out, err := call("unfollow", ""); err != nil || out != "unfollowed" || h.follows[2].Publisher != "chat/room" {
		t.Fatalf("unfollow: %q %v", out, err)
	}

	ev := &abi.Event{Publisher: "chat/room", Topic: "messages", Seq: 1 << 40, Time: -1234567890123, Payload: []byte("hi")}
	if err := inst.Receive(h, ev); err != nil {
		t.Fatalf("receive: %v", err)
	}
	if v := string(h.state["got/chat/room/messages/1099511627776"]); v != "hi" {
		t.Fatalf("receive stored %q", v)
	}
	if err := inst.Receive(h, &abi.Event{Publisher: "p/1", Topic: "t", Seq: 2, Payload: []byte("fail")}); describeErr(err) != "guest: receive failed on purpose" {
		t.Fatalf("failing receive: %v", err)
	}
	frame, err := inst.Event(h, ev)
	if err != nil || string(frame) != "chat/room:messages:1099511627776:-1234567890123:hi" {
		t.Fatalf("event: %q %v", frame, err)
	}
	if _, err := inst.Event(h, &abi.Event{Publisher: "p/1", Topic: "t", Seq: 3, Payload: []byte("skip")}); !errors.Is(err, vm.ErrSkip) {
		t.Fatalf("skip: %v", err)
	}
	if _, err := call("nope", ""); !errors.Is(err, vm.ErrMethodNotFound) {
		t.Fatalf("unknown method: %v", err)
	}
	// Events and follow requests with every field set round-trip through
	// the SDK's decoders (a malformed one would come back as a status).
	big := &abi.Event{Publisher: strings.Repeat("p", 300), Topic: strings.Repeat("t", 200), Seq: ^uint64(0), Time: -1 << 63, Payload: make([]byte, 70000)}
	if frame, err := inst.Event(h, big); err != nil || len(frame) != 300+200+len("18446744073709551615")+len("-9223372036854775808")+4+70000 {
		t.Fatalf("big event: %d %v", len(frame), err)
	}
}

// TestRustModuleCompiles checks the Rust modules import nothing but the host
// module and report the ABI version.
func TestRustModuleCompiles(t *testing.T) {
	needRust(t)
	e := newEngine(t, 0, 0)
	for _, name := range []string{"counter-rust", "chat-rust", "hostile-rust"} {
		b := vmtest.Wasm(t, name)
		m, err := e.Compile(context.Background(), b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %d bytes, exports %v, handlers %b", name, m.Size, m.Exports, m.Handlers)
	}
}
