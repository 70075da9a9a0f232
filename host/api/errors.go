package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/vm"
)

// A StatusError states its own HTTP status: an error that crossed from
// another node keeps the one that node answered, and the node's own
// sentinels that no part below it defines say theirs.
type StatusError interface {
	error
	HTTPStatus() int
}

// Status maps an error to its HTTP status. The inter-node layer sends it
// with a failed reply, so a forwarded request answers as a local one.
func Status(err error) int {
	var ge *vm.GuestError
	var te *vm.TrapError
	var re *vm.RefusedError
	var mbe *http.MaxBytesError
	var se StatusError
	var le *tenancy.LimitError
	switch {
	case errors.As(err, &se) && se.HTTPStatus() >= 400:
		return se.HTTPStatus()
	case errors.As(err, &le):
		return le.Status
	case errors.Is(err, abi.ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, tenancy.ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, tenancy.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, tenancy.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, tenancy.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, names.ErrUnknownProgram), errors.Is(err, names.ErrUnknownObject),
		errors.Is(err, vm.ErrMethodNotFound), errors.Is(err, vm.ErrNoHandler):
		return http.StatusNotFound
	case errors.Is(err, vm.ErrInvalidModule):
		return http.StatusBadRequest
	case errors.Is(err, abi.ErrTooLarge), errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &re):
		return http.StatusForbidden
	case errors.As(err, &ge):
		return http.StatusUnprocessableEntity
	case errors.Is(err, vm.ErrBudget), errors.Is(err, vm.ErrInitBudget):
		return http.StatusGatewayTimeout
	case errors.As(err, &te):
		return http.StatusInternalServerError
	case errors.Is(err, abi.ErrUnavailable), errors.Is(err, cluster.ErrObjectUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Message is the message a client sees for err, here or forwarded;
// budget is the handler budget a call ran past.
func Message(err error, budget time.Duration) string {
	if errors.Is(err, vm.ErrBudget) {
		return fmt.Sprintf("%v (%s); the call was cancelled and rolled back", err, budget)
	}
	var ge *vm.GuestError
	if errors.As(err, &ge) {
		return "method failed: " + ge.Message
	}
	return err.Error()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func (s *server) fail(w http.ResponseWriter, err error) {
	st := Status(err)
	if st == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="host"`)
	}
	writeJSON(w, st, map[string]string{"error": Message(err, s.cfg.Budget)})
}

// failAs is fail for a principal: its own names appear as it wrote them,
// without its tenant's prefix.
func (s *server) failAs(w http.ResponseWriter, p tenancy.Principal, err error) {
	if p.Tenant == "" {
		s.fail(w, err)
		return
	}
	writeJSON(w, Status(err), map[string]string{"error": p.Strip(Message(err, s.cfg.Budget))})
}
