package host_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

func client(n *host.Node) *hclient.Client { return &hclient.Client{Base: n.URL()} }

// upload uploads a built example under name through the client.
func upload(t testing.TB, n *host.Node, name, example string) hclient.Program {
	t.Helper()
	p, err := client(n).Upload(context.Background(), name, vmtest.Wasm(t, example))
	if err != nil {
		t.Fatalf("upload %s as %s: %v", example, name, err)
	}
	return p
}

// noRedirect is an HTTP client that reports redirects instead of following
// them, so a test sees what the node answered.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a raw request to the node; path is used as is (already escaped).
func do(t testing.TB, n *host.Node, method, path string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest(method, n.URL()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

// call POSTs a method call and returns the raw response.
func call(t testing.TB, n *host.Node, object, method string, payload []byte) response {
	t.Helper()
	return do(t, n, http.MethodPost, "/v1/objects/"+object+"/"+method, payload)
}

// wantReply asserts a 200 with body want.
func wantReply(t testing.TB, n *host.Node, object, method string, payload []byte, want string) {
	t.Helper()
	r := call(t, n, object, method, payload)
	if r.status != http.StatusOK || string(r.body) != want {
		t.Fatalf("%s %s: HTTP %d %q, want 200 %q", object, method, r.status, r.body, want)
	}
}

// wantError asserts status and a JSON {"error": "..."} body whose message
// contains every one of parts; it returns the message.
func wantError(t testing.TB, r response, status int, parts ...string) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("HTTP %d %q, want %d", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("error Content-Type %q, want application/json", ct)
	}
	var e map[string]any
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", r.body, err)
	}
	msg, _ := e["error"].(string)
	if msg == "" || len(e) != 1 {
		t.Fatalf(`error body %q, want exactly {"error": "..."}`, r.body)
	}
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Fatalf("error %q does not mention %q", msg, p)
		}
	}
	return msg
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openObjectFile opens an object's SQLite file read-only, beside the node.
func openObjectFile(t testing.TB, dataDir, program, id string) *sql.DB {
	t.Helper()
	path := filepath.Join(dataDir, "objects", program, id+".db")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("object file: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func countRows(t testing.TB, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var k int
	if err := db.QueryRow(q, args...).Scan(&k); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return k
}

// writeLocked reports whether some connection holds a write transaction on
// the object's file: a probe BEGIN IMMEDIATE with no busy timeout fails.
func writeLocked(t testing.TB, dataDir, program, id string) bool {
	t.Helper()
	path := filepath.Join(dataDir, "objects", program, id+".db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		if s := err.Error(); strings.Contains(s, "locked") || strings.Contains(s, "busy") {
			return true
		}
		t.Fatalf("probe: %v", err)
	}
	conn.ExecContext(context.Background(), "ROLLBACK")
	return false
}

