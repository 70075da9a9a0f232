// Package api is the node's HTTP API: its routes, how a request is
// authenticated, decoded and checked, how a reply or an error is encoded
// (the error → status mapping, Status, and the message, Message), the
// WebSocket endpoint's upgrade, the server-sent events of a stream, and the
// demo page.
//
// It does not know how the node does any of it: New takes a Backend (the
// node, in package host) and serves what it answers. A WebSocket, once
// upgraded, is handed to the Backend, whose connection registry holds it:
// the fan-out writes events there, on the delivery's hot path, not through
// this package. A stream's subscription, likewise, runs in the Backend; this
// package writes its events as server-sent events.
package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
)

// Backend is what the API asks of the node. Objects are named as the node
// names them (names.Object, already resolved for the request's principal);
// errors are the node's, mapped to statuses by Status.
type Backend interface {
	// ID is the node's id.
	ID() string
	// ActiveObjects is how many objects are active on the node.
	ActiveObjects() int
	// Nodes lists the cluster's live nodes.
	Nodes() []cluster.NodeInfo

	// Upload stores wasm as the next version of the program name; created
	// is false when the bytes equal the latest version.
	Upload(ctx context.Context, name string, wasm []byte) (pr client.Program, created bool, err error)
	// Rollback makes version to of the program name (0: the one before
	// the newest) current again, as a new version.
	Rollback(ctx context.Context, name string, to int) (client.Program, error)
	// Programs lists every version of the program name.
	Programs(ctx context.Context, name string) ([]client.Program, error)
	// ListPrograms lists the latest version of every program keep accepts.
	ListPrograms(ctx context.Context, keep func(name string) bool) ([]client.Program, error)
	// ProgramNames lists the name of every program keep accepts.
	ProgramNames(ctx context.Context, keep func(name string) bool) ([]string, error)
	// Program is the latest version of the program name.
	Program(ctx context.Context, name string) (client.Program, error)

	// CallWithKey runs method on the object with payload and returns its
	// reply, once in effect per idempotency key ("" for none): a repeat
	// gets the recorded reply, a key reused with another method or
	// payload fails (422).
	CallWithKey(ctx context.Context, id names.Object, method string, payload []byte, key string) ([]byte, error)
	// Edges lists the object's edges.
	Edges(ctx context.Context, id names.Object) ([]store.Edge, error)
	// RemoveEdge removes the object's edge; ok is false when it has none
	// of that id.
	RemoveEdge(ctx context.Context, id names.Object, edge int64) (ok bool, err error)
	// Replicas reports where the object's file and its copies are.
	Replicas(ctx context.Context, id names.Object) (ReplicaReport, error)

	// ListObjects lists a page of the objects q selects, cluster-wide.
	ListObjects(ctx context.Context, q ObjectsQuery) (ObjectPage, error)
	// State reads a page of an object's state (read-only, one read
	// transaction beside its handlers).
	State(ctx context.Context, id names.Object, q StateQuery) (StatePage, error)
	// Log reads a page of an object's events.
	Log(ctx context.Context, id names.Object, q LogQuery) (LogPage, error)

	// Connect serves an upgraded WebSocket as one of the node's
	// connections until it ends: the client's follows, and the events
	// delivered to it.
	Connect(ws *websocket.Conn, c Conn)
	// Stream runs the subscription q, calling send for each event and
	// flush at the end of each drain that sent some, until ctx ends or the
	// node shuts down (nil) or the subscription fails (its error, an
	// error from send or flush among them).
	Stream(ctx context.Context, q StreamQuery, send func(*abi.Event) error, flush func() error) error
}

// Conn is a WebSocket connection as the API accepted it.
type Conn struct {
	// Who the connection acts for.
	Who tenancy.Principal
	// Object is the object it connected to, whose program shapes its
	// events when UseEvent.
	Object   names.Object
	UseEvent bool
}

