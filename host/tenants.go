package host

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/host/cluster"
)

// Tenancy: with Config.Auth every request presents a bearer token. A
// tenant's token names the tenant; the operator's token (DATA/admin.token)
// manages tenants. Tenants and the hashes of their tokens live in the
// cluster's JetStream KV bucket host_tenants, so every node answers for
// every tenant; a token itself is never stored.
//
// A tenant's programs are stored under qualified names, TENANT.PROGRAM, so
// objects, files, edges and events of two tenants never share a name. A
// tenant writes plain names and sees its own without the prefix; a
// qualified name of another tenant is only accepted as the target of a
// follow, which the publisher's follow hook decides.

const tenantsBucket = "host_tenants"

// Token prefixes: "ht_" + tenant + "_" + secret for tenants, "ho_" + secret
// for the operator.
const (
	tenantTokenPrefix   = "ht_"
	operatorTokenPrefix = "ho_"
)

var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ValidateTenantName reports whether name can name a tenant.
func ValidateTenantName(name string) error {
	if !tenantName.MatchString(name) {
		return fmt.Errorf("%w: tenant name %q must be 1-32 of a-z 0-9 _ - and start with a letter or digit", ErrBadRequest, clip(name))
	}
	return nil
}

// Tenant is one tenant as the API shows it. Its token hash never leaves
// the node.
type Tenant struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Rotated time.Time `json:"rotated,omitzero"`
	Revoked bool      `json:"revoked,omitempty"`
	// Limits overrides the node's defaults where a field is set.
	Limits Limits `json:"limits,omitzero"`

	TokenHash string `json:"token_hash,omitempty"`
}

func (t Tenant) public() Tenant {
	t.TokenHash = ""
	return t
}

// ErrUnauthorized: no token, or a token nobody holds.
var ErrUnauthorized = errors.New("unauthorized")

// ErrForbidden: a valid token that may not do this.
var ErrForbidden = errors.New("forbidden")

// principal is who a request acts for.
type principal struct {
	tenant   string // "" for the operator and without tenancy
	operator bool   // may manage tenants and address any qualified name
}

// local is the principal of every request without tenancy.
var local = principal{operator: true}

func hashToken(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// newSecret is 32 random bytes in hex: no "_", so a tenant token splits
// at its last "_" into the tenant's name and the secret.
func newSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tenants is the node's view of the tenants bucket, kept current by a
// watch; a token that names a tenant the view does not know yet is looked
// up in the bucket directly.
type tenants struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu        sync.RWMutex
	byName    map[string]Tenant
	operators map[string]bool // token hashes
}

func openTenants(ctx context.Context, log *slog.Logger, js jetstream.JetStream, replicas int) (*tenants, error) {
	var kv jetstream.KeyValue
	err := cluster.RetryJS(ctx, log, "tenants", func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: tenantsBucket, Replicas: replicas, Storage: jetstream.FileStorage, History: 1,
			Description: "tenants and the sha256 of their tokens; operator token hashes",
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	t := &tenants{kv: kv, log: log, byName: map[string]Tenant{}, operators: map[string]bool{}}
	return t, t.load(ctx)
}

func (ts *tenants) load(ctx context.Context) error {
	keys, err := ts.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range keys {
		e, err := ts.kv.Get(ctx, k)
		if err != nil {
			continue
		}
		ts.apply(k, e.Value(), false)
	}
	return nil
}

func (ts *tenants) apply(key string, value []byte, deleted bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	switch {
	case strings.HasPrefix(key, "op."):
		if deleted {
			delete(ts.operators, string(value))
		} else {
			ts.operators[string(value)] = true
		}
	case strings.HasPrefix(key, "t."):
		name := strings.TrimPrefix(key, "t.")
		var t Tenant
		if deleted || json.Unmarshal(value, &t) != nil {
			delete(ts.byName, name)
			return
		}
		ts.byName[name] = t
	}
}

func (ts *tenants) watch(ctx context.Context) {
	w, err := ts.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		ts.apply(e.Key(), e.Value(), e.Operation() != jetstream.KeyValuePut)
	}
}