// TestUploadFlowHTTP is the user flow of uploading and listing programs.
func TestUploadFlowHTTP(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	wasm := vmtest.Wasm(t, "counter")
	sum := sha256.Sum256(wasm)
	digest := hex.EncodeToString(sum[:])

	r := do(t, n, http.MethodPut, "/v1/programs/counter", wasm)
	if r.status != http.StatusCreated {
		t.Fatalf("first upload: HTTP %d %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("upload Content-Type %q", ct)
	}
	var p1 hclient.Program
	if err := json.Unmarshal(r.body, &p1); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	json.Unmarshal(r.body, &raw)
	for _, k := range []string{"name", "version", "digest", "exports"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("upload reply %s has no %q", r.body, k)
		}
	}
	if p1.Name != "counter" || p1.Version != 1 || p1.Digest != digest || p1.Size != len(wasm) {
		t.Fatalf("first upload: %+v (digest want %s)", p1, digest)
	}
	if !contains(p1.Exports, abi.ExportCall) || !contains(p1.Exports, abi.ExportVersion) {
		t.Fatalf("exports %v lack %s and %s", p1.Exports, abi.ExportCall, abi.ExportVersion)
	}

	// The same bytes again: not a new version.
	r = do(t, n, http.MethodPut, "/v1/programs/counter", wasm)
	var again hclient.Program
	if r.status != http.StatusOK || json.Unmarshal(r.body, &again) != nil || again.Version != 1 || again.Digest != digest {
		t.Fatalf("re-upload: HTTP %d %s, want 200 version 1", r.status, r.body)
	}

	// New bytes under the same name: version 2 (a small valid module, so
	// the test does not wait for a second compile of a Go module).
	wasm2 := vmtest.MinimalModule(abi.Version, true)
	r = do(t, n, http.MethodPut, "/v1/programs/counter", wasm2)
	var p2 hclient.Program
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &p2) != nil || p2.Version != 2 || p2.Digest == digest {
		t.Fatalf("new bytes: HTTP %d %s, want 201 version 2 with a new digest", r.status, r.body)
	}
	upload(t, n, "chat", "chat")

	var list struct {
		Programs []hclient.Program `json:"programs"`
	}
	r = do(t, n, http.MethodGet, "/v1/programs", nil)
	if r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil {
		t.Fatalf("list: HTTP %d %s", r.status, r.body)
	}
	if len(list.Programs) != 2 || list.Programs[0].Name != "chat" || list.Programs[1].Name != "counter" || list.Programs[1].Version != 2 {
		t.Fatalf("list = %+v, want chat v1 and counter v2 (latest of each)", list.Programs)
	}
	var one struct {
		Name     string            `json:"name"`
		Versions []hclient.Program `json:"versions"`
	}
	r = do(t, n, http.MethodGet, "/v1/programs/counter", nil)
	if r.status != http.StatusOK || json.Unmarshal(r.body, &one) != nil {
		t.Fatalf("get program: HTTP %d %s", r.status, r.body)
	}
	if one.Name != "counter" || len(one.Versions) != 2 || one.Versions[0].Version != 1 || one.Versions[1].Version != 2 ||
		one.Versions[0].Digest != digest || one.Versions[1].Digest != p2.Digest {
		t.Fatalf("versions of counter = %+v", one)
	}
	wantError(t, do(t, n, http.MethodGet, "/v1/programs/nope", nil), http.StatusNotFound, "nope")

	// The client sees the same.
	var viaClient struct {
		Programs []hclient.Program `json:"programs"`
	}
	if err := client(n).Get(context.Background(), "/v1/programs", &viaClient); err != nil || len(viaClient.Programs) != 2 {
		t.Fatalf("client list: %v %+v", err, viaClient)
	}
	if r := do(t, n, http.MethodGet, "/healthz", nil); r.status != http.StatusOK {
		t.Fatalf("healthz: HTTP %d", r.status)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestNewVersionOnNextActivation: an object activated after a re-upload runs
// the new version.
func TestNewVersionOnNextActivation(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	upload(t, n, "app", "counter")
	wantReply(t, n, "app/a", "inc", nil, "1")
	upload(t, n, "app", "hostile")
	wantReply(t, n, "app/b", "ok", nil, "ok")
}

// TestCounterFlowAndRestart: inc, add, get over HTTP, then the value
// survives a graceful shutdown and a new node on the same data directory.
func TestCounterFlowAndRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, _ := hosttest.Start(t, hosttest.Options{DataDir: dir})
	upload(t, n, "counter", "counter")
	for want := 1; want <= 3; want++ {
		r := call(t, n, "counter/c1", "inc", nil)
		if r.status != http.StatusOK || string(r.body) != strconv.Itoa(want) {
			t.Fatalf("inc #%d: HTTP %d %q", want, r.status, r.body)
		}
	}
	wantReply(t, n, "counter/c1", "add", []byte(`{"amount":5}`), "8")
	wantReply(t, n, "counter/c1", "get", nil, "8")
	wantReply(t, n, "counter/c2", "get", nil, "0")
	// A guest's own error is a clean 4xx, and changes nothing.
	wantError(t, call(t, n, "counter/c1", "add", []byte(`{}`)), http.StatusUnprocessableEntity, "amount")
	wantReply(t, n, "counter/c1", "get", nil, "8")
	// The client speaks the same API.
	out, err := client(n).Call(context.Background(), "counter/c1", "inc", nil)
	if err != nil || string(out) != "9" {
		t.Fatalf("client inc = %q, %v", out, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := n.Call(ctx, host.ObjectID{Program: "counter", ID: "c1"}, "get", nil); !errors.Is(err, host.ErrShuttingDown) {
		t.Fatalf("call after shutdown: %v, want ErrShuttingDown", err)
	}

	n2, _ := hosttest.Start(t, hosttest.Options{DataDir: dir})
	if n2.ID() == n.ID() {
		t.Fatalf("node id %s reused after restart", n.ID())
	}
	wantReply(t, n2, "counter/c1", "get", nil, "9")
	wantReply(t, n2, "counter/c1", "inc", nil, "10")
	var one struct {
		Versions []hclient.Program `json:"versions"`
	}
	if err := client(n2).Get(ctx, "/v1/programs/counter", &one); err != nil || len(one.Versions) != 1 {
		t.Fatalf("programs after restart: %v %+v", err, one)
	}
}

// TestConcurrentCallsOneObject: 100 concurrent inc calls to one object lose
// no update, and each sees a distinct value.
func TestConcurrentCallsOneObject(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	dir := n.DataDir()
	upload(t, n, "counter", "counter")
	const calls = 100
	replies := make([]string, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	c := client(n)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.Call(context.Background(), "counter/hot", "inc", nil)
			replies[i], errs[i] = string(out), err
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range calls {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if seen[replies[i]] {
			t.Fatalf("reply %s seen twice: two handlers ran on one value", replies[i])
		}
		seen[replies[i]] = true
	}
	for v := 1; v <= calls; v++ {
		if !seen[strconv.Itoa(v)] {
			t.Fatalf("no call saw %d; replies %v", v, replies)
		}
	}
	wantReply(t, n, "counter/hot", "get", nil, strconv.Itoa(calls))
	db := openObjectFile(t, dir, "counter", "hot")
	if k := countRows(t, db, `SELECT COUNT(*) FROM log WHERE topic = 'changes'`); k != calls {
		t.Fatalf("log has %d change events, want %d", k, calls)
	}
}

// TestCallsToDifferentObjectsRunInParallel proves overlap without timing:
// while one object's handler provably holds its transaction open (a probe
// cannot take the file's write lock), a call to another object completes,
// and the first is still running afterwards. A call to the busy object
// itself waits for it.
func TestCallsToDifferentObjectsRunInParallel(t *testing.T) {
	t.Parallel()
	const budget = 4 * time.Second
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.VM.Budget = budget }})
	dir := n.DataDir()
	upload(t, n, "hostile", "hostile")
	wantReply(t, n, "hostile/busy", "ok", nil, "ok") // creates the file
	wantReply(t, n, "hostile/free", "ok", nil, "ok")

	loopDone := make(chan response, 1)
	go func() { loopDone <- call(t, n, "hostile/busy", "loop", nil) }()
	eventually(t, budget/2, "the loop's transaction is open", func() bool {
		select {
		case r := <-loopDone:
			t.Fatalf("loop ended before it was seen running: HTTP %d %s", r.status, r.body)
		default:
		}
		return writeLocked(t, dir, "hostile", "busy")
	})
	sameDone := make(chan response, 1)
	go func() { sameDone <- call(t, n, "hostile/busy", "get", nil) }()

	wantReply(t, n, "hostile/free", "ok", nil, "ok")
	wantReply(t, n, "hostile/free", "get", nil, "")

	if !writeLocked(t, dir, "hostile", "busy") {
		t.Fatal("the looping handler finished before the other object's call: no proof of parallelism (is the budget too short for this machine?)")
	}
	select {
	case r := <-sameDone:
		t.Fatalf("a call to the busy object ran while its handler was running: HTTP %d %s", r.status, r.body)
	default:
	}
	wantError(t, <-loopDone, http.StatusGatewayTimeout, "budget")
	// The queued call ran after the loop was stopped, on a fresh instance,
	// and saw the loop's write rolled back.
	if r := <-sameDone; r.status != http.StatusOK || len(r.body) != 0 {
		t.Fatalf("queued get: HTTP %d %q, want 200 empty", r.status, r.body)
	}
}

