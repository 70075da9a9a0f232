package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/durable-host/host/vm"
)

// Handler returns the node's HTTP API.
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", n.handleHealth)
	mux.HandleFunc("GET /v1/cluster", n.handleCluster)
	mux.Handle("GET /metrics", n.metrics.handler())
	mux.HandleFunc("PUT /v1/programs/{name}", n.handleUpload)
	mux.HandleFunc("GET /v1/programs", n.handleListPrograms)
	mux.HandleFunc("GET /v1/programs/{name}", n.handleGetProgram)
	mux.HandleFunc("POST /v1/objects/{program}/{id}/{method}", n.handleCall)
	mux.HandleFunc("GET /v1/objects/{program}/{id}/connect", n.handleConnect)
	mux.HandleFunc("GET /v1/objects/{program}/{id}/edges", n.handleEdges)
	mux.HandleFunc("DELETE /v1/objects/{program}/{id}/edges/{edge}", n.handleDeleteEdge)
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
	case errors.Is(err, ErrBadRequest), errors.Is(err, vm.ErrBadRequest):
		return http.StatusBadRequest
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
	writeJSON(w, statusOf(err), map[string]string{"error": n.apiMessage(err)})
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

func (n *Node) handleUpload(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := ValidateProgramName(name); err != nil {
		n.fail(w, err)
		return
	}
	wasm, err := readBody(w, r, n.cfg.VM.MaxModuleSize)
	if err != nil {
		n.fail(w, err)
		return
	}
	if len(wasm) == 0 {
		n.fail(w, fmt.Errorf("%w: empty body; send the module: curl -T app.wasm .../v1/programs/%s", ErrBadRequest, name))
		return
	}
	pr, created, err := n.Upload(r.Context(), name, wasm)
	if err != nil {
		n.fail(w, err)
		return
	}
	st := http.StatusCreated
	if !created {
		st = http.StatusOK
	}
	writeJSON(w, st, pr)
}

func (n *Node) handleListPrograms(w http.ResponseWriter, r *http.Request) {
	ps, err := n.Programs(r.Context(), "")
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"programs": ps})
}

func (n *Node) handleGetProgram(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := ValidateProgramName(name); err != nil {
		n.fail(w, err)
		return
	}
	ps, err := n.Programs(r.Context(), name)
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "versions": ps})
}

func (n *Node) handleCall(w http.ResponseWriter, r *http.Request) {
	id := ObjectID{r.PathValue("program"), r.PathValue("id")}
	if err := id.Validate(); err != nil {
		n.fail(w, err)
		return
	}
	payload, err := readBody(w, r, n.cfg.MaxPayload)
	if err != nil {
		n.fail(w, err)
		return
	}
	reply, err := n.Call(r.Context(), id, r.PathValue("method"), payload)
	if err != nil {
		n.fail(w, err)
		return
	}
	if json.Valid(reply) && len(reply) > 0 {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Write(reply)
}

func (n *Node) handleEdges(w http.ResponseWriter, r *http.Request) {
	id := ObjectID{r.PathValue("program"), r.PathValue("id")}
	edges, err := n.Edges(r.Context(), id)
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": id.String(), "edges": edges})
}

func (n *Node) handleDeleteEdge(w http.ResponseWriter, r *http.Request) {
	id := ObjectID{r.PathValue("program"), r.PathValue("id")}
	edge, err := strconv.ParseInt(r.PathValue("edge"), 10, 64)
	if err != nil {
		n.fail(w, fmt.Errorf("%w: edge must be a number", ErrBadRequest))
		return
	}
	ok, err := n.RemoveEdge(r.Context(), id, edge)
	if err != nil {
		n.fail(w, err)
		return
	}
	if !ok {
		n.fail(w, fmt.Errorf("%w: %s has no edge %d", ErrUnknownObject, id, edge))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": id.String(), "removed": edge})
}