// ensureOperator makes sure DATA/admin.token exists (mode 0600) and that
// its hash is an operator token of the cluster. It reports whether it
// wrote a new file.
func (ts *tenants) ensureOperator(ctx context.Context, dataDir string) (string, bool, error) {
	path := filepath.Join(dataDir, "admin.token")
	b, err := os.ReadFile(path)
	created := false
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		b = []byte(operatorTokenPrefix + newSecret())
		if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
			return path, false, fmt.Errorf("write operator token: %w", err)
		}
		created = true
	default:
		return path, false, fmt.Errorf("read operator token: %w", err)
	}
	h := hashToken(strings.TrimSpace(string(b)))
	if _, err := ts.kv.Put(ctx, "op."+h[:16], []byte(h)); err != nil {
		return path, created, fmt.Errorf("register operator token: %w", err)
	}
	ts.apply("op."+h[:16], []byte(h), false)
	return path, created, nil
}

// authenticate maps a bearer token to its principal.
func (ts *tenants) authenticate(ctx context.Context, tok string) (principal, error) {
	if tok == "" {
		return principal{}, fmt.Errorf("%w: this node needs a token: --token or HOST_TOKEN for the CLI, Authorization: Bearer for HTTP, ?access_token= for a browser WebSocket", ErrUnauthorized)
	}
	h := hashToken(tok)
	bad := fmt.Errorf("%w: the token is not valid (revoked, rotated, or never issued)", ErrUnauthorized)
	if strings.HasPrefix(tok, operatorTokenPrefix) {
		ts.mu.RLock()
		ok := ts.operators[h]
		ts.mu.RUnlock()
		if !ok {
			return principal{}, bad
		}
		return principal{operator: true}, nil
	}
	rest, ok := strings.CutPrefix(tok, tenantTokenPrefix)
	if !ok {
		return principal{}, bad
	}
	i := strings.LastIndexByte(rest, '_')
	if i <= 0 {
		return principal{}, bad
	}
	name := rest[:i]
	if ValidateTenantName(name) != nil {
		return principal{}, bad
	}
	ts.mu.RLock()
	t, known := ts.byName[name]
	ts.mu.RUnlock()
	if !known {
		// Created on another node a moment ago: read it once.
		e, err := ts.kv.Get(ctx, "t."+name)
		if err != nil {
			return principal{}, bad
		}
		ts.apply(e.Key(), e.Value(), false)
		ts.mu.RLock()
		t, known = ts.byName[name]
		ts.mu.RUnlock()
		if !known {
			return principal{}, bad
		}
	}
	if t.Revoked || subtle.ConstantTimeCompare([]byte(h), []byte(t.TokenHash)) != 1 {
		return principal{}, bad
	}
	return principal{tenant: name}, nil
}

// get returns a tenant from the view.
func (ts *tenants) get(name string) (Tenant, bool) {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	t, ok := ts.byName[name]
	return t, ok
}

// list returns every tenant, by name.
func (ts *tenants) list() []Tenant {
	ts.mu.RLock()
	out := make([]Tenant, 0, len(ts.byName))
	for _, t := range ts.byName {
		out = append(out, t.public())
	}
	ts.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

var errTenantExists = errors.New("tenant exists")

// create makes a tenant and returns its token, shown once.
func (ts *tenants) create(ctx context.Context, name string, lim Limits) (Tenant, string, error) {
	if err := ValidateTenantName(name); err != nil {
		return Tenant{}, "", err
	}
	if err := lim.validate(); err != nil {
		return Tenant{}, "", err
	}
	tok := tenantTokenPrefix + name + "_" + newSecret()
	t := Tenant{Name: name, Created: time.Now().UTC(), Limits: lim, TokenHash: hashToken(tok)}
	b, _ := json.Marshal(t)
	if _, err := ts.kv.Create(ctx, "t."+name, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Tenant{}, "", fmt.Errorf("%w: %w: %q; rotate its token with `host tenant rotate %s`", ErrConflict, errTenantExists, name, name)
		}
		return Tenant{}, "", fmt.Errorf("%w: tenants: %v", ErrUnavailable, err)
	}
	ts.apply("t."+name, b, false)
	return t.public(), tok, nil
}