// hostileNode is a node with the given budget and a small page limit, with
// the hostile example uploaded.
func hostileNode(t *testing.T, budget time.Duration) (*host.Node, string) {
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) {
		c.VM.Budget = budget
		c.VM.MemoryLimitPages = 512
	}})
	dir := n.DataDir()
	upload(t, n, "hostile", "hostile")
	return n, dir
}

// TestBudget: a guest that loops forever is stopped at the budget with a
// 504 and a clear error, its write is rolled back, and the next call works.
func TestBudget(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 500*time.Millisecond)
	wantReply(t, n, "hostile/l", "get", nil, "")
	start := time.Now()
	msg := wantError(t, call(t, n, "hostile/l", "loop", nil), http.StatusGatewayTimeout, "budget", "500ms", "rolled back")
	took := time.Since(start)
	t.Logf("loop stopped after %v: %s", took, msg)
	if took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("loop stopped after %v with a 500ms budget", took)
	}
	wantReply(t, n, "hostile/l", "get", nil, "")
	wantReply(t, n, "hostile/l", "ok", nil, "ok")
	// Again: the fresh instance is stoppable too.
	wantError(t, call(t, n, "hostile/l", "loop", nil), http.StatusGatewayTimeout, "budget")
	wantReply(t, n, "hostile/l", "get", nil, "")
}

