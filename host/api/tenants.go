package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
)

// errTenancyOff answers tenant routes on a node without --auth.
var errTenancyOff = fmt.Errorf("%w: tenancy is off on this node; start it with --auth", tenancy.ErrNotFound)

// tenantAdmin guards the routes that manage tenants: the operator's, on a
// node with tenancy.
func (s *server) tenantAdmin(h authedHandler) http.HandlerFunc {
	return s.operatorOnly(func(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
		if s.cfg.Tenants == nil {
			s.fail(w, errTenancyOff)
			return
		}
		h(w, r, p)
	})
}

func (s *server) handleWhoami(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
	out := map[string]any{"tenant": p.Tenant, "operator": p.Operator, "auth": s.cfg.Tenants != nil, "node": s.b.ID()}
	if tu := s.cfg.Usage.Of(p.Tenant); tu != nil {
		out["limits"] = tu.Limits()
		out["usage"] = tu.Counts()
	}
	writeJSON(w, http.StatusOK, out)
}

// tenantRequest is the body of POST /v1/tenants.
type tenantRequest struct {
	Name   string         `json:"name"`
	Limits tenancy.Limits `json:"limits"`
}

func (s *server) handleCreateTenant(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		s.fail(w, err)
		return
	}
	var req tenantRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.fail(w, fmt.Errorf("%w: want {\"name\":\"acme\",\"limits\":{...}}: %v", abi.ErrBadRequest, err))
		return
	}
	t, tok, err := s.cfg.Tenants.Create(r.Context(), req.Name, req.Limits)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tenant": t, "token": tok,
		"effective_limits": t.Limits.Over(s.cfg.TenantLimits)})
}

func (s *server) handleListTenants(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	writeJSON(w, http.StatusOK, map[string]any{"tenants": s.cfg.Tenants.List(), "default_limits": s.cfg.TenantLimits})
}

func (s *server) handleGetTenant(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	t, ok := s.cfg.Tenants.Get(r.PathValue("name"))
	if !ok {
		s.fail(w, fmt.Errorf("%w: no tenant %q", tenancy.ErrNotFound, names.Clip(r.PathValue("name"))))
		return
	}
	out := map[string]any{"tenant": t, "effective_limits": t.Limits.Over(s.cfg.TenantLimits)}
	if tu := s.cfg.Usage.Of(t.Name); tu != nil {
		out["usage_on_this_node"] = tu.Counts()
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) handleRotateTenant(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	t, tok, err := s.cfg.Tenants.Rotate(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t, "token": tok})
}

func (s *server) handleRevokeTenant(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	t, err := s.cfg.Tenants.Revoke(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t})
}

func (s *server) handleTenantLimits(w http.ResponseWriter, r *http.Request, _ tenancy.Principal) {
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		s.fail(w, err)
		return
	}
	var lim tenancy.Limits
	if err := json.Unmarshal(body, &lim); err != nil {
		s.fail(w, fmt.Errorf("%w: want a limits object: %v", abi.ErrBadRequest, err))
		return
	}
	t, err := s.cfg.Tenants.SetLimits(r.Context(), r.PathValue("name"), lim)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t, "effective_limits": t.Limits.Over(s.cfg.TenantLimits)})
}
