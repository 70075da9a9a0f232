package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
)

// What every request goes through before its handler: its principal, the
// names its route holds, its body's limit.

// readBody reads at most limit bytes of the request body.
func readBody(w http.ResponseWriter, r *http.Request, limit int) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("%w: body is over the limit of %d bytes", abi.ErrTooLarge, limit)
	}
	return b, err
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

type authedHandler func(w http.ResponseWriter, r *http.Request, p tenancy.Principal)

// authed runs h for the request's principal: the local one without
// tenancy, else the token's, or fails with 401.
func (s *server) authed(h authedHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Tenants == nil {
			h(w, r, tenancy.Local)
			return
		}
		p, err := s.cfg.Tenants.Authenticate(r.Context(), bearer(r))
		if err != nil {
			s.fail(w, err)
			return
		}
		h(w, r, p)
	}
}

type programHandler func(w http.ResponseWriter, r *http.Request, p tenancy.Principal, qname string)

// program runs h for the program a /v1/programs/{name} route names,
// qualified for p, or fails.
func (s *server) program(h programHandler) authedHandler {
	return func(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
		qname, err := names.ResolveProgram(p, r.PathValue("name"))
		if err != nil {
			s.failAs(w, p, err)
			return
		}
		h(w, r, p, qname)
	}
}

type objectHandler func(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object)

// object runs h for the object a /v1/objects/{program}/{id}/… route names,
// resolved for p, or fails.
func (s *server) object(h objectHandler) authedHandler {
	return func(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
		id, err := names.ResolveObject(p, r.PathValue("program"), r.PathValue("id"))
		if err != nil {
			s.failAs(w, p, err)
			return
		}
		h(w, r, p, id)
	}
}

// openConn counts one more long-lived request of p's (a socket or a
// stream) against its tenant's connection limit until release, or fails.
func (s *server) openConn(w http.ResponseWriter, p tenancy.Principal) (release func(), ok bool) {
	release, err := s.cfg.Usage.Of(p.Tenant).OpenConn()
	if err != nil {
		s.failAs(w, p, err)
		return nil, false
	}
	return release, true
}

// operatorOnly is authed for the operator's token; tenants get 403.
func (s *server) operatorOnly(h authedHandler) http.HandlerFunc {
	return s.authed(func(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
		if !p.Operator {
			s.fail(w, fmt.Errorf("%w: this needs the operator token (DATA/admin.token)", tenancy.ErrForbidden))
			return
		}
		h(w, r, p)
	})
}
