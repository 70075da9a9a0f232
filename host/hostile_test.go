package host_test

// The hostile-input suite: guests that misbehave on purpose, malformed and
// oversized modules, bodies, frames and names, all through a real node's
// HTTP and WebSocket surface. Each test proves one defence: a clean JSON
// error with a fitting status, nothing committed, and the node (and a
// bystander object) still answering.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// hsAnswerBound is how long a well-behaved call may take while hostile
// calls run: generous, for -race on 2 shared cores.
const hsAnswerBound = 3 * time.Second

// hsLogCount counts the events in an object's log.
func hsLogCount(t testing.TB, dataDir, program, id string) int {
	t.Helper()
	return countRows(t, openObjectFile(t, dataDir, program, id), `SELECT COUNT(*) FROM log`)
}

// hsHealthy asserts the node answers /healthz.
func hsHealthy(t testing.TB, n *host.Node) {
	t.Helper()
	if r := do(t, n, http.MethodGet, "/healthz", nil); r.status != http.StatusOK {
		t.Fatalf("healthz: HTTP %d %s", r.status, r.body)
	}
}

// TestHostileGuestCallsFailCleanlyAndCommitNothing: unbounded recursion and
// publish storms (by bytes and by count), in the Go and the Rust guest, end
// as a JSON error with a fitting status; the call's state write and every
// event it published are rolled back; the object (on a fresh instance) and
// a bystander keep answering.
func TestHostileGuestCallsFailCleanlyAndCommitNothing(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, dir := hostileNode(t, 10*time.Second)
	upload(t, n, "hostile-rust", "hostile-rust")
	cases := []struct {
		name, program, method string
		payload               string
		status                int
		parts                 []string
	}{
		{"go recurse", "hostile", "recurse", "", http.StatusInternalServerError, []string{"trapped"}},
		{"rust recurse", "hostile-rust", "recurse", "", http.StatusInternalServerError, []string{"trapped"}},
		{"go storm of 1 MiB events", "hostile", "publish_storm", "", http.StatusRequestEntityTooLarge,
			[]string{"bytes published by one call", fmt.Sprint(host.MaxPublishBytesPerCall)}},
		{"rust storm of 1 MiB events", "hostile-rust", "publish_storm", "", http.StatusRequestEntityTooLarge,
			[]string{"bytes published by one call"}},
		{"go storm of tiny events", "hostile", "publish_storm", `{"size":1,"total":20000}`, http.StatusTooManyRequests,
			[]string{"events published by one call", fmt.Sprint(host.MaxPublishesPerCall)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := strings.ReplaceAll(c.name, " ", "-")
			obj := c.program + "/" + id
			start := time.Now()
			msg := wantError(t, call(t, n, obj, c.method, []byte(c.payload)), c.status, c.parts...)
			t.Logf("%s: HTTP %d after %v: %s", c.name, c.status, time.Since(start).Round(time.Millisecond), clipMsg(msg))
			wantReply(t, n, obj, "get", nil, "")
			if k := hsLogCount(t, dir, c.program, id); k != 0 {
				t.Fatalf("%d events committed by a failed call", k)
			}
			wantReply(t, n, obj, "ok", nil, "ok")
			wantReply(t, n, "hostile/bystander", "ok", nil, "ok")
		})
	}
	hsHealthy(t, n)
}

// TestHostileAllocLeakHitsPageLimitThenRecovers: a guest that keeps 1 MiB
// more on every call creeps up to the page limit across calls. The call
// that crosses it is a clean 500 that commits nothing (its state write and
// event are rolled back), every earlier call stays committed, and the next
// call runs on a fresh instance with its memory back.
func TestHostileAllocLeakHitsPageLimitThenRecovers(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, dir := hostileNode(t, 10*time.Second) // 512 pages: 32 MiB
	upload(t, n, "hostile-rust", "hostile-rust")
	for _, program := range []string{"hostile", "hostile-rust"} {
		t.Run(program, func(t *testing.T) {
			obj := program + "/leaky"
			var held struct {
				HeldMiB int `json:"held_mib"`
				Calls   int `json:"calls"`
			}
			ok := 0
			var failed response
			for i := 1; i <= 64; i++ {
				r := call(t, n, obj, "alloc", nil)
				if r.status != http.StatusOK {
					failed = r
					break
				}
				if err := json.Unmarshal(r.body, &held); err != nil || held.HeldMiB != i || held.Calls != i {
					t.Fatalf("alloc call %d: %s (%v), want %d MiB held after %d calls", i, r.body, err, i, i)
				}
				ok++
			}
			if failed.status == 0 {
				t.Fatalf("64 MiB leaked on a 32 MiB page limit without an error")
			}
			msg := wantError(t, failed, http.StatusInternalServerError, "trapped")
			t.Logf("%s: %d calls of 1 MiB held, then HTTP %d: %s", program, ok, failed.status, clipMsg(msg))
			if ok < 4 {
				t.Fatalf("only %d calls before the limit: the leak did not build up across calls", ok)
			}
			if k := hsLogCount(t, dir, program, "leaky"); k != ok {
				t.Fatalf("log has %d events, want %d (one per committed call, none from the failed one)", k, ok)
			}
			r := call(t, n, obj, "alloc", nil)
			if r.status != http.StatusOK || json.Unmarshal(r.body, &held) != nil || held.HeldMiB != 1 || held.Calls != ok+1 {
				t.Fatalf("alloc after the limit: HTTP %d %s, want 1 MiB held (a fresh instance) and call %d", r.status, r.body, ok+1)
			}
			wantReply(t, n, obj, "ok", nil, "ok")
			wantReply(t, n, "hostile/bystander", "ok", nil, "ok")
		})
	}
}

