package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/vm"
)

// backend answers the few calls these tests make; any other call panics
// (the embedded nil interface), so a test cannot pass by reaching the node.
type backend struct {
	api.Backend
	calls []string
}

func (b *backend) ID() string                { return "n-test" }
func (b *backend) ActiveObjects() int        { return 3 }
func (b *backend) Nodes() []cluster.NodeInfo { return nil }
func (b *backend) Program(_ context.Context, name string) (client.Program, error) {
	if name != "counter" {
		return client.Program{}, names.UnknownProgram(name)
	}
	return client.Program{Name: name}, nil
}

func (b *backend) CallWithKey(_ context.Context, id names.Object, method string, payload []byte, key string) ([]byte, error) {
	b.calls = append(b.calls, id.String()+" "+method+" "+string(payload)+key)
	switch method {
	case "slow":
		return nil, vm.ErrBudget
	case "fail":
		return nil, &vm.GuestError{Message: "no"}
	}
	return []byte(`7`), nil
}

type statusErr struct{}

func (statusErr) Error() string   { return "from afar" }
func (statusErr) HTTPStatus() int { return http.StatusTeapot }

func TestStatus(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("x: %w", abi.ErrBadRequest), 400},
		{tenancy.ErrUnauthorized, 401},
		{tenancy.ErrForbidden, 403},
		{&vm.RefusedError{Reason: "members only"}, 403},
		{names.UnknownProgram("p"), 404},
		{fmt.Errorf("%w: e", names.ErrUnknownObject), 404},
		{vm.ErrMethodNotFound, 404},
		{tenancy.ErrConflict, 409},
		{abi.ErrTooLarge, 413},
		{&http.MaxBytesError{Limit: 1}, 413},
		{tenancy.SizeLimit("module size", 1, 2), 413},
		{tenancy.CountLimit("programs", 1, 2, "programs"), 429},
		{&vm.GuestError{Message: "no"}, 422},
		{&vm.TrapError{}, 500},
		{abi.ErrUnavailable, 503},
		{cluster.ErrObjectUnavailable, 503},
		{fmt.Errorf("budget: %w", vm.ErrBudget), 504},
		{fmt.Errorf("wrapped: %w", statusErr{}), http.StatusTeapot},
		{errors.New("disk on fire"), 500},
	} {
		if got := api.Status(c.err); got != c.want {
			t.Errorf("Status(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, http.Header, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, w.Result().Header, string(b)
}

func errorOf(t *testing.T, body string) string {
	t.Helper()
	var v struct{ Error string }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return v.Error
}

// TestRoutesWithoutANode: the API's own answers (decoding, limits, the
// error body and status) need no node behind it.
func TestRoutesWithoutANode(t *testing.T) {
	b := &backend{}
	h := api.New(b, api.Config{MaxModuleSize: 16, MaxPayload: 8, Budget: 10 * time.Second})

	if st, _, body := do(t, h, "GET", "/healthz", ""); st != 200 || !strings.Contains(body, `"node":"n-test"`) || !strings.Contains(body, `"objects":3`) {
		t.Errorf("healthz: %d %s", st, body)
	}
	if st, hd, body := do(t, h, "POST", "/v1/objects/counter/c1/inc", "{}"); st != 200 || body != "7" || hd.Get("Content-Type") != "application/json" {
		t.Errorf("call: %d %q %q", st, body, hd.Get("Content-Type"))
	}
	if len(b.calls) != 1 || b.calls[0] != "counter/c1 inc {}" {
		t.Errorf("the backend saw %q", b.calls)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		msg                string
	}{
		{"GET", "/nowhere", "", 404, "no route GET /nowhere; see the README for the API"},
		{"GET", "/", "", 404, "no route GET /"},
		{"POST", "/v1/objects/counter/c1/inc", "123456789", 413, "too large: body is over the limit of 8 bytes"},
		{"POST", "/v1/objects/counter/-x/inc", "", 400, `object id "-x" must be`},
		{"POST", "/v1/objects/counter/c1/slow", "", 504, "(10s); the call was cancelled and rolled back"},
		{"POST", "/v1/objects/counter/c1/fail", "", 422, "method failed: no"},
		{"PUT", "/v1/programs/counter", "", 400, "empty body; send the module"},
		{"PUT", "/v1/programs/counter", strings.Repeat("x", 17), 413, "over the limit of 16 bytes"},
		{"GET", "/v1/objects/nope/c1/stream", "", 404, `unknown program: "nope"`},
		{"GET", "/v1/objects/counter/c1/stream?after=x", "", 400, "after must be an event seq"},
		{"GET", "/v1/objects/counter/c1/stream?filter==x", "", 400, "bad request"},
		{"GET", "/v1/objects/nope/c1/connect", "", 404, `unknown program: "nope"`},
		{"GET", "/v1/tenants", "", 404, "tenancy is off on this node; start it with --auth"},
	} {
		st, hd, body := do(t, h, c.method, c.path, c.body)
		if st != c.status || !strings.Contains(errorOf(t, body), c.msg) || hd.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, st, body, c.status, c.msg)
		}
	}

	demo := api.New(b, api.Config{Demo: true})
	if st, hd, body := do(t, demo, "GET", "/", ""); st != 200 || !strings.HasPrefix(hd.Get("Content-Type"), "text/html") || !strings.Contains(body, "<html") {
		t.Errorf("demo page: %d %q", st, hd.Get("Content-Type"))
	}
}