// TestHostileGuests: each way a guest can misbehave gives a clean JSON error
// with a fitting status, rolls back its write, and leaves the object and the
// node working.
//
// The budget is long here so the memory bomb meets the page limit (512
// pages, 32 MiB) before the budget, even under the race detector.
func TestHostileGuests(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	cases := []struct {
		method string
		status int
		parts  []string
	}{
		{"bomb", http.StatusInternalServerError, []string{"trapped"}},
		{"trap", http.StatusInternalServerError, []string{"trapped"}},
		{"panic", http.StatusUnprocessableEntity, []string{"on purpose"}},
		{"oob", http.StatusInternalServerError, []string{"outside guest memory"}},
		{"oob_len", http.StatusInternalServerError, []string{"trapped"}},
		{"big_reply", http.StatusInternalServerError, []string{"trapped"}},
		{"publish_then_fail", http.StatusUnprocessableEntity, []string{"failed after publishing"}},
	}
	for _, c := range cases {
		t.Run(c.method, func(t *testing.T) {
			obj := "hostile/" + strings.ReplaceAll(c.method, "_", "-")
			start := time.Now()
			msg := wantError(t, call(t, n, obj, c.method, nil), c.status, c.parts...)
			t.Logf("%s: HTTP %d %s (%v)", c.method, c.status, msg, time.Since(start))
			wantReply(t, n, obj, "get", nil, "")
			wantReply(t, n, obj, "ok", nil, "ok")
			wantReply(t, n, "hostile/bystander", "ok", nil, "ok")
		})
	}
	if r := do(t, n, http.MethodGet, "/healthz", nil); r.status != http.StatusOK {
		t.Fatalf("healthz after hostile guests: HTTP %d", r.status)
	}
}