// TestHostileGuestGetsNoFilesystem: the node grants a guest no directory,
// no environment and no arguments through WASI: opening, listing and
// writing files all fail, and nothing appears on the host.
func TestHostileGuestGetsNoFilesystem(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	escape := filepath.Join(t.TempDir(), "escaped")
	before, _ := os.ReadFile("/tmp/x")
	r := call(t, n, "hostile/fs", "wasi_fs", []byte(escape))
	if r.status != http.StatusOK {
		t.Fatalf("wasi_fs: HTTP %d %s", r.status, r.body)
	}
	var report map[string]string
	if err := json.Unmarshal(r.body, &report); err != nil {
		t.Fatalf("wasi_fs report %s: %v", r.body, err)
	}
	probes := 0
	for what, got := range report {
		switch what {
		case "env", "args":
			if got != "" {
				t.Errorf("the guest was given %s %q, want none", what, got)
			}
			continue
		}
		probes++
		t.Logf("%s: %s", what, got)
		if !strings.HasPrefix(got, "error: ") {
			t.Errorf("%s: %s, want an error", what, got)
		}
	}
	if probes != 7 {
		t.Fatalf("report has %d probes, want 7: %v", probes, report)
	}
	if _, err := os.Stat(escape); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the guest wrote %s on the host: %v", escape, err)
	}
	if after, _ := os.ReadFile("/tmp/x"); !bytes.Equal(before, after) {
		t.Fatalf("/tmp/x changed while the guest ran: %q", after)
	}
	wantReply(t, n, "hostile/fs", "ok", nil, "ok")
}

// TestHostileGuestGetsNoNetwork: a Go guest built for wasip1 compiles net
// and syscall.Socket, but its net is an in-process fake and the node
// preopens no socket: a TCP dial to a listener the test holds is refused
// and never accepted, a UDP datagram to the test's socket never arrives,
// and a raw socket is refused. A guest listener, if the fake grants one,
// lives inside the guest. The module imports nothing but the host module
// and WASI, and no WASI socket function, so nothing else could be wired in.
func TestHostileGuestGetsNoNetwork(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	payload, _ := json.Marshal(map[string]string{"tcp": ln.Addr().String(), "udp": udp.LocalAddr().String()})
	r := call(t, n, "hostile/net", "wasi_net", payload)
	if r.status != http.StatusOK {
		t.Fatalf("wasi_net: HTTP %d %s", r.status, r.body)
	}
	var report map[string]string
	if err := json.Unmarshal(r.body, &report); err != nil {
		t.Fatalf("wasi_net report %s: %v", r.body, err)
	}
	if len(report) != 4 {
		t.Fatalf("report has %d probes, want 4: %v", len(report), report)
	}
	for what, got := range report {
		t.Logf("%s: %s", what, got)
	}
	for _, what := range []string{"dial tcp", "socket"} {
		if !strings.HasPrefix(report[what], "error: ") {
			t.Errorf("%s: %s, want an error", what, report[what])
		}
	}
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("the guest reached a TCP listener on the host")
	case <-time.After(100 * time.Millisecond):
	}
	udp.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if k, from, err := udp.ReadFrom(make([]byte, 64)); err == nil {
		t.Fatalf("the guest sent a %d-byte datagram to the host from %v", k, from)
	}
	imports, err := hsImportModules(vmtest.Wasm(t, "hostile"))
	if err != nil {
		t.Fatal(err)
	}
	for mod, names := range imports {
		if mod != abi.ImportModule && mod != "wasi_snapshot_preview1" {
			t.Errorf("the hostile module imports from %q", mod)
		}
		for _, name := range names {
			if strings.HasPrefix(name, "sock_") {
				t.Errorf("the hostile module imports %s.%s", mod, name)
			}
		}
	}
	t.Logf("imports: %v", imports)
	wantReply(t, n, "hostile/net", "ok", nil, "ok")
}

// hsImportModules reads a module's import section: import module → the
// names imported from it.
func hsImportModules(wasm []byte) (map[string][]string, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("not a module")
	}
	out := map[string][]string{}
	b := wasm[8:]
	for len(b) > 0 {
		id := b[0]
		size, k := hsULEB(b[1:])
		if k == 0 || uint64(len(b)-1-k) < size {
			return nil, errors.New("bad section")
		}
		body := b[1+k : 1+k+int(size)]
		b = b[1+k+int(size):]
		if id != 2 {
			continue
		}
		count, k := hsULEB(body)
		body = body[k:]
		str := func() string {
			l, k := hsULEB(body)
			s := string(body[k : k+int(l)])
			body = body[k+int(l):]
			return s
		}
		for range count {
			mod, name := str(), str()
			out[mod] = append(out[mod], name)
			kind := body[0]
			body = body[1:]
			switch kind {
			case 0: // func: a type index
				_, k := hsULEB(body)
				body = body[k:]
			case 1: // table: a reference type and limits
				body = hsSkipLimits(body[1:])
			case 2: // memory: limits
				body = hsSkipLimits(body)
			case 3: // global: a value type and mutability
				body = body[2:]
			default:
				return nil, fmt.Errorf("import kind %d", kind)
			}
		}
	}
	return out, nil
}

