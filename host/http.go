package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/vm"
)

// Handler returns the node's HTTP API.
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", n.handleHealth)
	mux.HandleFunc("GET /v1/cluster", n.authed(n.handleCluster))
	metrics := n.metrics.handler()
	mux.HandleFunc("GET /metrics", n.operatorOnly(func(w http.ResponseWriter, r *http.Request, _ principal) { metrics.ServeHTTP(w, r) }))
	mux.HandleFunc("GET /v1/whoami", n.authed(n.handleWhoami))
	mux.HandleFunc("POST /v1/tenants", n.tenantAdmin(n.handleCreateTenant))
	mux.HandleFunc("GET /v1/tenants", n.tenantAdmin(n.handleListTenants))
	mux.HandleFunc("GET /v1/tenants/{name}", n.tenantAdmin(n.handleGetTenant))
	mux.HandleFunc("POST /v1/tenants/{name}/rotate", n.tenantAdmin(n.handleRotateTenant))
	mux.HandleFunc("POST /v1/tenants/{name}/revoke", n.tenantAdmin(n.handleRevokeTenant))
	mux.HandleFunc("PUT /v1/tenants/{name}/limits", n.tenantAdmin(n.handleTenantLimits))
	mux.HandleFunc("PUT /v1/programs/{name}", n.authed(n.handleUpload))
	mux.HandleFunc("GET /v1/programs", n.authed(n.handleListPrograms))
	mux.HandleFunc("GET /v1/programs/{name}", n.authed(n.handleGetProgram))
	mux.HandleFunc("POST /v1/objects/{program}/{id}/{method}", n.authed(n.handleCall))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/connect", n.authed(n.handleConnect))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/edges", n.authed(n.handleEdges))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/replicas", n.authed(n.handleReplicas))
	mux.HandleFunc("GET /v1/objects/{program}/{id}/stream", n.authed(n.handleStream))
	mux.HandleFunc("DELETE /v1/objects/{program}/{id}/edges/{edge}", n.authed(n.handleDeleteEdge))
	if n.cfg.Demo {
		mux.HandleFunc("GET /{$}", n.handleDemo)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no route %s %s; see the README for the API", r.Method, clip(r.URL.Path)))
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// statusOf maps an error to its HTTP status.
func statusOf(err error) int {
	var ge *vm.GuestError
	var te *vm.TrapError
	var re *vm.RefusedError
	var mbe *http.MaxBytesError
	var rerr *remoteError
	var le *LimitError
	switch {
	case errors.As(err, &rerr) && rerr.status >= 400:
		return rerr.status
	case errors.As(err, &le):
		return le.Status
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrUnknownProgram), errors.Is(err, ErrUnknownObject),
		errors.Is(err, vm.ErrMethodNotFound), errors.Is(err, vm.ErrNoHandler):
		return http.StatusNotFound
	case errors.Is(err, vm.ErrInvalidModule):
		return http.StatusBadRequest
	case errors.Is(err, ErrTooLarge), errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &re):
		return http.StatusForbidden
	case errors.As(err, &ge):
		return http.StatusUnprocessableEntity
	case errors.Is(err, vm.ErrBudget), errors.Is(err, vm.ErrInitBudget):
		return http.StatusGatewayTimeout
	case errors.As(err, &te):
		return http.StatusInternalServerError
	case errors.Is(err, ErrShuttingDown), errors.Is(err, ErrUnavailable), errors.Is(err, ErrObjectUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func (n *Node) fail(w http.ResponseWriter, err error) {
	st := statusOf(err)
	if st == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="host"`)
	}
	writeJSON(w, st, map[string]string{"error": n.apiMessage(err)})
}

// failAs is fail for a principal: its own names appear as it wrote them,
// without its tenant's prefix.
func (n *Node) failAs(w http.ResponseWriter, p principal, err error) {
	if p.Tenant == "" {
		n.fail(w, err)
		return
	}
	writeJSON(w, statusOf(err), map[string]string{"error": p.Strip(n.apiMessage(err))})
}

// bearer is the request's token: the Authorization header, or for a
// WebSocket from a browser (which cannot set headers) ?access_token=.
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return h
		}
		return strings.TrimSpace(tok)
	}
	return r.URL.Query().Get("access_token")
}

type authedHandler func(w http.ResponseWriter, r *http.Request, p principal)

// authed runs h for the request's principal: the local one without
// tenancy, else the token's, or fails with 401.
func (n *Node) authed(h authedHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if n.tenants == nil {
			h(w, r, tenancy.Local)
			return
		}
		p, err := n.tenants.Authenticate(r.Context(), bearer(r))
		if err != nil {
			n.fail(w, err)
			return
		}
		h(w, r, p)
	}
}

// operatorOnly is authed for the operator's token; tenants get 403.
func (n *Node) operatorOnly(h authedHandler) http.HandlerFunc {
	return n.authed(func(w http.ResponseWriter, r *http.Request, p principal) {
		if !p.Operator {
			n.fail(w, fmt.Errorf("%w: this needs the operator token (DATA/admin.token)", ErrForbidden))
			return
		}
		h(w, r, p)
	})
}

// apiMessage is the message a client sees for err, here or forwarded.
func (n *Node) apiMessage(err error) string {
	if errors.Is(err, vm.ErrBudget) {
		return fmt.Sprintf("%v (%s); the call was cancelled and rolled back", err, n.cfg.VM.Budget)
	}
	var ge *vm.GuestError
	if errors.As(err, &ge) {
		return "method failed: " + ge.Message
	}
	return err.Error()
}

func (n *Node) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "node": n.id, "objects": n.ActiveObjects()})
}

// readBody reads at most limit bytes of the request body.
func readBody(w http.ResponseWriter, r *http.Request, limit int) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("%w: body is over the limit of %d bytes", ErrTooLarge, limit)
	}
	return b, err
}

func (n *Node) handleUpload(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	qname, err := resolveProgram(p, name)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	tu := n.usage.Of(p.Tenant)
	limit := int64(n.cfg.VM.MaxModuleSize)
	if tu != nil && tu.Limits().ModuleBytes < limit {
		limit = tu.Limits().ModuleBytes
		if r.ContentLength > limit {
			n.failAs(w, p, tenancy.SizeLimit("module size", limit, r.ContentLength))
			return
		}
	}
	wasm, err := readBody(w, r, int(limit))
	if err != nil {
		if tu != nil && errors.Is(err, ErrTooLarge) {
			err = tenancy.SizeLimit("module size", limit, limit+1)
		}
		n.failAs(w, p, err)
		return
	}
	if len(wasm) == 0 {
		n.failAs(w, p, fmt.Errorf("%w: empty body; send the module: curl -T app.wasm .../v1/programs/%s", ErrBadRequest, name))
		return
	}
	if tu != nil {
		if err := n.checkProgramCount(r.Context(), tu, qname); err != nil {
			n.failAs(w, p, err)
			return
		}
	}
	pr, created, err := n.Upload(r.Context(), qname, wasm)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	st := http.StatusCreated
	if !created {
		st = http.StatusOK
	}
	pr.Name = p.Show(pr.Name)
	writeJSON(w, st, pr)
}

// checkProgramCount refuses a new program name past the tenant's limit.
func (n *Node) checkProgramCount(ctx context.Context, tu *tenancy.Use, qname string) error {
	names, err := n.programs.names(ctx, func(k string) bool { return tenancy.TenantOf(k) == tu.Tenant() })
	if err != nil {
		return err
	}
	return tu.AllowProgram(names, qname)
}

func (n *Node) handleListPrograms(w http.ResponseWriter, r *http.Request, p principal) {
	ps, err := n.programs.listIn(r.Context(), "", p.Owns)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	for i := range ps {
		ps[i].Name = p.Show(ps[i].Name)
	}
	writeJSON(w, http.StatusOK, map[string]any{"programs": ps})
}

func (n *Node) handleGetProgram(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	qname, err := resolveProgram(p, name)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	ps, err := n.Programs(r.Context(), qname)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	for i := range ps {
		ps[i].Name = p.Show(ps[i].Name)
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "versions": ps})
}

func (n *Node) handleCall(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := resolveObject(p, r.PathValue("program"), r.PathValue("id"))
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	payload, err := readBody(w, r, n.cfg.MaxPayload)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	reply, err := n.Call(r.Context(), id, r.PathValue("method"), payload)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	if json.Valid(reply) && len(reply) > 0 {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Write(reply)
}

func (n *Node) handleEdges(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := resolveObject(p, r.PathValue("program"), r.PathValue("id"))
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	edges, err := n.Edges(r.Context(), id)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": showObject(p, id), "edges": edges})
}

func (n *Node) handleReplicas(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := resolveObject(p, r.PathValue("program"), r.PathValue("id"))
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	rep, err := n.Replicas(r.Context(), id)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	rep.Object = showObject(p, id)
	writeJSON(w, http.StatusOK, rep)
}

func (n *Node) handleDeleteEdge(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := resolveObject(p, r.PathValue("program"), r.PathValue("id"))
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	edge, err := strconv.ParseInt(r.PathValue("edge"), 10, 64)
	if err != nil {
		n.failAs(w, p, fmt.Errorf("%w: edge must be a number", ErrBadRequest))
		return
	}
	ok, err := n.RemoveEdge(r.Context(), id, edge)
	if err != nil {
		n.failAs(w, p, err)
		return
	}
	if !ok {
		n.failAs(w, p, fmt.Errorf("%w: %s has no edge %d", ErrUnknownObject, showObject(p, id), edge))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": showObject(p, id), "removed": edge})
}
