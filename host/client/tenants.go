package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// The operator's tenant routes, on a node started with --auth; they need
// the operator token. Each decodes the node's JSON reply into v, as Get
// does.

// CreateTenant creates tenant name, with limits (a JSON object over the
// node's defaults) when they are set, and replies with its token, shown
// once: POST /v1/tenants.
func (c *Client) CreateTenant(ctx context.Context, name string, limits json.RawMessage, v any) error {
	body := map[string]any{"name": name}
	if limits != nil {
		body["limits"] = limits
	}
	return c.sendJSON(ctx, http.MethodPost, "/v1/tenants", body, v)
}

// Tenants lists the tenants and the node's default limits: GET /v1/tenants.
func (c *Client) Tenants(ctx context.Context, v any) error {
	return c.Get(ctx, "/v1/tenants", v)
}

// Tenant shows tenant name, its limits and its use on this node:
// GET /v1/tenants/NAME.
func (c *Client) Tenant(ctx context.Context, name string, v any) error {
	return c.Get(ctx, tenantPath(name), v)
}

// RotateTenant issues tenant name a new token; the old one stops working:
// POST /v1/tenants/NAME/rotate.
func (c *Client) RotateTenant(ctx context.Context, name string, v any) error {
	return c.sendJSON(ctx, http.MethodPost, tenantPath(name)+"/rotate", nil, v)
}

// RevokeTenant disables tenant name's token; its programs and objects stay:
// POST /v1/tenants/NAME/revoke.
func (c *Client) RevokeTenant(ctx context.Context, name string, v any) error {
	return c.sendJSON(ctx, http.MethodPost, tenantPath(name)+"/revoke", nil, v)
}

// SetTenantLimits replaces tenant name's limits (a JSON object over the
// node's defaults; {} resets them): PUT /v1/tenants/NAME/limits.
func (c *Client) SetTenantLimits(ctx context.Context, name string, limits json.RawMessage, v any) error {
	return c.sendJSON(ctx, http.MethodPut, tenantPath(name)+"/limits", limits, v)
}

func tenantPath(name string) string { return "/v1/tenants/" + url.PathEscape(name) }

// sendJSON sends body, JSON-encoded unless nil, and decodes the reply into v.
func (c *Client) sendJSON(ctx context.Context, method, path string, body, v any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	out, _, err := c.do(ctx, method, path, b)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}
