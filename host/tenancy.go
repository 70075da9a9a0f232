package host

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/durable-host/host/host/internal/tenancy"
)

// The node's side of tenancy (package tenancy owns tokens, namespaces,
// limits and usage): the names an embedder uses, and a principal's names
// resolved under the node's naming rules.

// Limits bounds what one tenant may use; package tenancy documents each
// field and where it is enforced.
type Limits = tenancy.Limits

// LimitError is a request refused by a limit (413 for sizes, 429 for
// counts and rates).
type LimitError = tenancy.LimitError

// Tenant is one tenant as the API shows it.
type Tenant = tenancy.Tenant

// DefaultTenantLimits are the documented defaults.
func DefaultTenantLimits() Limits { return tenancy.DefaultLimits() }

// ValidateTenantName reports whether name can name a tenant.
func ValidateTenantName(name string) error { return tenancy.ValidateName(name) }

// usageScanEvery is how often a node recounts its tenants' object files.
const usageScanEvery = 5 * time.Second

// principal is who a request acts for.
type principal = tenancy.Principal

// resolveProgram resolves a program name p wrote, for p's own use. Another
// tenant's name is "unknown": it reveals nothing.
func resolveProgram(p principal, name string) (string, error) {
	q, ok := p.Program(name)
	if !ok {
		return "", unknownProgram(name)
	}
	if err := ValidateQualifiedProgram(name); err != nil {
		return "", err
	}
	return q, nil
}

// resolveObject resolves PROGRAM/ID parts p wrote, for p's own use.
func resolveObject(p principal, program, id string) (ObjectID, error) {
	q, err := resolveProgram(p, program)
	if err != nil {
		return ObjectID{}, err
	}
	o := ObjectID{q, id}
	return o, ValidateObjectID(id)
}

// followTarget resolves the PROGRAM/ID p asks to follow: its own (a plain
// name) or any tenant's (TENANT.PROGRAM/ID), for the publisher's follow
// hook to decide.
func followTarget(p principal, s string) (ObjectID, error) {
	o, err := ParseObjectID(s)
	if err != nil {
		return o, err
	}
	o.Program = p.FollowTarget(o.Program)
	return o, nil
}

// showObject is how p sees an object's name: its own without the prefix.
func showObject(p principal, o ObjectID) string {
	return p.Show(o.Program) + "/" + o.ID
}

// scanUsage recounts every tenant's object files and bytes under dataDir;
// the node runs it at start and every usageScanEvery.
func scanUsage(dataDir string, u *tenancy.Usage) {
	if u == nil {
		return
	}
	root := filepath.Join(dataDir, "objects")
	dirs, err := os.ReadDir(root)
	if err != nil {
		return
	}
	type tally struct{ objects, bytes int64 }
	per := map[string]*tally{}
	for _, d := range dirs {
		t := tenancy.TenantOf(d.Name())
		if t == "" || !d.IsDir() {
			continue
		}
		if per[t] == nil {
			per[t] = &tally{}
		}
		files, _ := os.ReadDir(filepath.Join(root, d.Name()))
		for _, f := range files {
			info, err := f.Info()
			if err != nil {
				continue
			}
			per[t].bytes += info.Size()
			if strings.HasSuffix(f.Name(), ".db") {
				per[t].objects++
			}
		}
	}
	for t, c := range per {
		u.Recount(t, c.objects, c.bytes)
	}
}
