// Package tenancy is who may do what on a node with --auth, and how much:
// tenants and their tokens (the Registry, over the cluster's host_tenants
// bucket), the namespaces their names live in (Principal, Qualify,
// TenantOf), their limits (Limits, LimitError) and what each uses on this
// node against them (Usage: connection, object and byte counts, the publish
// rate, handler slots).
//
// It does not know objects, programs or HTTP: the node asks it before it
// makes a thing (a file, a socket, a handler run) and tells it what it
// counted on disk. It imports nothing of the node's, so it is tested
// without one.
package tenancy

import (
	"errors"

	"github.com/durable-host/host/abi"
)

// Errors callers branch on. ErrBadRequest and ErrUnavailable are abi's, the
// set every part of the host shares; the node's ErrNotFound and
// ErrConflict are these values, since only tenants are found by name or
// made under a unique one.
var (
	// ErrUnauthorized: no token, or a token nobody holds.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: a valid token that may not do this.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: no tenant of that name.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a tenant of that name exists.
	ErrConflict = errors.New("conflict")

	ErrBadRequest  = abi.ErrBadRequest
	ErrUnavailable = abi.ErrUnavailable
)

// errTenantExists says which conflict it was.
var errTenantExists = errors.New("tenant exists")

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