// TestMemoryBombErrorSaysOutOfMemory: the error a memory bomb gets must say
// that the guest ran out of memory (its page limit). The TrapError keeps only
// the last 4 KiB of the guest's output, so for a Go guest the reply is the
// tail of a goroutine dump and the "fatal error: out of memory" line at its
// head is cut off.
func TestMemoryBombErrorSaysOutOfMemory(t *testing.T) {
	t.Parallel()
	n, _ := hostileNode(t, 10*time.Second)
	r := call(t, n, "hostile/bomb", "bomb", nil)
	msg := wantError(t, r, http.StatusInternalServerError)
	if !strings.Contains(strings.ToLower(msg), "memory") {
		t.Fatalf("a memory bomb's error (%d bytes) does not mention memory; it begins %q", len(msg), clipMsg(msg))
	}
	wantReply(t, n, "hostile/bomb", "get", nil, "")
}

func clipMsg(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// TestPublishThenFailLeavesNothing: a method that writes state and publishes,
// then fails: neither the write nor the event is in the object's file.
//
// conformance: D01
func TestPublishThenFailLeavesNothing(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	dir := n.DataDir()
	upload(t, n, "hostile", "hostile")
	upload(t, n, "counter", "counter")
	wantError(t, call(t, n, "hostile/p", "publish_then_fail", nil), http.StatusUnprocessableEntity, "failed after publishing")
	wantReply(t, n, "hostile/p", "get", nil, "")

	// The reader is a separate connection on the file the node keeps open.
	db := openObjectFile(t, dir, "hostile", "p")
	if k := countRows(t, db, `SELECT COUNT(*) FROM log`); k != 0 {
		t.Fatalf("log has %d events after a failed method, want 0", k)
	}
	if k := countRows(t, db, `SELECT COUNT(*) FROM state WHERE key = ?`, []byte("touched")); k != 0 {
		t.Fatal("the failed method's state write is visible")
	}

	// The same reader does see what a committed method publishes.
	wantReply(t, n, "counter/p", "inc", nil, "1")
	cdb := openObjectFile(t, dir, "counter", "p")
	var topic string
	var payload []byte
	if err := cdb.QueryRow(`SELECT topic, payload FROM log ORDER BY seq`).Scan(&topic, &payload); err != nil {
		t.Fatalf("committed event: %v", err)
	}
	if topic != "changes" || string(payload) != `{"value":1}` {
		t.Fatalf("committed event %s %s", topic, payload)
	}
	if k := countRows(t, cdb, `SELECT COUNT(*) FROM state WHERE key = ?`, []byte("value")); k != 1 {
		t.Fatal("the committed state write is not visible")
	}
}

// TestUploadRejections: every bad module is refused with a 4xx JSON error
// and stores nothing.
func TestUploadRejections(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.VM.MaxModuleSize = 4 << 20 }})
	dir := n.DataDir()
	counter := vmtest.Wasm(t, "counter")
	if len(counter) >= 4<<20 {
		t.Fatalf("counter is %d bytes; the size limit case needs a bigger module", len(counter))
	}
	oversized := append(append([]byte(nil), counter...), bytes.Repeat([]byte{0}, 5<<20)...)
	cases := []struct {
		name   string
		body   []byte
		status int
		parts  []string
	}{
		{"not wasm", []byte("hello, this is not a module"), http.StatusBadRequest, []string{"not a WebAssembly module"}},
		{"empty", nil, http.StatusBadRequest, []string{"empty"}},
		{"truncated", counter[:len(counter)/2], http.StatusBadRequest, []string{"invalid module"}},
		{"over size limit", oversized, http.StatusRequestEntityTooLarge, []string{"limit"}},
		{"missing exports", vmtest.MinimalModule(abi.Version, false), http.StatusBadRequest, []string{"missing export", abi.ExportCall}},
		{"wrong ABI version", vmtest.MinimalModule(abi.Version+1, true), http.StatusBadRequest, []string{"ABI version"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := wantError(t, do(t, n, http.MethodPut, "/v1/programs/bad", c.body), c.status, c.parts...)
			t.Logf("%s: %s", c.name, msg)
		})
	}
	// A module of exactly valid shape is accepted: the rejections are about
	// the cases, not the harness.
	r := do(t, n, http.MethodPut, "/v1/programs/minimal", vmtest.MinimalModule(abi.Version, true))
	if r.status != http.StatusCreated {
		t.Fatalf("minimal valid module: HTTP %d %s", r.status, r.body)
	}
	wantError(t, do(t, n, http.MethodGet, "/v1/programs/bad", nil), http.StatusNotFound)
	var list struct {
		Programs []hclient.Program `json:"programs"`
	}
	if err := client(n).Get(context.Background(), "/v1/programs", &list); err != nil || len(list.Programs) != 1 {
		t.Fatalf("programs after rejections: %v %+v, want only minimal", err, list.Programs)
	}
	stored, _ := filepath.Glob(filepath.Join(dir, "programs", "*"))
	if len(stored) != 1 {
		t.Fatalf("stored program files %v, want one", stored)
	}
	// Through the client, the error and status come back typed.
	_, err := client(n).Upload(context.Background(), "bad", []byte("nope"))
	var ae *hclient.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("client upload of garbage: %v", err)
	}
}