// update changes a tenant with f under optimistic concurrency.
func (ts *tenants) update(ctx context.Context, name string, f func(*Tenant)) (Tenant, error) {
	if err := ValidateTenantName(name); err != nil {
		return Tenant{}, err
	}
	for range 10 {
		e, err := ts.kv.Get(ctx, "t."+name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Tenant{}, fmt.Errorf("%w: no tenant %q", ErrNotFound, name)
		}
		if err != nil {
			return Tenant{}, fmt.Errorf("%w: tenants: %v", ErrUnavailable, err)
		}
		var t Tenant
		if err := json.Unmarshal(e.Value(), &t); err != nil {
			return Tenant{}, err
		}
		f(&t)
		b, _ := json.Marshal(t)
		if _, err := ts.kv.Update(ctx, "t."+name, b, e.Revision()); err != nil {
			continue
		}
		ts.apply("t."+name, b, false)
		return t, nil
	}
	return Tenant{}, fmt.Errorf("%w: tenant %s: concurrent updates", ErrUnavailable, name)
}

// rotate issues a new token; the old one stops working at once on every
// node that has seen the change (the watch carries it in milliseconds).
func (ts *tenants) rotate(ctx context.Context, name string) (Tenant, string, error) {
	tok := tenantTokenPrefix + name + "_" + newSecret()
	t, err := ts.update(ctx, name, func(t *Tenant) {
		t.TokenHash, t.Revoked, t.Rotated = hashToken(tok), false, time.Now().UTC()
	})
	return t.public(), tok, err
}

// revoke disables the tenant's token. Its programs and objects stay;
// rotate issues a new token.
func (ts *tenants) revoke(ctx context.Context, name string) (Tenant, error) {
	t, err := ts.update(ctx, name, func(t *Tenant) { t.Revoked, t.TokenHash = true, "" })
	return t.public(), err
}

// setLimits replaces a tenant's limit overrides.
func (ts *tenants) setLimits(ctx context.Context, name string, lim Limits) (Tenant, error) {
	if err := lim.validate(); err != nil {
		return Tenant{}, err
	}
	t, err := ts.update(ctx, name, func(t *Tenant) { t.Limits = lim })
	return t.public(), err
}

// Names.

// tenantOf returns the tenant of a qualified program name.
func tenantOf(program string) string {
	t, _, ok := strings.Cut(program, ".")
	if !ok {
		return ""
	}
	return t
}

func qualify(tenant, program string) string {
	if tenant == "" {
		return program
	}
	return tenant + "." + program
}

// program resolves a program name a principal wrote. A plain name is in
// the principal's namespace; a qualified one only for the operator. Any
// other tenant's name is "unknown": it reveals nothing.
func (p principal) program(name string) (string, error) {
	if strings.Contains(name, ".") {
		if !p.operator {
			return "", unknownProgram(name)
		}
		return name, ValidateQualifiedProgram(name)
	}
	if err := ValidateProgramName(name); err != nil {
		return "", err
	}
	return qualify(p.tenant, name), nil
}

// object resolves PROGRAM/ID parts the principal wrote, for its own use.
func (p principal) object(program, id string) (ObjectID, error) {
	q, err := p.program(program)
	if err != nil {
		return ObjectID{}, err
	}
	o := ObjectID{q, id}
	return o, ValidateObjectID(id)
}

// followTarget resolves the object a principal asks to follow: its own
// (a plain name) or any tenant's (TENANT.PROGRAM/ID), for the publisher's
// follow hook to decide.
func (p principal) followTarget(s string) (ObjectID, error) {
	o, err := ParseObjectID(s)
	if err != nil {
		return o, err
	}
	if !strings.Contains(o.Program, ".") {
		o.Program = qualify(p.tenant, o.Program)
	}
	return o, nil
}

// show is how the principal sees a qualified name: its own without the
// prefix.
func (p principal) show(program string) string {
	if p.tenant != "" {
		if s, ok := strings.CutPrefix(program, p.tenant+"."); ok {
			return s
		}
	}
	return program
}

func (p principal) showObject(o ObjectID) string {
	return p.show(o.Program) + "/" + o.ID
}

// owns reports whether a qualified program is in the principal's namespace.
func (p principal) owns(program string) bool {
	if p.operator {
		return true
	}
	return tenantOf(program) == p.tenant
}
