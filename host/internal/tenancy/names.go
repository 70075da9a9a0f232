package tenancy

import (
	"fmt"
	"regexp"
	"strings"
)

// A tenant's programs are stored under qualified names, TENANT.PROGRAM, so
// objects, files, edges and events of two tenants never share a name. A
// tenant writes plain names and sees its own without the prefix; a
// qualified name of another tenant is only accepted as the target of a
// follow, which the publisher's follow hook decides.

var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ValidateName reports whether name can name a tenant.
func ValidateName(name string) error {
	if !tenantName.MatchString(name) {
		return fmt.Errorf("%w: tenant name %q must be 1-32 of a-z 0-9 _ - and start with a letter or digit", ErrBadRequest, clip(name))
	}
	return nil
}

// TenantOf returns the tenant of a qualified program name, "" for a plain
// one.
func TenantOf(program string) string {
	t, _, ok := strings.Cut(program, ".")
	if !ok {
		return ""
	}
	return t
}

// Qualify returns program's name in tenant's namespace; without a tenant
// it is the name itself.
func Qualify(tenant, program string) string {
	if tenant == "" {
		return program
	}
	return tenant + "." + program
}

// Principal is who a request acts for.
type Principal struct {
	Tenant   string // "" for the operator and without tenancy
	Operator bool   // may manage tenants and address any qualified name
}

// Local is the principal of every request without tenancy.
var Local = Principal{Operator: true}

// Program returns the qualified name of a program name p wrote, for p's
// own use: a plain name is in p's namespace, a qualified one is only the
// operator's to write. ok is false for a qualified name from a tenant,
// which the caller answers as an unknown program: it reveals nothing.
// The name's syntax is the caller's to check.
func (p Principal) Program(name string) (qualified string, ok bool) {
	if strings.Contains(name, ".") {
		return name, p.Operator
	}
	return Qualify(p.Tenant, name), true
}

// FollowTarget returns the qualified program of a publisher p asks to
// follow: its own for a plain name, any tenant's for a qualified one, for
// the publisher's follow hook to decide.
func (p Principal) FollowTarget(program string) string {
	if strings.Contains(program, ".") {
		return program
	}
	return Qualify(p.Tenant, program)
}

// Show is how p sees a qualified name: its own without the prefix.
func (p Principal) Show(program string) string {
	if p.Tenant != "" {
		if s, ok := strings.CutPrefix(program, p.Tenant+"."); ok {
			return s
		}
	}
	return program
}

// Owns reports whether a qualified program is in p's namespace; the
// operator's holds every name.
func (p Principal) Owns(program string) bool {
	return p.Operator || TenantOf(program) == p.Tenant
}

// Strip removes p's own tenant prefix from the quoted or spaced names in
// msg, so an error names them as p wrote them.
func (p Principal) Strip(msg string) string {
	if p.Tenant == "" {
		return msg
	}
	return strings.NewReplacer(`"`+p.Tenant+".", `"`, " "+p.Tenant+".", " ").Replace(msg)
}