func hsSkipLimits(b []byte) []byte {
	flag := b[0]
	_, k := hsULEB(b[1:])
	b = b[1+k:]
	if flag&1 != 0 {
		_, k = hsULEB(b)
		b = b[k:]
	}
	return b
}

// hsULEB decodes an unsigned LEB128; k is 0 when b holds none.
func hsULEB(b []byte) (v uint64, k int) {
	for i, c := range b {
		if i == 10 {
			return 0, 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}

// Hand-assembled modules, for the shapes the SDKs never produce.

var (
	hsLEB     = vmtest.LEB
	hsCat     = vmtest.Cat
	hsSection = vmtest.Section
	hsVec     = vmtest.Vec
	hsName    = vmtest.Name
)

// hsImport is one import entry; desc is the kind byte and its descriptor.
func hsImport(module, name string, desc ...byte) []byte {
	return hsCat(hsName(module), hsName(name), desc)
}

// hsModule describes a module that passes the ABI checks (it exports
// host_abi_version, answering abi.Version, and call) plus a hostile part.
type hsModule struct {
	imports     [][]byte // import entries
	importFuncs int      // how many of them are functions
	table       []byte   // a table section body
	memory      []byte   // a memory section body
	start       []byte   // instructions of a start function (type 2)
}

// Types: 0 () -> i32, 1 (i32, i32) -> i32, 2 () -> ().
var hsTypes = hsSection(1, hsVec(
	[]byte{0x60, 0x00, 0x01, 0x7f},
	[]byte{0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f},
	[]byte{0x60, 0x00, 0x00},
))

func hsBody(instrs ...byte) []byte {
	b := append([]byte{0x00}, instrs...) // no locals
	return hsCat(hsLEB(uint64(len(b))), b)
}

func (m hsModule) bytes() []byte {
	out := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	out = append(out, hsTypes...)
	if len(m.imports) > 0 {
		out = append(out, hsSection(2, hsVec(m.imports...))...)
	}
	funcs := [][]byte{{0x00}, {0x01}}
	codes := [][]byte{hsBody(0x41, abi.Version, 0x0b), hsBody(0x41, 0x00, 0x0b)}
	if m.start != nil {
		funcs = append(funcs, []byte{0x02})
		codes = append(codes, hsBody(append(m.start, 0x0b)...))
	}
	out = append(out, hsSection(3, hsVec(funcs...))...)
	if m.table != nil {
		out = append(out, hsSection(4, m.table)...)
	}
	if m.memory != nil {
		out = append(out, hsSection(5, m.memory)...)
	}
	base := uint64(m.importFuncs)
	out = append(out, hsSection(7, hsVec(
		hsCat(hsName(abi.ExportVersion), []byte{0x00}, hsLEB(base)),
		hsCat(hsName(abi.ExportCall), []byte{0x00}, hsLEB(base+1)),
	))...)
	if m.start != nil {
		out = append(out, hsSection(8, hsLEB(base+2))...)
	}
	return append(out, hsSection(10, hsVec(codes...))...)
}

// TestMalformedModulesAreRefusedAtUpload: modules a compiler would never
// emit — every truncation of a valid one, a bad header, a bad section,
// imports the host does not provide (an unknown host function, an unknown
// module, a known function with the wrong signature, a memory or a global
// from elsewhere), a memory over the page limit, a start function that
// traps or never returns, and a body over the node's module size limit —
// are refused with 400 (413 for the size) and a message naming the
// problem; none is stored and the node keeps working.
func TestMalformedModulesAreRefusedAtUpload(t *testing.T) {
	t.Parallel()
	const maxModule = 256 << 10
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) {
		c.VM.MaxModuleSize = maxModule
		c.VM.Budget = time.Second
		c.VM.InitBudget = time.Second
		c.VM.MemoryLimitPages = 512
	}})
	dir := n.DataDir()
	valid := hsModule{}.bytes()
	// The assembler's baseline is a valid program: the rejections below are
	// about their hostile part.
	if r := do(t, n, http.MethodPut, "/v1/programs/baseline", valid); r.status != http.StatusCreated {
		t.Fatalf("baseline module: HTTP %d %s", r.status, r.body)
	}
	wantReply(t, n, "baseline/x", "anything", nil, "")

	for i := 1; i < len(valid); i++ {
		r := do(t, n, http.MethodPut, "/v1/programs/truncated", valid[:i])
		if r.status != http.StatusBadRequest {
			t.Fatalf("valid module cut at %d of %d bytes: HTTP %d %s, want 400", i, len(valid), r.status, r.body)
		}
		wantError(t, r, http.StatusBadRequest)
	}

	cases := []struct {
		name   string
		wasm   []byte
		status int
		parts  []string
	}{
		{"version 2 header", hsCat([]byte{0x00, 'a', 's', 'm', 0x02, 0x00, 0x00, 0x00}, valid[8:]), http.StatusBadRequest, []string{"invalid module"}},
		{"unknown section id", hsCat(valid, hsSection(0x55, []byte("junk"))), http.StatusBadRequest, []string{"invalid module"}},
		{"section size past the end", hsCat(valid, []byte{0x0b, 0xff, 0xff, 0x03}), http.StatusBadRequest, []string{"invalid module"}},
		{"unknown host function", hsModule{
			imports: [][]byte{hsImport(abi.ImportModule, "steal_secrets", 0x00, 0x00)}, importFuncs: 1,
		}.bytes(), http.StatusBadRequest, []string{"unknown host function", abi.ImportModule + ".steal_secrets"}},
		{"unknown import module", hsModule{
			imports: [][]byte{hsImport("env", "abort", 0x00, 0x02)}, importFuncs: 1,
		}.bytes(), http.StatusBadRequest, []string{"env.abort"}},
		{"host function with the wrong signature", hsModule{
			imports: [][]byte{hsImport(abi.ImportModule, abi.ImportStateGet, 0x00, 0x02)}, importFuncs: 1,
		}.bytes(), http.StatusBadRequest, []string{abi.ImportStateGet}},
		{"memory from an unknown module", hsModule{
			imports: [][]byte{hsImport("env", "memory", 0x02, 0x00, 0x01)},
		}.bytes(), http.StatusBadRequest, []string{"env"}},
		{"global from WASI", hsModule{
			imports: [][]byte{hsImport("wasi_snapshot_preview1", "secret", 0x03, 0x7f, 0x00)},
		}.bytes(), http.StatusBadRequest, []string{"secret"}},
		{"memory over the page limit", hsModule{memory: hsVec([]byte{0x00, 0x80, 0x80, 0x04})}.bytes(), // min 65536 pages
			http.StatusBadRequest, []string{"invalid module"}},
		{"start function traps", hsModule{start: []byte{0x00}}.bytes(), http.StatusBadRequest, []string{"invalid module"}},
		{"start function never returns", hsModule{start: []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}}.bytes(),
			http.StatusBadRequest, []string{"budget"}},
		{"over the module size limit", hsCat(valid, hsSection(0, hsName("pad"), make([]byte, maxModule))),
			http.StatusRequestEntityTooLarge, []string{"limit"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			msg := wantError(t, do(t, n, http.MethodPut, "/v1/programs/bad", c.wasm), c.status, c.parts...)
			t.Logf("%s (%d bytes): HTTP %d after %v: %s", c.name, len(c.wasm), c.status, time.Since(start).Round(time.Millisecond), clipMsg(msg))
		})
	}
	wantError(t, do(t, n, http.MethodGet, "/v1/programs/bad", nil), http.StatusNotFound)
	wantError(t, do(t, n, http.MethodGet, "/v1/programs/truncated", nil), http.StatusNotFound)
	stored, _ := filepath.Glob(filepath.Join(dir, "programs", "*.wasm"))
	if len(stored) != 1 {
		t.Fatalf("stored modules %v, want only the baseline", stored)
	}
	wantReply(t, n, "baseline/y", "anything", nil, "")
	hsHealthy(t, n)
}