// TestBadRequests: unknown program or method, bad names and oversized
// payloads get clear 4xx JSON errors.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.MaxPayload = 1024 }})
	dir := n.DataDir()
	upload(t, n, "counter", "counter")

	wantError(t, call(t, n, "nope/x", "inc", nil), http.StatusNotFound, "unknown program", "nope")
	wantError(t, call(t, n, "counter/x", "nope", nil), http.StatusNotFound, "no such method", "nope")
	wantError(t, call(t, n, "counter/x", strings.Repeat("m", abi.MaxMethodLen+1), nil), http.StatusNotFound)
	wantError(t, call(t, n, "counter/x", "%ff%fe", nil), http.StatusNotFound)

	bad := []struct{ name, path string }{
		{"program ../", "/v1/objects/..%2Fetc/x/get"},
		{"object ../", "/v1/objects/counter/..%2F..%2Fnode/get"},
		{"object ..", "/v1/objects/counter/%2E%2E/get"},
		{"object with slash", "/v1/objects/counter/a%2Fb/get"},
		{"program too long", "/v1/objects/" + strings.Repeat("p", 64) + "/x/get"},
		{"object too long", "/v1/objects/counter/" + strings.Repeat("o", 129) + "/get"},
		{"program invalid UTF-8", "/v1/objects/%ff%fe/x/get"},
		{"object invalid UTF-8", "/v1/objects/counter/a%ff/get"},
		{"object NUL", "/v1/objects/counter/a%00b/get"},
		{"upload ../", "/v1/programs/..%2Fx"},
		{"upload too long", "/v1/programs/" + strings.Repeat("p", 64)},
		{"upload invalid UTF-8", "/v1/programs/%ff"},
		{"upload uppercase", "/v1/programs/Counter"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			method := http.MethodPost
			var body []byte
			if strings.HasPrefix(c.path, "/v1/programs/") {
				method, body = http.MethodPut, vmtest.Wasm(t, "counter")
			}
			wantError(t, do(t, n, method, c.path, body), http.StatusBadRequest)
		})
	}
	// The longest valid names work.
	wantReply(t, n, "counter/"+strings.Repeat("o", 128), "get", nil, "0")

	// Nothing escaped the objects directory.
	var files []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(p, ".db") {
			files = append(files, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	for _, f := range files {
		if f != "/node.db" && !strings.HasPrefix(f, "/objects/counter/") {
			t.Errorf("unexpected database file %s", f)
		}
	}

	wantError(t, call(t, n, "counter/x", "add", bytes.Repeat([]byte(" "), 1025)), http.StatusRequestEntityTooLarge, "limit")
	wantReply(t, n, "counter/x", "add", append([]byte(`{"amount":2}`), bytes.Repeat([]byte(" "), 1012)...), "2")

	// In process, the same checks are sentinels.
	ctx := context.Background()
	if _, err := n.Call(ctx, host.ObjectID{Program: "counter", ID: "x"}, "add", make([]byte, 1025)); !errors.Is(err, host.ErrTooLarge) {
		t.Fatalf("oversized payload in process: %v", err)
	}
	if _, err := n.Call(ctx, host.ObjectID{Program: "counter", ID: "../x"}, "get", nil); !errors.Is(err, host.ErrBadRequest) {
		t.Fatalf("bad id in process: %v", err)
	}
	if _, err := n.Call(ctx, host.ObjectID{Program: "nope", ID: "x"}, "get", nil); !errors.Is(err, host.ErrUnknownProgram) {
		t.Fatalf("unknown program in process: %v", err)
	}
	if _, err := host.ParseObjectID("counter/../../etc"); !errors.Is(err, host.ErrBadRequest) {
		t.Fatalf("ParseObjectID of a traversal: %v", err)
	}
	if _, _, err := n.Upload(ctx, "../x", vmtest.Wasm(t, "counter")); !errors.Is(err, host.ErrBadRequest) {
		t.Fatalf("upload with a bad name in process: %v", err)
	}
	wantError(t, do(t, n, http.MethodGet, "/v1/nothing", nil), http.StatusNotFound)
}

// fdCount counts this process's open file descriptors.
func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestManyObjectsStayBounded activates many objects in turn on one node
// with a bound on active objects and checks, all along, that bound, open
// file descriptors (3 per active object in WAL mode, plus slack), and the
// heap after GC (~4 MiB per instance plus slack, and no growth once the
// active set is full). The suite runs 80 objects over a bound of 16 (five
// turns of the active set: an activation costs ~120 ms under the race
// detector on 2 shared cores); HOST_TEST_OBJECTS=10000 runs that many over
// a bound of 64 (bench/README.md).
func TestManyObjectsStayBounded(t *testing.T) {
	maxActive, objects := 16, 80
	if s := os.Getenv("HOST_TEST_OBJECTS"); s != "" {
		maxActive = 64
		objects, _ = strconv.Atoi(s)
	}
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.MaxActiveObjects = maxActive }})
	upload(t, n, "counter", "counter")
	ctx := context.Background()
	baseFDs := fdCount(t)
	baseHeap := heapAfterGC()
	const (
		fdSlack  = 32
		heapGrow = 64 << 20 // growth allowed after the set is full
	)
	heapBound := uint64(maxActive)*8<<20 + 128<<20 // 8 MiB per active object + 128 MiB
	fdBound := baseFDs + 3*maxActive + fdSlack
	var maxFDs, maxObjs int
	var fullHeap, maxHeap uint64
	start := time.Now()
	for i := range objects {
		id := host.ObjectID{Program: "counter", ID: fmt.Sprintf("o%05d", i)}
		out, err := n.Call(ctx, id, "inc", nil)
		if err != nil || string(out) != "1" {
			t.Fatalf("object %d: %q %v", i, out, err)
		}
		if k := n.ActiveObjects(); k > maxActive {
			t.Fatalf("after object %d: %d active, bound %d", i, k, maxActive)
		} else {
			maxObjs = max(maxObjs, k)
		}
		if i%50 == 0 || i == objects-1 {
			fds := fdCount(t)
			maxFDs = max(maxFDs, fds)
			if fds > fdBound {
				t.Fatalf("after object %d: %d open fds, bound %d (base %d)", i, fds, fdBound, baseFDs)
			}
		}
		if i == 2*maxActive || i%1000 == 999 || i == objects-1 {
			h := heapAfterGC()
			maxHeap = max(maxHeap, h)
			if i == 2*maxActive {
				fullHeap = h
			}
			if h > baseHeap+heapBound {
				t.Fatalf("after object %d: heap %d MiB, bound %d MiB over the base %d MiB", i, h>>20, heapBound>>20, baseHeap>>20)
			}
			if fullHeap > 0 && h > fullHeap+heapGrow {
				t.Fatalf("after object %d: heap %d MiB grew past %d MiB at a full active set + %d MiB", i, h>>20, fullHeap>>20, heapGrow>>20)
			}
		}
	}
	took := time.Since(start)
	t.Logf("%d objects in %v (%v each): at most %d active, %d fds (base %d, bound %d), heap at most %d MiB (base %d MiB, full set %d MiB)",
		objects, took.Round(time.Millisecond), (took / time.Duration(objects)).Round(time.Microsecond),
		maxObjs, maxFDs, baseFDs, fdBound, maxHeap>>20, baseHeap>>20, fullHeap>>20)
	if maxObjs != maxActive {
		t.Fatalf("the active set peaked at %d, want %d: the bound was not exercised", maxObjs, maxActive)
	}
	// An evicted object comes back with its state.
	out, err := n.Call(ctx, host.ObjectID{Program: "counter", ID: "o00000"}, "inc", nil)
	if err != nil || string(out) != "2" {
		t.Fatalf("first object again: %q %v", out, err)
	}
}

