package host

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/durable-host/host/host/internal/tenancy"
)

// The node's side of tenancy (package tenancy owns tokens, namespaces,
// limits and usage; package names resolves a principal's names): the names
// an embedder uses.

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