// TestOversizedCallBodiesAre413: a call body over the node's MaxPayload is
// refused with 413 whether it announces its length or streams in chunks,
// the object sees nothing, and the same connection's next request works.
func TestOversizedCallBodiesAre413(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.MaxPayload = 64 << 10 }})
	upload(t, n, "counter", "counter")
	url := n.URL() + "/v1/objects/counter/big/add"
	body := append([]byte(`{"amount":1}`), bytes.Repeat([]byte(" "), 4<<20)...)
	for _, chunked := range []bool{false, true} {
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // hides the length: chunked encoding
		}
		req, err := http.NewRequest(http.MethodPost, url, rd)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("chunked=%v: %v", chunked, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantError(t, response{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, "limit")
		t.Logf("chunked=%v: HTTP %d %s", chunked, resp.StatusCode, bytes.TrimSpace(b))
	}
	wantReply(t, n, "counter/big", "get", nil, "0")
	wantReply(t, n, "counter/big", "add", []byte(`{"amount":2}`), "2")
}

// hsWS dials a WebSocket to the node, attached to object.
func hsWS(t *testing.T, n *host.Node, object string) *websocket.Conn {
	t.Helper()
	ws := dial(t, client(n), object)
	hsReadType(t, ws, "hello")
	return ws
}

