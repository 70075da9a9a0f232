package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// authNode starts a node with tenancy on and returns it with the operator
// token from DATA/admin.token.
func authNode(t *testing.T, mod func(*host.Config)) (*host.Node, string) {
	t.Helper()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) {
		c.Auth = true
		if mod != nil {
			mod(c)
		}
	}})
	dir := n.DataDir()
	b, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return n, strings.TrimSpace(string(b))
}

// as sends a request with a bearer token (none when tok is "").
func as(t testing.TB, n *host.Node, tok, method, path string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest(method, n.URL()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// mkTenant creates a tenant with limits (JSON, "" for the defaults) and
// returns its token.
func mkTenant(t testing.TB, n *host.Node, op, name, limits string) string {
	t.Helper()
	body := `{"name":"` + name + `"}`
	if limits != "" {
		body = `{"name":"` + name + `","limits":` + limits + `}`
	}
	r := as(t, n, op, http.MethodPost, "/v1/tenants", []byte(body))
	if r.status != http.StatusCreated {
		t.Fatalf("create tenant %s: HTTP %d %s", name, r.status, r.body)
	}
	var v struct{ Token string }
	json.Unmarshal(r.body, &v)
	return v.Token
}

func tenantUpload(t testing.TB, n *host.Node, tok, name, example string) response {
	t.Helper()
	return as(t, n, tok, http.MethodPut, "/v1/programs/"+name, vmtest.Wasm(t, example))
}

func wantStatus(t testing.TB, r response, status int, what string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: HTTP %d %s, want %d", what, r.status, r.body, status)
	}
}

// tenantDial opens a WebSocket attached to attach with tok as
// ?access_token= (what a browser does).
func tenantDial(t *testing.T, n *host.Node, tok, attach string) (*websocket.Conn, *http.Response, error) {
	id, _ := host.ParseObjectID(attach)
	u := "ws" + strings.TrimPrefix(n.URL(), "http") + "/v1/objects/" + id.Program + "/" + id.ID + "/connect?access_token=" + tok
	ws, resp, err := websocket.Dial(context.Background(), u, nil)
	if err == nil {
		t.Cleanup(func() { ws.CloseNow() })
	}
	return ws, resp, err
}

// TestTenancyTokens: with --auth the first start writes the operator token
// (0600); requests without a token or with a wrong one get 401; only the
// operator manages tenants; a rotated token stops working and the new one
// works; a revoked tenant is locked out but keeps its data.
func TestTenancyTokens(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	info, err := os.Stat(filepath.Join(n.DataDir(), "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("admin.token mode %v, want 0600", info.Mode().Perm())
	}
	r := as(t, n, "", http.MethodGet, "/v1/programs", nil)
	wantError(t, r, http.StatusUnauthorized, "token")
	if r.header.Get("WWW-Authenticate") == "" {
		t.Fatal("401 without WWW-Authenticate")
	}
	wantError(t, as(t, n, "ht_acme_"+strings.Repeat("0", 64), http.MethodGet, "/v1/programs", nil), http.StatusUnauthorized, "not valid")
	wantError(t, as(t, n, "garbage", http.MethodGet, "/v1/programs", nil), http.StatusUnauthorized)
	if r := as(t, n, "", http.MethodGet, "/healthz", nil); r.status != http.StatusOK {
		t.Fatalf("healthz needs no token: HTTP %d", r.status)
	}

	acme := mkTenant(t, n, op, "acme", "")
	wantError(t, as(t, n, op, http.MethodPost, "/v1/tenants", []byte(`{"name":"acme"}`)), http.StatusConflict, "acme")
	wantError(t, as(t, n, op, http.MethodPost, "/v1/tenants", []byte(`{"name":"../x"}`)), http.StatusBadRequest, "tenant name")
	wantStatus(t, tenantUpload(t, n, acme, "counter", "counter-rust"), http.StatusCreated, "acme uploads")
	wantStatus(t, as(t, n, acme, http.MethodPost, "/v1/objects/counter/c1/inc", nil), http.StatusOK, "acme calls")
	// A tenant cannot manage tenants nor read the node's metrics.
	wantError(t, as(t, n, acme, http.MethodPost, "/v1/tenants", []byte(`{"name":"evil"}`)), http.StatusForbidden, "operator")
	wantError(t, as(t, n, acme, http.MethodGet, "/v1/tenants", nil), http.StatusForbidden)
	wantError(t, as(t, n, acme, http.MethodGet, "/metrics", nil), http.StatusForbidden)
	r = as(t, n, op, http.MethodGet, "/v1/tenants", nil)
	wantStatus(t, r, http.StatusOK, "operator lists tenants")
	if !bytes.Contains(r.body, []byte(`"acme"`)) || bytes.Contains(r.body, []byte("token_hash")) {
		t.Fatalf("tenant list %s: want acme, and no token hashes", r.body)
	}

	// Rotate: the old token is refused, the new one works.
	r = as(t, n, op, http.MethodPost, "/v1/tenants/acme/rotate", nil)
	wantStatus(t, r, http.StatusOK, "rotate")
	var rot struct{ Token string }
	json.Unmarshal(r.body, &rot)
	wantError(t, as(t, n, acme, http.MethodPost, "/v1/objects/counter/c1/get", nil), http.StatusUnauthorized)
	if r := as(t, n, rot.Token, http.MethodPost, "/v1/objects/counter/c1/get", nil); r.status != http.StatusOK || string(r.body) != "1" {
		t.Fatalf("new token: HTTP %d %s, want 200 1", r.status, r.body)
	}
	// Revoke: locked out; a new rotation lets it back to the same data.
	wantStatus(t, as(t, n, op, http.MethodPost, "/v1/tenants/acme/revoke", nil), http.StatusOK, "revoke")
	wantError(t, as(t, n, rot.Token, http.MethodPost, "/v1/objects/counter/c1/get", nil), http.StatusUnauthorized)
	r = as(t, n, op, http.MethodPost, "/v1/tenants/acme/rotate", nil)
	json.Unmarshal(r.body, &rot)
	if r := as(t, n, rot.Token, http.MethodPost, "/v1/objects/counter/c1/get", nil); r.status != http.StatusOK || string(r.body) != "1" {
		t.Fatalf("after revoke and rotate: HTTP %d %s, want 200 1 (data kept)", r.status, r.body)
	}
	wantError(t, as(t, n, op, http.MethodPost, "/v1/tenants/nobody/rotate", nil), http.StatusNotFound)
}

// TestNoAuthNeedsNoToken: without --auth (host dev) nothing asks for a
// token and the tenant routes say tenancy is off.
func TestNoAuthNeedsNoToken(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	upload(t, n, "counter", "counter-rust")
	wantReply(t, n, "counter/c", "inc", nil, "1")
	wantError(t, do(t, n, http.MethodPost, "/v1/tenants", []byte(`{"name":"acme"}`)), http.StatusNotFound, "--auth")
	var who map[string]any
	if err := client(n).Get(context.Background(), "/v1/whoami", &who); err != nil || who["auth"] != false {
		t.Fatalf("whoami without auth: %v %v", who, err)
	}
}

// TestTenantIsolationMatrix: tenant B's token against every route and the
// WebSocket surface for tenant A's programs, objects and edges: each is
// denied with a 404 (or a refused follow) that does not name tenant A, and
// A's state is unchanged afterwards. Streams have their own test,
// TestStreamsAreTenantScoped.
func TestTenantIsolationMatrix(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	a := mkTenant(t, n, op, "acme", "")
	b := mkTenant(t, n, op, "bob", "")
	wantStatus(t, tenantUpload(t, n, a, "counter", "counter-rust"), http.StatusCreated, "a uploads counter")
	wantStatus(t, tenantUpload(t, n, a, "chat", "chat-rust"), http.StatusCreated, "a uploads chat")
	wantStatus(t, tenantUpload(t, n, b, "mine", "counter-rust"), http.StatusCreated, "b uploads its own")
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/counter/c1/inc", nil), http.StatusOK, "a inc")
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/room/post", []byte(`{"author":"a","text":"secret"}`)), http.StatusOK, "a post")
	// A's chat room has an edge: a follower of A's own.
	wsA, _, err := tenantDial(t, n, a, "chat/room")
	if err != nil {
		t.Fatal(err)
	}
	send(t, wsA, map[string]string{"type": "follow", "topic": "messages"})
	followed := readUntil(t, wsA, "followed")
	edge := fmt.Sprint(followed["edge"])

	denied := []struct {
		name, method, path string
		body               []byte
	}{
		{"call plain name (B's namespace has no such program)", "POST", "/v1/objects/counter/c1/inc", nil},
		{"call qualified name", "POST", "/v1/objects/acme.counter/c1/inc", nil},
		{"get qualified", "POST", "/v1/objects/acme.counter/c1/get", nil},
		{"read chat history", "POST", "/v1/objects/acme.chat/room/history", nil},
		{"program versions", "GET", "/v1/programs/acme.counter", nil},
		{"program versions plain", "GET", "/v1/programs/counter", nil},
		{"upload over", "PUT", "/v1/programs/acme.counter", vmtest.Wasm(t, "counter-rust")},
		{"list edges", "GET", "/v1/objects/acme.chat/room/edges", nil},
		{"delete edge", "DELETE", "/v1/objects/acme.chat/room/edges/" + edge, nil},
		{"list objects of A's program", "GET", "/v1/objects?program=acme.chat", nil},
		{"list objects plain name", "GET", "/v1/objects?program=chat", nil},
		{"read state", "GET", "/v1/objects/acme.chat/room/state", nil},
		{"read state plain", "GET", "/v1/objects/chat/room/state", nil},
		{"read log", "GET", "/v1/objects/acme.chat/room/log", nil},
		{"read log plain", "GET", "/v1/objects/chat/room/log", nil},
	}
	for _, d := range denied {
		r := as(t, n, b, d.method, d.path, d.body)
		if r.status != http.StatusNotFound && r.status != http.StatusForbidden {
			t.Errorf("%s: B got HTTP %d %s, want 404 or 403", d.name, r.status, r.body)
		}
		if bytes.Contains(r.body, []byte("acme.")) && !strings.Contains(d.path, "acme.") {
			t.Errorf("%s: the error names tenant A: %s", d.name, r.body)
		}
	}
	// B's program list has only its own.
	r := as(t, n, b, http.MethodGet, "/v1/programs", nil)
	if !bytes.Contains(r.body, []byte(`"mine"`)) || bytes.Contains(r.body, []byte("counter")) || bytes.Contains(r.body, []byte("chat")) {
		t.Fatalf("B's program list: %s", r.body)
	}
	// B's object list has only its own: none yet, then the one it used.
	r = as(t, n, b, http.MethodGet, "/v1/objects", nil)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"objects":[]`)) {
		t.Fatalf("B's object list: HTTP %d %s", r.status, r.body)
	}
	wantStatus(t, as(t, n, b, http.MethodPost, "/v1/objects/mine/m1/inc", nil), http.StatusOK, "b inc")
	r = as(t, n, b, http.MethodGet, "/v1/objects", nil)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"object":"mine/m1"`)) || bytes.Count(r.body, []byte(`"object":`)) != 1 {
		t.Fatalf("B's object list: HTTP %d %s", r.status, r.body)
	}
	// A sees its own, named as it names them; the operator sees both.
	r = as(t, n, a, http.MethodGet, "/v1/objects", nil)
	if !bytes.Contains(r.body, []byte(`"object":"chat/room"`)) || !bytes.Contains(r.body, []byte(`"object":"counter/c1"`)) || bytes.Contains(r.body, []byte("mine")) {
		t.Fatalf("A's object list: HTTP %d %s", r.status, r.body)
	}
	r = as(t, n, op, http.MethodGet, "/v1/objects", nil)
	if !bytes.Contains(r.body, []byte(`"object":"acme.chat/room"`)) || !bytes.Contains(r.body, []byte(`"object":"bob.mine/m1"`)) {
		t.Fatalf("the operator's object list: HTTP %d %s", r.status, r.body)
	}
	r = as(t, n, a, http.MethodGet, "/v1/objects/chat/room/state", nil)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte("secret")) || !bytes.Contains(r.body, []byte(`"object":"chat/room"`)) {
		t.Fatalf("A reads its room's state: HTTP %d %s", r.status, r.body)
	}
	// WebSocket: B cannot attach to A's object.
	if _, resp, err := tenantDial(t, n, b, "acme.chat/room"); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("B attaches to A's chat: %v %v, want 404", err, resp)
	}
	if _, resp, err := tenantDial(t, n, "", "mine/x"); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("connect without a token: %v %v, want 401", err, resp)
	}
	wsB, _, err := tenantDial(t, n, b, "mine/x")
	if err != nil {
		t.Fatal(err)
	}
	// A program without a follow hook keeps its events to its tenant.
	send(t, wsB, map[string]string{"type": "follow", "object": "acme.counter/c1", "topic": "t"})
	e := readUntil(t, wsB, "error")
	if !strings.Contains(fmt.Sprint(e["error"]), "own tenant") {
		t.Fatalf("B follows A's hook-less counter: %v", e)
	}
	// Chat's hook refuses tenants the room is not shared with...
	send(t, wsB, map[string]string{"type": "follow", "object": "acme.chat/room", "topic": "messages"})
	e = readUntil(t, wsB, "error")
	if !strings.Contains(fmt.Sprint(e["error"]), "not shared with tenant bob") {
		t.Fatalf("B follows A's unshared room: %v", e)
	}
	// ... and admits one it is shared with: the hook saw B's tenant.
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/room/share", []byte(`{"tenant":"bob"}`)), http.StatusOK, "share")
	send(t, wsB, map[string]string{"type": "follow", "object": "acme.chat/room", "topic": "messages"})
	readUntil(t, wsB, "followed")
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/room/post", []byte(`{"author":"a","text":"for bob"}`)), http.StatusOK, "a posts")
	ev := readUntil(t, wsB, "event")
	if !strings.Contains(fmt.Sprint(ev["payload"]), "for bob") {
		t.Fatalf("B's event: %v", ev)
	}
	// Following is all B got: calls on the shared room are still denied.
	wantStatus(t, as(t, n, b, http.MethodPost, "/v1/objects/acme.chat/room/post", []byte(`{"author":"b","text":"x"}`)), http.StatusNotFound, "B posts in A's room")
	// A is untouched.
	if r := as(t, n, a, http.MethodPost, "/v1/objects/counter/c1/get", nil); string(r.body) != "1" {
		t.Fatalf("A's counter after B's attempts: %s", r.body)
	}
	r = as(t, n, a, http.MethodGet, "/v1/programs/counter", nil)
	if r.status != http.StatusOK || bytes.Count(r.body, []byte(`"version"`)) != 1 {
		t.Fatalf("A's counter versions after B's upload attempt: %s", r.body)
	}
	r = as(t, n, a, http.MethodGet, "/v1/objects/chat/room/edges", nil)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"id":`+edge)) {
		t.Fatalf("A's edges after B's delete attempt: HTTP %d %s", r.status, r.body)
	}
}

// TestCrossTenantObjectFollower: an object of tenant B follows tenant A's
// room durably once A shares it; the hook saw B's tenant.
func TestCrossTenantObjectFollower(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	a := mkTenant(t, n, op, "acme", "")
	b := mkTenant(t, n, op, "bob", "")
	wantStatus(t, tenantUpload(t, n, a, "chat", "chat-rust"), http.StatusCreated, "a uploads chat")
	wantStatus(t, tenantUpload(t, n, b, "tally", "tally-rust"), http.StatusCreated, "b uploads tally")
	follow := []byte(`{"publisher":"acme.chat/room","topic":"messages"}`)
	r := as(t, n, b, http.MethodPost, "/v1/objects/tally/t/follow", follow)
	if r.status < 400 || !bytes.Contains(r.body, []byte("not shared")) {
		t.Fatalf("tally follows an unshared room: HTTP %d %s", r.status, r.body)
	}
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/room/share", []byte(`{"tenant":"bob"}`)), http.StatusOK, "share")
	wantStatus(t, as(t, n, b, http.MethodPost, "/v1/objects/tally/t/follow", follow), http.StatusOK, "tally follows")
	for i := range 3 {
		wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/chat/room/post", []byte(fmt.Sprintf(`{"author":"ann","text":"%d"}`, i))), http.StatusOK, "post")
	}
	eventually(t, 20*time.Second, "tally counts 3", func() bool {
		r := as(t, n, b, http.MethodPost, "/v1/objects/tally/t/counts", nil)
		return bytes.Contains(r.body, []byte(`"total":3`))
	})
}

// TestTenantLimits: each limit, at the limit works and over it is refused
// with 413 or 429 naming the limit, and nothing already stored is lost.
// postUntilRefused posts text to chat/r as tok until a post is refused (at
// most 200), calling after each committed one; it returns how many were
// committed and the refusal.
func postUntilRefused(t *testing.T, n *host.Node, tok, text string, after func()) (int, response) {
	t.Helper()
	posted := 0
	var last response
	for range 200 {
		last = as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"a","text":"`+text+`"}`))
		if last.status != http.StatusOK {
			break
		}
		posted++
		after()
	}
	return posted, last
}

