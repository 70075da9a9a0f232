package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/durable-host/host/host/client"
)

// TestClientRoutes: each typed method sends its route with every caller's
// part escaped, the body the node expects and the token, and hands back the
// node's JSON as sent.
func TestClientRoutes(t *testing.T) {
	type request struct{ method, path, body, auth string }
	var got request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = request{r.Method, r.URL.EscapedPath(), string(b), r.Header.Get("Authorization")}
		w.Write([]byte(`{"z": 1, "a": [2]}`))
	}))
	defer srv.Close()
	c := &client.Client{Base: srv.URL + "/", Token: "ht_t"}
	ctx := context.Background()
	cases := []struct {
		name string
		call func(v any) error
		want request
	}{
		{"programs", func(v any) error { return c.Programs(ctx, "", v) }, request{"GET", "/v1/programs", "", ""}},
		{"program", func(v any) error { return c.Programs(ctx, "a/b c", v) }, request{"GET", "/v1/programs/a%2Fb%20c", "", ""}},
		{"edges", func(v any) error { return c.Edges(ctx, "acme.chat/r.1", v) }, request{"GET", "/v1/objects/acme.chat/r.1/edges", "", ""}},
		{"unfollow", func(v any) error { return c.Unfollow(ctx, "chat/r1", "7/../8", v) }, request{"DELETE", "/v1/objects/chat/r1/edges/7%2F..%2F8", "", ""}},
		{"cluster", func(v any) error { return c.Cluster(ctx, v) }, request{"GET", "/v1/cluster", "", ""}},
		{"whoami", func(v any) error { return c.Whoami(ctx, v) }, request{"GET", "/v1/whoami", "", ""}},
		{"create", func(v any) error { return c.CreateTenant(ctx, "acme", nil, v) }, request{"POST", "/v1/tenants", `{"name":"acme"}`, ""}},
		{"create with limits", func(v any) error { return c.CreateTenant(ctx, "acme", json.RawMessage(`{"programs": 2}`), v) }, request{"POST", "/v1/tenants", `{"limits":{"programs":2},"name":"acme"}`, ""}},
		{"tenants", func(v any) error { return c.Tenants(ctx, v) }, request{"GET", "/v1/tenants", "", ""}},
		{"tenant", func(v any) error { return c.Tenant(ctx, "a/b", v) }, request{"GET", "/v1/tenants/a%2Fb", "", ""}},
		{"rotate", func(v any) error { return c.RotateTenant(ctx, "acme", v) }, request{"POST", "/v1/tenants/acme/rotate", "", ""}},
		{"revoke", func(v any) error { return c.RevokeTenant(ctx, "a?b", v) }, request{"POST", "/v1/tenants/a%3Fb/revoke", "", ""}},
		{"limits", func(v any) error { return c.SetTenantLimits(ctx, "acme", json.RawMessage(`{}`), v) }, request{"PUT", "/v1/tenants/acme/limits", `{}`, ""}},
	}
	for _, tc := range cases {
		got = request{}
		var raw json.RawMessage
		if err := tc.call(&raw); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		tc.want.auth = "Bearer ht_t"
		if got != tc.want {
			t.Errorf("%s sent %+v, want %+v", tc.name, got, tc.want)
		}
		if string(raw) != `{"z": 1, "a": [2]}` {
			t.Errorf("%s: reply %s, not the node's document as sent", tc.name, raw)
		}
	}
}

// TestClientRefusesBadObjectsBeforeSending: a bad object name, or another
// tenant's object watched without a connection of one's own, fails with the
// node's text and no request.
func TestClientRefusesBadObjectsBeforeSending(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a request was sent")
	}))
	defer srv.Close()
	c := &client.Client{Base: srv.URL}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"call", func() error { _, err := c.Call(ctx, "counter", "inc", nil); return err }(), `bad request: object "counter" must be PROGRAM/ID`},
		{"edges", c.Edges(ctx, "counter/../x", nil), `bad request: object id "../x" must be 1-128 of A-Z a-z 0-9 . _ - and start with a letter or digit`},
		{"unfollow", c.Unfollow(ctx, "Counter/x", "1", nil), `bad request: program name "Counter" must be 1-63 of a-z 0-9 _ - and start with a letter or digit`},
		{"subscribe", c.Subscribe(ctx, "a.b.c/x", client.SubscribeOptions{}, nil), `bad request: program name "a.b.c" must be PROGRAM or TENANT.PROGRAM`},
		{"watch", c.Watch(ctx, "acme.chat/room1", client.WatchOptions{}, nil), `bad request: acme.chat/room1 is another tenant's object: attach the connection to one of yours with --via PROGRAM/ID`},
		{"watch via", c.Watch(ctx, "acme.chat/room1", client.WatchOptions{Via: "mine"}, nil), `bad request: object "mine" must be PROGRAM/ID`},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.want)
		}
	}
}