// hsReadType reads one frame and requires its type; it returns the frame.
func hsReadType(t *testing.T, ws *websocket.Conn, typ string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatalf("waiting for a %q frame: %v", typ, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["type"] != typ {
		t.Fatalf("frame %s, want type %q", b, typ)
	}
	return m
}

// hsPing asserts the socket still answers: ping gets pong.
func hsPing(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	send(t, ws, map[string]string{"type": "ping"})
	hsReadType(t, ws, "pong")
}

// TestMalformedWebSocketRequestsGetErrorFrames: a follow request that is
// not JSON, has fields of the wrong type, an unknown type, a topic, filter,
// params or object out of bounds, or arrives as a binary frame, gets one
// error frame each; the socket stays usable and a valid follow afterwards
// works.
func TestMalformedWebSocketRequestsGetErrorFrames(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	wantReply(t, n, "hostile/pub", "ok", nil, "ok")
	ws := hsWS(t, n, "hostile/pub")
	frames := []struct {
		name  string
		frame string
		parts []string
	}{
		{"not JSON", "follow me", []string{"malformed"}},
		{"truncated JSON", `{"type":"follow","topic":"t"`, []string{"malformed"}},
		{"JSON array", `["follow","t"]`, []string{"malformed"}},
		{"JSON null", `null`, []string{"unknown request type"}},
		{"empty object", `{}`, []string{"unknown request type"}},
		{"type is a number", `{"type":5}`, []string{"malformed"}},
		{"topic is a number", `{"type":"follow","topic":7}`, []string{"malformed"}},
		{"object is an object", `{"type":"follow","object":{"a":1},"topic":"t"}`, []string{"malformed"}},
		{"unknown type", `{"type":"dance","topic":"t"}`, []string{"unknown request type", "dance"}},
		{"huge unknown type", `{"type":"` + strings.Repeat("d", 60<<10) + `"}`, []string{"unknown request type"}},
		{"topic too long", `{"type":"follow","topic":"` + strings.Repeat("t", abi.MaxTopicLen+1) + `"}`, []string{"topic longer"}},
		{"huge topic", `{"type":"follow","topic":"` + strings.Repeat("t", 60<<10) + `"}`, []string{"topic longer"}},
		{"bad filter", `{"type":"follow","topic":"t","filter":"no-equals-sign"}`, []string{"filter"}},
		{"filter too long", `{"type":"follow","topic":"t","filter":"a=` + strings.Repeat("x", 2000) + `"}`, []string{"filter"}},
		{"params too long", `{"type":"follow","topic":"t","params":"` + strings.Repeat("p", 5000) + `"}`, []string{"params"}},
		{"object traversal", `{"type":"follow","object":"../../etc/passwd","topic":"t"}`, []string{"bad request"}},
		{"object without id", `{"type":"follow","object":"hostile","topic":"t"}`, []string{"PROGRAM/ID"}},
		{"object NUL", `{"type":"follow","object":"hostile/a\u0000b","topic":"t"}`, []string{"bad request"}},
		{"unknown program", `{"type":"follow","object":"nope/x","topic":"t"}`, []string{"unknown program"}},
		{"unfollow bad filter", `{"type":"unfollow","topic":"t","filter":"="}`, []string{"filter"}},
	}
	for _, f := range frames {
		t.Run(f.name, func(t *testing.T) {
			if err := ws.Write(context.Background(), websocket.MessageText, []byte(f.frame)); err != nil {
				t.Fatal(err)
			}
			m := hsReadType(t, ws, "error")
			msg, _ := m["error"].(string)
			for _, p := range f.parts {
				if !strings.Contains(msg, p) {
					t.Fatalf("error %q does not mention %q", clipMsg(msg), p)
				}
			}
			if len(msg) > 1024 {
				t.Fatalf("error frame echoes %d bytes of the request", len(msg))
			}
			hsPing(t, ws)
		})
	}
	t.Run("binary frame", func(t *testing.T) {
		if err := ws.Write(context.Background(), websocket.MessageBinary, []byte(`{"type":"ping"}`)); err != nil {
			t.Fatal(err)
		}
		hsReadType(t, ws, "error")
		hsPing(t, ws)
	})
	t.Run("invalid UTF-8", func(t *testing.T) {
		// JSON decoding turns invalid UTF-8 into U+FFFD: whatever the
		// answer, it is an answer, and the socket lives.
		frame := []byte("{\"type\":\"follow\",\"topic\":\"t\xff\xfe\",\"object\":\"hostile/pub\"}")
		if err := ws.Write(context.Background(), websocket.MessageText, frame); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("invalid UTF-8 topic: %s", b)
		hsPing(t, ws)
	})
	send(t, ws, map[string]string{"type": "follow", "topic": "t"})
	hsReadType(t, ws, "followed")
	wantReply(t, n, "hostile/pub", "publish", []byte(`"after"`), "")
	// The hostile program's event export shapes the frame.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, b, err := ws.Read(ctx); err != nil || string(b) != `EVENT:"after"` {
		t.Fatalf("event after the malformed requests: %q %v", b, err)
	}
}

