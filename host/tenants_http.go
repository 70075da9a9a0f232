package host

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// errTenancyOff answers tenant routes on a node without --auth.
var errTenancyOff = fmt.Errorf("%w: tenancy is off on this node; start it with --auth", ErrNotFound)

// tenantAdmin guards the routes that manage tenants: the operator's, on a
// node with tenancy.
func (n *Node) tenantAdmin(h authedHandler) http.HandlerFunc {
	return n.operatorOnly(func(w http.ResponseWriter, r *http.Request, p principal) {
		if n.tenants == nil {
			n.fail(w, errTenancyOff)
			return
		}
		h(w, r, p)
	})
}

func (n *Node) handleWhoami(w http.ResponseWriter, r *http.Request, p principal) {
	out := map[string]any{"tenant": p.Tenant, "operator": p.Operator, "auth": n.tenants != nil, "node": n.id}
	if tu := n.usage.Of(p.Tenant); tu != nil {
		out["limits"] = tu.Limits()
		out["usage"] = tu.Counts()
	}
	writeJSON(w, http.StatusOK, out)
}

// tenantRequest is the body of POST /v1/tenants.
type tenantRequest struct {
	Name   string `json:"name"`
	Limits Limits `json:"limits"`
}

func (n *Node) handleCreateTenant(w http.ResponseWriter, r *http.Request, _ principal) {
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		n.fail(w, err)
		return
	}
	var req tenantRequest
	if err := json.Unmarshal(body, &req); err != nil {
		n.fail(w, fmt.Errorf("%w: want {\"name\":\"acme\",\"limits\":{...}}: %v", ErrBadRequest, err))
		return
	}
	t, tok, err := n.tenants.Create(r.Context(), req.Name, req.Limits)
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tenant": t, "token": tok,
		"effective_limits": t.Limits.Over(n.cfg.TenantLimits)})
}

func (n *Node) handleListTenants(w http.ResponseWriter, r *http.Request, _ principal) {
	writeJSON(w, http.StatusOK, map[string]any{"tenants": n.tenants.List(), "default_limits": n.cfg.TenantLimits})
}

func (n *Node) handleGetTenant(w http.ResponseWriter, r *http.Request, _ principal) {
	t, ok := n.tenants.Get(r.PathValue("name"))
	if !ok {
		n.fail(w, fmt.Errorf("%w: no tenant %q", ErrNotFound, clip(r.PathValue("name"))))
		return
	}
	out := map[string]any{"tenant": t, "effective_limits": t.Limits.Over(n.cfg.TenantLimits)}
	if tu := n.usage.Of(t.Name); tu != nil {
		out["usage_on_this_node"] = tu.Counts()
	}
	writeJSON(w, http.StatusOK, out)
}

func (n *Node) handleRotateTenant(w http.ResponseWriter, r *http.Request, _ principal) {
	t, tok, err := n.tenants.Rotate(r.Context(), r.PathValue("name"))
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t, "token": tok})
}

func (n *Node) handleRevokeTenant(w http.ResponseWriter, r *http.Request, _ principal) {
	t, err := n.tenants.Revoke(r.Context(), r.PathValue("name"))
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t})
}

func (n *Node) handleTenantLimits(w http.ResponseWriter, r *http.Request, _ principal) {
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		n.fail(w, err)
		return
	}
	var lim Limits
	if err := json.Unmarshal(body, &lim); err != nil {
		n.fail(w, fmt.Errorf("%w: want a limits object: %v", ErrBadRequest, err))
		return
	}
	t, err := n.tenants.SetLimits(r.Context(), r.PathValue("name"), lim)
	if err != nil {
		n.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": t, "effective_limits": t.Limits.Over(n.cfg.TenantLimits)})
}