// TestIdleDeactivation: objects unused past the idle timeout are
// deactivated, and come back with their state on the next call.
func TestIdleDeactivation(t *testing.T) {
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.IdleTimeout = 100 * time.Millisecond }})
	upload(t, n, "counter", "counter")
	for i := range 5 {
		wantReply(t, n, fmt.Sprintf("counter/idle%d", i), "inc", nil, "1")
	}
	eventually(t, 10*time.Second, "every object deactivated", func() bool { return n.ActiveObjects() == 0 })
	wantReply(t, n, "counter/idle0", "inc", nil, "2")
	eventually(t, 10*time.Second, "deactivated again", func() bool { return n.ActiveObjects() == 0 })
}

// TestDeactivationClosesObjectFiles: a deactivated object's SQLite file is
// closed: the database, -wal and -shm descriptors are released.
func TestDeactivationClosesObjectFiles(t *testing.T) {
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.IdleTimeout = 100 * time.Millisecond }})
	dir := n.DataDir()
	upload(t, n, "counter", "counter")
	const objects = 5
	for i := range objects {
		wantReply(t, n, fmt.Sprintf("counter/fd%d", i), "inc", nil, "1")
	}
	eventually(t, 10*time.Second, "every object deactivated", func() bool { return n.ActiveObjects() == 0 })
	objDir := filepath.Join(dir, "objects", "counter")
	open := func() []string {
		var out []string
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, objDir) {
				out = append(out, strings.TrimPrefix(l, objDir+"/"))
			}
		}
		return out
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(open()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if still := open(); len(still) > 0 {
		t.Fatalf("%d descriptors of deactivated objects' files are still open: %v", len(still), still)
	}
}

// TestShutdownLeavesNoGoroutines: a node that served calls stops every
// goroutine it started.
func TestShutdownLeavesNoGoroutines(t *testing.T) {
	wasm := vmtest.Wasm(t, "counter") // build outside the measurement
	http.DefaultClient.CloseIdleConnections()
	noRedirect.CloseIdleConnections()
	before := runtime.NumGoroutine()
	n, _ := hosttest.Start(t, hosttest.Options{})
	c := &hclient.Client{Base: n.URL(), HTTP: &http.Client{Transport: &http.Transport{}}}
	if _, err := c.Upload(context.Background(), "counter", wasm); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.Call(context.Background(), fmt.Sprintf("counter/g%d", i), "inc", nil); err != nil {
			t.Fatal(err)
		}
	}
	c.HTTP.CloseIdleConnections()
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var now int
	deadline := time.Now().Add(10 * time.Second)
	for {
		now = runtime.NumGoroutine()
		if now <= before || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if now > before {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%d goroutines before the node, %d after shutdown:\n%s", before, now, buf)
	}
}