// TestOversizedWebSocketFrameClosesOnlyThatSocket: a client frame over the
// 64 KiB read limit closes that socket with 1009 (message too big); its
// edges are pruned, and another socket and the node keep working.
func TestOversizedWebSocketFrameClosesOnlyThatSocket(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	wantReply(t, n, "hostile/pub", "ok", nil, "ok")
	other := hsWS(t, n, "hostile/pub")
	big := hsWS(t, n, "hostile/pub")
	send(t, big, map[string]string{"type": "follow", "topic": "t"})
	hsReadType(t, big, "followed")
	c := client(n)
	if k := len(edges(t, c, "hostile/pub")); k != 1 {
		t.Fatalf("%d edges before, want 1", k)
	}
	frame := `{"type":"ping","pad":"` + strings.Repeat("x", 64<<10) + `"}`
	if err := big.Write(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		t.Logf("write of the oversized frame: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := big.Read(ctx)
	if err == nil {
		t.Fatalf("the socket answered an oversized frame: %s", b)
	}
	st := websocket.CloseStatus(err)
	if st != websocket.StatusMessageTooBig && st != websocket.StatusPolicyViolation {
		t.Fatalf("closed with %v (%v), want 1009 or 1008", st, err)
	}
	t.Logf("oversized frame: %v", err)
	eventually(t, 10*time.Second, "the closed socket's edge pruned", func() bool { return len(edges(t, c, "hostile/pub")) == 0 })
	hsPing(t, other)
	hsWS(t, n, "hostile/pub")
	hsHealthy(t, n)
}

// TestJunkNamesAre4xxAndTouchNothingOnDisk: traversal, NUL, invalid UTF-8,
// overlong encodings, control characters and 10 KB names, in the program,
// object id, method, program upload, connect, edges and edge positions,
// are answered 400 or 404 (a cleaned path may redirect first, to a 4xx),
// never 500; nothing is created outside the node's data directory, and
// inside it only the files of valid names.
func TestJunkNamesAre4xxAndTouchNothingOnDisk(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "data")
	n, _ := hosttest.Start(t, hosttest.Options{DataDir: dir})
	upload(t, n, "counter", "counter")
	wantReply(t, n, "counter/ok", "inc", nil, "1")
	counter := vmtest.Wasm(t, "counter")

	junk := []string{
		"..", "%2E%2E", ".", "%2e", "..%2Fx", "..%2F..%2Fetc", "..%2F..%2F..%2F..%2Ftmp%2Fx",
		"%2F", "a%2Fb", "%5C..%5Cx", "%00", "a%00b", "%ff", "a%ffb", "%c0%ae%c0%ae",
		"%e2%80%aeexe", "a%0d%0aX-Injected:%201", "a%20b", "~root", "-x", "_x", "%25",
		strings.Repeat("n", 10<<10),
	}
	type target struct{ method, path string }
	var targets []target
	for _, j := range junk {
		targets = append(targets,
			target{http.MethodPost, "/v1/objects/" + j + "/x/get"},
			target{http.MethodPost, "/v1/objects/counter/" + j + "/get"},
			target{http.MethodPost, "/v1/objects/counter/ok/" + j},
			target{http.MethodPut, "/v1/programs/" + j},
			target{http.MethodGet, "/v1/programs/" + j},
			target{http.MethodGet, "/v1/objects/" + j + "/x/connect"},
			target{http.MethodGet, "/v1/objects/counter/" + j + "/connect"},
			target{http.MethodGet, "/v1/objects/" + j + "/x/edges"},
			target{http.MethodGet, "/v1/objects/counter/" + j + "/edges"},
			target{http.MethodDelete, "/v1/objects/counter/ok/edges/" + j},
		)
	}
	seen := map[int]int{}
	for _, tg := range targets {
		var body []byte
		if tg.method == http.MethodPut {
			body = counter
		}
		req, err := http.NewRequest(tg.method, n.URL()+tg.path, bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s %s: %v", tg.method, clipMsg(tg.path), err)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tg.method, clipMsg(tg.path), err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen[resp.StatusCode]++
		switch resp.StatusCode {
		case http.StatusBadRequest, http.StatusNotFound:
		case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			// The router cleans "." and ".." segments before any handler
			// sees a name, and redirects to the cleaned path.
			loc := resp.Header.Get("Location")
			if strings.Contains("/"+loc+"/", "/../") || strings.Contains("/"+loc+"/", "/./") {
				t.Errorf("%s %s: redirected to %q, not a cleaned path", tg.method, clipMsg(tg.path), loc)
			}
		default:
			t.Errorf("%s %s: HTTP %d %s, want 400 or 404", tg.method, clipMsg(tg.path), resp.StatusCode, clipMsg(string(b)))
		}
		if strings.Contains(resp.Header.Get("X-Injected"), "1") {
			t.Errorf("%s %s: a header was injected", tg.method, clipMsg(tg.path))
		}
	}
	t.Logf("%d requests with junk names: statuses %v", len(targets), seen)

	// Only the data directory exists under root; under its objects and
	// programs only names a valid program or object could have made.
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel != "." && rel != "a" && rel != filepath.Join("a", "b") && !strings.HasPrefix(rel, filepath.Join("a", "b", "data")) {
			t.Errorf("created outside the data directory: %s", rel)
		}
		return nil
	})
	safe := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	for _, sub := range []string{"objects", "programs"} {
		filepath.Walk(filepath.Join(dir, sub), func(p string, info os.FileInfo, err error) error {
			if err == nil && p != filepath.Join(dir, sub) && !safe.MatchString(info.Name()) {
				t.Errorf("%s holds a file with an unsafe name: %q", sub, p)
			}
			return nil
		})
	}
	objs, _ := os.ReadDir(filepath.Join(dir, "objects"))
	for _, e := range objs {
		if e.Name() != "counter" {
			t.Errorf("object directory for program %q", e.Name())
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "objects", "counter", "*.db"))
	if len(files) != 1 || filepath.Base(files[0]) != "ok.db" {
		t.Errorf("object files %v, want only ok.db", files)
	}
	wantReply(t, n, "counter/ok", "inc", nil, "2")
	hsHealthy(t, n)
}