// StreamQuery is a stream subscription as a request asks for it.
type StreamQuery struct {
	Object names.Object
	Topic  string
	Filter string
	// After is the consumer's checkpoint; nil starts at the latest event.
	After *uint64
}

// Config is what the API needs besides its Backend.
type Config struct {
	// Tenants is the tenant registry; nil when tenancy is off (no tokens,
	// one local principal).
	Tenants *tenancy.Registry
	// Usage is each tenant's use on this node; nil when tenancy is off.
	Usage *tenancy.Usage
	// TenantLimits are the limits of a tenant whose record sets none.
	TenantLimits tenancy.Limits
	// MaxModuleSize bounds an uploaded module; MaxPayload a call's body.
	MaxModuleSize int
	MaxPayload    int
	// Budget is a handler's time budget, named when a call runs past it.
	Budget time.Duration
	// Metrics serves /metrics (to the operator).
	Metrics http.Handler
	// Demo serves the chat demo page at /.
	Demo bool
}

// server is the API of one node.
type server struct {
	b   Backend
	cfg Config
}

// New returns the HTTP API over b. A new route is one line here and a
// thin handler in the file of its subject (programs.go, objects.go,
// tenants.go, …).
func New(b Backend, cfg Config) http.Handler {
	s := &server{b: b, cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /v1/cluster", s.authed(s.handleCluster))
	mux.HandleFunc("GET /metrics", s.operatorOnly(func(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) { cfg.Metrics.ServeHTTP(w, r) }))
	mux.HandleFunc("GET /v1/whoami", s.authed(s.handleWhoami))
	mux.HandleFunc("POST /v1/tenants", s.tenantAdmin(s.handleCreateTenant))
	mux.HandleFunc("GET /v1/tenants", s.tenantAdmin(s.handleListTenants))
	mux.HandleFunc("GET /v1/tenants/{name}", s.tenantAdmin(s.handleGetTenant))
	mux.HandleFunc("POST /v1/tenants/{name}/rotate", s.tenantAdmin(s.handleRotateTenant))
	mux.HandleFunc("POST /v1/tenants/{name}/revoke", s.tenantAdmin(s.handleRevokeTenant))
	mux.HandleFunc("PUT /v1/tenants/{name}/limits", s.tenantAdmin(s.handleTenantLimits))
	mux.HandleFunc("PUT /v1/programs/{name}", s.authed(s.program(s.handleUpload)))
	mux.HandleFunc("GET /v1/programs", s.authed(s.handleListPrograms))
	mux.HandleFunc("GET /v1/programs/{name}", s.authed(s.program(s.handleGetProgram)))
	mux.HandleFunc("POST /v1/programs/{name}/rollback", s.authed(s.program(s.handleRollback)))
	mux.HandleFunc("POST /v1/objects/{program}/{id}/{method}", s.authed(s.object(s.handleCall)))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/connect", s.authed(s.object(s.handleConnect)))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/edges", s.authed(s.object(s.handleEdges)))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/replicas", s.authed(s.object(s.handleReplicas)))
	mux.HandleFunc("GET /v1/objects", s.authed(s.handleListObjects))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/state", s.authed(s.object(s.handleState)))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/log", s.authed(s.object(s.handleLog)))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/stream", s.authed(s.object(s.handleStream)))
	mux.HandleFunc("DELETE /v1/objects/{program}/{id}/edges/{edge}", s.authed(s.object(s.handleDeleteEdge)))
	if cfg.Demo {
		mux.HandleFunc("GET /{$}", handleDemo)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no route %s %s; see the README for the API", r.Method, names.Clip(r.URL.Path)))
	})
	return mux
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "node": s.b.ID(), "objects": s.b.ActiveObjects()})
}

func (s *server) handleCluster(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	writeJSON(w, http.StatusOK, map[string]any{"self": s.b.ID(), "nodes": s.b.Nodes()})
}