func TestTenantLimits(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, op := authNode(t, func(c *host.Config) { c.VM.Budget = 2 * time.Second })

	t.Run("module_bytes", func(t *testing.T) {
		tok := mkTenant(t, n, op, "mod", `{"module_bytes":1000000}`)
		wantStatus(t, tenantUpload(t, n, tok, "small", "counter-rust"), http.StatusCreated, "a 50 KB module")
		wantError(t, tenantUpload(t, n, tok, "big", "counter"), http.StatusRequestEntityTooLarge, "module size", "1000000")
		r := as(t, n, tok, http.MethodGet, "/v1/programs", nil)
		if !bytes.Contains(r.body, []byte(`"small"`)) || bytes.Contains(r.body, []byte(`"big"`)) {
			t.Fatalf("programs after the refused upload: %s", r.body)
		}
	})
	t.Run("programs", func(t *testing.T) {
		tok := mkTenant(t, n, op, "progs", `{"programs":2}`)
		wantStatus(t, tenantUpload(t, n, tok, "p1", "counter-rust"), http.StatusCreated, "first")
		wantStatus(t, tenantUpload(t, n, tok, "p2", "counter-rust"), http.StatusCreated, "second, at the limit")
		wantError(t, tenantUpload(t, n, tok, "p3", "counter-rust"), http.StatusTooManyRequests, "programs limit", "2")
		wantStatus(t, tenantUpload(t, n, tok, "p2", "chat-rust"), http.StatusCreated, "a new version of an existing name")
	})
	t.Run("memory_pages", func(t *testing.T) {
		tok := mkTenant(t, n, op, "mem", `{"memory_pages":64}`)
		wantStatus(t, tenantUpload(t, n, tok, "hostile", "hostile"), http.StatusCreated, "upload")
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/hostile/h/ok", nil), http.StatusOK, "a call within 64 pages")
		r := as(t, n, tok, http.MethodPost, "/v1/objects/hostile/h/bomb", nil)
		msg := wantError(t, r, http.StatusInternalServerError)
		if !strings.Contains(msg, "393216 in use") && !strings.Contains(strings.ToLower(msg), "out of memory") {
			t.Fatalf("bomb under 64 pages: %.300s", msg)
		}
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/hostile/h/ok", nil), http.StatusOK, "the object works after")
	})
	t.Run("object_bytes", func(t *testing.T) {
		tok := mkTenant(t, n, op, "objb", `{"object_bytes":262144}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
		text := strings.Repeat("x", 4000)
		posted, last := postUntilRefused(t, n, tok, text, func() {})
		wantError(t, last, http.StatusRequestEntityTooLarge, "object storage limit", "262144")
		if posted == 0 {
			t.Fatal("not one post fit in 256 KiB")
		}
		r := as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/history", []byte(`{"limit":1000}`))
		if got := bytes.Count(r.body, []byte(text)); got != posted {
			t.Fatalf("history has %d messages after %d committed posts: HTTP %d %.300s", got, posted, r.status, r.body)
		}
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/other/post", []byte(`{"author":"a","text":"small"}`)), http.StatusOK, "another object")
	})
	t.Run("tenant_bytes", func(t *testing.T) {
		tok := mkTenant(t, n, op, "tb", `{"tenant_bytes":150000}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
		// The usage is recounted every few seconds, and here after each
		// post: posts succeed until the tenant's files pass the limit, then
		// every write is refused and everything committed stays.
		text := strings.Repeat("y", 4000)
		posted, last := postUntilRefused(t, n, tok, text, n.ScanUsage)
		wantError(t, last, http.StatusRequestEntityTooLarge, "tenant storage limit", "150000")
		if posted == 0 {
			t.Fatal("not one post fit in the tenant's 150,000 bytes")
		}
		wantError(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/other/post", []byte(`{"author":"a","text":"small"}`)), http.StatusRequestEntityTooLarge, "tenant storage limit")
		r := as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/history", []byte(`{"limit":1000}`))
		if got := bytes.Count(r.body, []byte(text)); got != posted {
			t.Fatalf("history has %d messages, want the %d committed: HTTP %d %.300s", got, posted, r.status, r.body)
		}
	})
	t.Run("objects", func(t *testing.T) {
		tok := mkTenant(t, n, op, "objs", `{"objects":2}`)
		wantStatus(t, tenantUpload(t, n, tok, "counter", "counter-rust"), http.StatusCreated, "upload")
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/counter/a/inc", nil), http.StatusOK, "first object")
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/counter/b/inc", nil), http.StatusOK, "second, at the limit")
		wantError(t, as(t, n, tok, http.MethodPost, "/v1/objects/counter/c/inc", nil), http.StatusTooManyRequests, "objects limit", "2")
		if r := as(t, n, tok, http.MethodPost, "/v1/objects/counter/a/inc", nil); string(r.body) != "2" {
			t.Fatalf("an existing object after the refusal: HTTP %d %s", r.status, r.body)
		}
	})
	t.Run("connections", func(t *testing.T) {
		tok := mkTenant(t, n, op, "conns", `{"connections":1}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
		ws, _, err := tenantDial(t, n, tok, "chat/r")
		if err != nil {
			t.Fatal(err)
		}
		readUntil(t, ws, "hello")
		_, resp, err := tenantDial(t, n, tok, "chat/r")
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("second connection: %v %v, want 429", err, resp)
		}
		ws.Close(websocket.StatusNormalClosure, "")
		eventually(t, 10*time.Second, "a connection again after closing the first", func() bool {
			ws, _, err := tenantDial(t, n, tok, "chat/r")
			if err != nil {
				return false
			}
			ws.CloseNow()
			return true
		})
	})
	// The count stays exact when the limits change under open connections:
	// each one closed gives its slot back to the count it was taken from.
	t.Run("connections_across_a_limit_change", func(t *testing.T) {
		tok := mkTenant(t, n, op, "connchg", `{"connections":3}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
		open := func() *websocket.Conn {
			t.Helper()
			ws, _, err := tenantDial(t, n, tok, "chat/r")
			if err != nil {
				t.Fatal(err)
			}
			readUntil(t, ws, "hello")
			return ws
		}
		usage := func() int64 {
			t.Helper()
			var v struct {
				Usage struct{ Connections int64 } `json:"usage"`
			}
			r := as(t, n, tok, http.MethodGet, "/v1/whoami", nil)
			json.Unmarshal(r.body, &v)
			return v.Usage.Connections
		}
		a, b := open(), open()
		wantStatus(t, as(t, n, op, http.MethodPut, "/v1/tenants/connchg/limits", []byte(`{"connections":2}`)), http.StatusOK, "lower the limit")
		eventually(t, 10*time.Second, "the new limit in force", func() bool {
			_, resp, err := tenantDial(t, n, tok, "chat/r")
			return err != nil && resp != nil && resp.StatusCode == http.StatusTooManyRequests
		})
		if got := usage(); got != 2 {
			t.Fatalf("with 2 connections open across the change, usage counts %d", got)
		}
		a.Close(websocket.StatusNormalClosure, "")
		b.Close(websocket.StatusNormalClosure, "")
		eventually(t, 10*time.Second, "both closed connections given back", func() bool { return usage() == 0 })
		c, d := open(), open()
		if _, resp, err := tenantDial(t, n, tok, "chat/r"); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("a third connection under a limit of 2: %v %v, want 429", err, resp)
		}
		if got := usage(); got != 2 {
			t.Fatalf("2 open connections, usage counts %d", got)
		}
		c.CloseNow()
		d.CloseNow()
	})
	// A handler's follow runs the publisher's hook on the handler's own
	// slot: with one slot it does not wait for itself until its budget.
	t.Run("follow_with_one_handler_slot", func(t *testing.T) {
		tok := mkTenant(t, n, op, "oneslot", `{"concurrency":1}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload chat")
		wantStatus(t, tenantUpload(t, n, tok, "tally", "tally-rust"), http.StatusCreated, "upload tally")
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"a","text":"first"}`)), http.StatusOK, "post")
		start := time.Now()
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/tally/t/follow", []byte(`{"publisher":"chat/r"}`)), http.StatusOK, "follow from a handler")
		// Waiting for a second slot would wait for the handler's own
		// budget (10 s) to end; half of it tells the two apart on a
		// loaded machine (1 s did not: 1.36 s under load average 16).
		if d := time.Since(start); d > vm.DefaultBudget/2 {
			t.Fatalf("the follow took %v: it waited for a second handler slot", d)
		}
		wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"b","text":"counted"}`)), http.StatusOK, "post")
		eventually(t, 10*time.Second, "the follower counts the post", func() bool {
			r := as(t, n, tok, http.MethodPost, "/v1/objects/tally/t/counts", nil)
			return bytes.Contains(r.body, []byte(`"total":1`))
		})
	})
	t.Run("publish_rate", func(t *testing.T) {
		tok := mkTenant(t, n, op, "rate", `{"publish_rate":0.001,"publish_burst":3}`)
		wantStatus(t, tenantUpload(t, n, tok, "chat", "chat-rust"), http.StatusCreated, "upload")
		for i := range 3 {
			wantStatus(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(fmt.Sprintf(`{"author":"a","text":"m%d"}`, i))), http.StatusOK, "post within the burst")
		}
		wantError(t, as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/post", []byte(`{"author":"a","text":"over"}`)), http.StatusTooManyRequests, "publish rate limit")
		r := as(t, n, tok, http.MethodPost, "/v1/objects/chat/r/history", nil)
		if bytes.Contains(r.body, []byte("over")) || !bytes.Contains(r.body, []byte("m2")) {
			t.Fatalf("history after the refused post: %s", r.body)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		// Tenant "busy" may run one handler at a time: its two looping
		// calls (2 s budget each) run one after the other, while tenant
		// "calm" keeps answering.
		busy := mkTenant(t, n, op, "busy", `{"concurrency":1}`)
		calm := mkTenant(t, n, op, "calm", "")
		wantStatus(t, tenantUpload(t, n, busy, "hostile", "hostile"), http.StatusCreated, "upload")
		wantStatus(t, tenantUpload(t, n, calm, "counter", "counter-rust"), http.StatusCreated, "upload")
		wantStatus(t, as(t, n, busy, http.MethodPost, "/v1/objects/hostile/l1/ok", nil), http.StatusOK, "warm l1")
		wantStatus(t, as(t, n, busy, http.MethodPost, "/v1/objects/hostile/l2/ok", nil), http.StatusOK, "warm l2")
		start := time.Now()
		var wg sync.WaitGroup
		took := make([]time.Duration, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				as(t, n, busy, http.MethodPost, fmt.Sprintf("/v1/objects/hostile/l%d/loop", i+1), nil)
				took[i] = time.Since(start)
			}()
		}
		time.Sleep(200 * time.Millisecond)
		calls := 0
		for time.Since(start) < 3*time.Second {
			// get, not inc: a fast machine's loop would run into the calm
			// tenant's publish rate, which is not what this checks.
			wantStatus(t, as(t, n, calm, http.MethodPost, "/v1/objects/counter/c/get", nil), http.StatusOK, "calm tenant's call")
			calls++
		}
		wg.Wait()
		if slow := max(took[0], took[1]); slow < 4*time.Second {
			t.Fatalf("two 2 s loops of a tenant with concurrency 1 ended after %v and %v: they ran at once", took[0], took[1])
		}
		t.Logf("busy tenant's loops ended after %v and %v; the calm tenant made %d calls meanwhile", took[0], took[1], calls)
	})
}

// TestCrossTenantObjectCallRefused: an object's call of another tenant's
// object is refused as a client of its tenant is (404, naming nothing of
// the other tenant), with or without an idempotency key, while its own
// tenant's objects answer; a foreign request's Idempotency-Key gets no
// further either.
func TestCrossTenantObjectCallRefused(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	a := mkTenant(t, n, op, "acme", "")
	b := mkTenant(t, n, op, "bob", "")
	wantStatus(t, tenantUpload(t, n, a, "ledger", "ledger"), http.StatusCreated, "a uploads ledger")
	wantStatus(t, tenantUpload(t, n, b, "ledger", "ledger"), http.StatusCreated, "b uploads ledger")
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/ledger/x/add", []byte("a's")), http.StatusOK, "a adds")
	for _, key := range []string{"", "k1"} {
		r := as(t, n, b, http.MethodPost, "/v1/objects/ledger/b/call", []byte(callPayload("acme.ledger/x", "add", key, "", "b's")))
		if r.status != http.StatusOK || !strings.HasPrefix(string(r.body), "error 404 unknown program") {
			t.Fatalf("b's object calls a's (key %q): HTTP %d %s", key, r.status, r.body)
		}
	}
	r := as(t, n, b, http.MethodPost, "/v1/objects/ledger/b/call", []byte(callPayload("ledger/x", "add", "", "", "b's")))
	if string(r.body) != "ok 1" {
		t.Fatalf("b's object calls b's own ledger/x: HTTP %d %s", r.status, r.body)
	}
	// Its errors name its objects as it names them.
	r = as(t, n, b, http.MethodPost, "/v1/objects/ledger/b/call", []byte(callPayload("ledger/b", "total", "", "", "")))
	if want := "error 508 object call refused: call cycle ledger/b → ledger/b"; !strings.HasPrefix(string(r.body), want) {
		t.Fatalf("b's object calls itself: HTTP %d %s, want %s…", r.status, r.body, want)
	}
	req, _ := http.NewRequest(http.MethodPost, n.URL()+"/v1/objects/acme.ledger/x/add", strings.NewReader("b's"))
	req.Header.Set("Authorization", "Bearer "+b)
	req.Header.Set("Idempotency-Key", "k2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	wantStatus(t, response{status: resp.StatusCode}, http.StatusNotFound, "b calls a's object with an Idempotency-Key")
	if r := as(t, n, a, http.MethodPost, "/v1/objects/ledger/x/entries", nil); string(r.body) != "a's\n" {
		t.Fatalf("a's ledger after b's attempts: %q", r.body)
	}
}

// TestCallRecordsCountTowardObjectStorage: calls that write nothing but
// their idempotency record fill an object to its storage limit, and are
// then refused (413, naming the limit) while an unkeyed call, which
// records nothing, still runs.
func TestCallRecordsCountTowardObjectStorage(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, nil)
	a := mkTenant(t, n, op, "acme", `{"object_bytes":65536}`)
	wantStatus(t, tenantUpload(t, n, a, "ledger", "ledger"), http.StatusCreated, "a uploads ledger")
	var last response
	keyed := 0
	for ; keyed < 2000; keyed++ {
		req, _ := http.NewRequest(http.MethodPost, n.URL()+"/v1/objects/ledger/l/total", nil)
		req.Header.Set("Authorization", "Bearer "+a)
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%0200d", keyed))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = response{status: resp.StatusCode, header: resp.Header, body: b}
		if last.status != http.StatusOK {
			break
		}
	}
	wantError(t, last, http.StatusRequestEntityTooLarge, "object storage")
	if keyed == 0 {
		t.Fatal("the first keyed call was refused")
	}
	wantStatus(t, as(t, n, a, http.MethodPost, "/v1/objects/ledger/l/total", nil), http.StatusOK, "an unkeyed call on the full object")
}

// TestObjectCallRunsOnItsCallersSlot: with one handler slot, an object's
// call of another object of its tenant runs on the slot its caller holds,
// instead of waiting for it until the budget ends.
func TestObjectCallRunsOnItsCallersSlot(t *testing.T) {
	t.Parallel()
	n, op := authNode(t, func(c *host.Config) { c.VM.Budget = 2 * time.Second })
	a := mkTenant(t, n, op, "acme", `{"concurrency":1}`)
	wantStatus(t, tenantUpload(t, n, a, "ledger", "ledger"), http.StatusCreated, "a uploads ledger")
	r := as(t, n, a, http.MethodPost, "/v1/objects/ledger/a/call", []byte(callPayload("ledger/b", "call", "", "", callPayload("ledger/c", "add", "", "", "x"))))
	if r.status != http.StatusOK || string(r.body) != "ok ok 1" {
		t.Fatalf("a → b → c on one slot: HTTP %d %s", r.status, r.body)
	}
}