// TestWellBehavedObjectAnswersWhileHostileCallsRun: while hostile calls run
// on other objects of the node at the same time — a budget-length loop, a
// memory bomb, a leak up to the page limit, deep recursion, a publish
// storm, a trap and the sandbox probes — every call of a well-behaved
// object answers, in order, within hsAnswerBound.
func TestWellBehavedObjectAnswersWhileHostileCallsRun(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, _ := hostileNode(t, 2*time.Second)
	upload(t, n, "counter", "counter")
	wantReply(t, n, "counter/steady", "inc", nil, "1")
	wantReply(t, n, "hostile/warm", "ok", nil, "ok")

	stop := make(chan struct{})
	steadyDone := make(chan error, 1)
	var steadyCalls int
	var slowest time.Duration
	go func() {
		c := &hclient.Client{Base: n.URL()}
		for want := 2; ; want++ {
			select {
			case <-stop:
				steadyDone <- nil
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), hsAnswerBound)
			start := time.Now()
			out, err := c.Call(ctx, "counter/steady", "inc", nil)
			took := time.Since(start)
			cancel()
			if err != nil || string(out) != fmt.Sprint(want) {
				steadyDone <- fmt.Errorf("steady call %d after %v: %q %v", want, took, out, err)
				return
			}
			steadyCalls++
			slowest = max(slowest, took)
			time.Sleep(10 * time.Millisecond)
		}
	}()

	hostile := []struct{ object, method, payload string }{
		{"hostile/loop", "loop", ""},
		{"hostile/bomb", "bomb", ""},
		{"hostile/recurse", "recurse", ""},
		{"hostile/storm", "publish_storm", ""},
		{"hostile/trap", "trap", ""},
		{"hostile/fs", "wasi_fs", ""},
		{"hostile/net", "wasi_net", ""},
	}
	var wg sync.WaitGroup
	statuses := make([]int, len(hostile))
	for i, h := range hostile {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = call(t, n, h.object, h.method, []byte(h.payload)).status
		}()
	}
	wg.Add(1)
	leakStatus := 0
	go func() {
		defer wg.Done()
		for range 64 {
			if r := call(t, n, "hostile/leak", "alloc", nil); r.status != http.StatusOK {
				leakStatus = r.status
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	if err := <-steadyDone; err != nil {
		t.Fatal(err)
	}
	for i, h := range hostile {
		t.Logf("%s %s: HTTP %d", h.object, h.method, statuses[i])
		if statuses[i] >= 500 && statuses[i] != http.StatusInternalServerError && statuses[i] != http.StatusGatewayTimeout {
			t.Errorf("%s: HTTP %d", h.method, statuses[i])
		}
	}
	if leakStatus != http.StatusInternalServerError {
		t.Errorf("the leak ended with HTTP %d, want 500 at the page limit", leakStatus)
	}
	t.Logf("%d well-behaved calls answered during the hostile ones, the slowest in %v", steadyCalls, slowest.Round(time.Millisecond))
	if steadyCalls < 3 {
		t.Fatalf("only %d well-behaved calls ran during the hostile ones", steadyCalls)
	}
	hsHealthy(t, n)
}

// TestHeapReturnsToBaselineAfterHostileObjects: memory-hungry hostile
// calls (memory bombs, deep recursion and leaks up to the page limit) on
// several objects of both SDKs raise the heap; once those objects are idle
// and deactivated, the heap after GC is back within 64 MiB of where it
// started. Not parallel: the heap is the process's.
func TestHeapReturnsToBaselineAfterHostileObjects(t *testing.T) {
	hosttest.Heavy(t)
	const margin = 64 << 20
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) {
		c.VM.Budget = 10 * time.Second
		c.VM.MemoryLimitPages = 512 // 32 MiB per instance
		c.IdleTimeout = 200 * time.Millisecond
	}})
	upload(t, n, "hostile", "hostile")
	upload(t, n, "hostile-rust", "hostile-rust")
	wantReply(t, n, "hostile/warm", "ok", nil, "ok")
	wantReply(t, n, "hostile-rust/warm", "ok", nil, "ok")
	eventually(t, 10*time.Second, "the warm-up objects deactivated", func() bool { return n.ActiveObjects() == 0 })
	base := heapAfterGC()
	start := time.Now()

	var wg sync.WaitGroup
	var mu sync.Mutex
	var peak uint64
	var failures int
	sample := func(r response, mustFail bool) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		mu.Lock()
		peak = max(peak, ms.HeapInuse)
		if mustFail && r.status != http.StatusOK {
			failures++
		}
		mu.Unlock()
	}
	for i := range 2 {
		for _, program := range []string{"hostile", "hostile-rust"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				obj := fmt.Sprintf("%s/hungry%d", program, i)
				sample(call(t, n, obj, "bomb", nil), true)
				sample(call(t, n, obj, "recurse", nil), true)
				// The leak ends at the page limit, or earlier when the
				// idle reaper replaces the instance between two calls.
				for range 40 {
					r := call(t, n, obj, "alloc", nil)
					sample(r, false)
					if r.status != http.StatusOK {
						break
					}
				}
			}()
		}
	}
	wg.Wait()
	hungry := time.Since(start)
	if failures != 4*2 {
		t.Fatalf("%d bombs and recursions failed, want 8 (one of each on 4 objects)", failures)
	}
	eventually(t, 20*time.Second, "the hostile objects deactivated", func() bool { return n.ActiveObjects() == 0 })
	var after uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		after = heapAfterGC()
		if after <= base+margin || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("heap in use: %d MiB before, peak %d MiB during %v of hostile calls, %d MiB after the objects deactivated (bound: base + %d MiB)",
		base>>20, peak>>20, hungry.Round(time.Millisecond), after>>20, margin>>20)
	if after > base+margin {
		t.Fatalf("heap %d MiB after the hostile objects are gone, base %d MiB + %d MiB", after>>20, base>>20, margin>>20)
	}
	wantReply(t, n, "hostile/after", "ok", nil, "ok")
}

// TestDecoderBombModulesLeaveTheNodeUp: a module of a few bytes whose
// length prefixes claim billions of entries must be refused with 400 and
// leave the node running; a module whose table needs 1 GiB per instance,
// or grows an unbounded table with table.grow, must be refused too (the
// page limit bounds memories, nothing in wazero bounds tables). Each runs against a node in a child process, so a crash shows
// as this test failing instead of taking the suite down.
func TestDecoderBombModulesLeaveTheNodeUp(t *testing.T) {
	t.Parallel()
	hdr := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	max32 := []byte{0xff, 0xff, 0xff, 0xff, 0x0f}
	cases := []struct {
		name string
		wasm []byte
	}{
		// 15 bytes: an import section claiming 2^32-1 imports.
		{"import count", hsCat(hdr, hsSection(2, max32))},
		// A function whose body declares 2^32-1 locals.
		{"locals count", hsCat(hdr, hsTypes, hsSection(3, hsVec([]byte{0x02})),
			hsSection(10, hsVec(hsCat(hsLEB(8), []byte{0x01}, max32, []byte{0x7f, 0x0b}))))},
		// A valid program but for a table of 2^27 funcrefs: 1 GiB each
		// time it is instantiated.
		{"table size", hsModule{table: hsVec([]byte{0x70, 0x00, 0x80, 0x80, 0x80, 0x40})}.bytes()},
		// A one-entry table with no maximum that its start function grows
		// by 2^31-1 entries: 16 GiB at instantiation.
		{"table.grow", hsModule{table: hsVec([]byte{0x70, 0x00, 0x01}),
			start: []byte{0xd0, 0x70, 0x41, 0xff, 0xff, 0xff, 0xff, 0x07, 0xfc, 0x0f, 0x00, 0x1a}}.bytes()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url, died := hsChildNode(t)
			start := time.Now()
			req, _ := http.NewRequest(http.MethodPut, url+"/v1/programs/bomb", bytes.NewReader(c.wasm))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("upload of %d bytes: the node died after %v: %v\n%s", len(c.wasm), time.Since(start).Round(time.Millisecond), err, died())
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("%s (%d bytes): HTTP %d after %v: %s", c.name, len(c.wasm), resp.StatusCode, time.Since(start).Round(time.Millisecond), bytes.TrimSpace(b))
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("HTTP %d, want 400", resp.StatusCode)
			}
			if resp, err := http.Get(url + "/healthz"); err != nil {
				t.Fatalf("the node died after the upload: %v\n%s", err, died())
			} else {
				resp.Body.Close()
			}
		})
	}
}

// hsChildEnv makes the test binary run a node instead of the tests: its
// value is the data directory.
const hsChildEnv = "HOST_TEST_CHILD_NODE"

// TestMain runs a bare node when the test binary is started as a child by
// hsChildNode, and the tests otherwise.
func TestMain(m *testing.M) {
	if dir := os.Getenv(hsChildEnv); dir != "" {
		os.Exit(hsRunChildNode(dir))
	}
	os.Exit(m.Run())
}

// hsRunChildNode serves a node on dir, prints its URL, and stops when
// stdin closes.
func hsRunChildNode(dir string) int {
	cfg := hosttest.Config(dir, nil)
	n, err := host.New(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := n.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("URL", n.URL())
	io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n.Shutdown(ctx)
	return 0
}

// hsChildNode starts a node in a child process and returns its URL and a
// function that waits for the child to end and returns the tail of its
// output, for reporting a crash.
func hsChildNode(t *testing.T) (string, func() string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hsChildEnv+"="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr hsTail
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "URL "); ok {
				urls <- u
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	died := func() string {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Sprintf("child exited: %v; its output ends:\n%s", err, stderr.String())
		case <-time.After(5 * time.Second):
			return "child still running; its output ends:\n" + stderr.String()
		}
	}
	select {
	case u := <-urls:
		return u, died
	case <-time.After(60 * time.Second):
		t.Fatalf("child node did not start: %s", died())
	}
	return "", nil
}

// hsTail keeps the start of what a child writes, bounded: a Go crash
// begins with its reason and the stack that led to it.
type hsTail struct {
	mu  sync.Mutex
	buf []byte
}

func (w *hsTail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := 64<<10 - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// String is the crash's reason and the frames of this module and of
// wazero's decoder, the ones that say where it happened.
func (w *hsTail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(string(w.buf), "\n")
	var out []string
	goroutines := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "goroutine ") {
			if goroutines++; goroutines > 1 {
				break // only the goroutine that crashed
			}
		}
		switch {
		case i < 2, strings.HasPrefix(l, "fatal error"), strings.HasPrefix(l, "panic"):
			out = append(out, l)
		case i+1 < len(lines) && (strings.Contains(l, "wazero/internal/wasm/binary.") || strings.Contains(l, "durable-host/host/vm.")):
			out = append(out, l, lines[i+1])
		}
	}
	return strings.Join(out, "\n")
}
