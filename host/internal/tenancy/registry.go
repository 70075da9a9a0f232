package tenancy

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
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/host/cluster"
)

// With tenancy on, every request presents a bearer token. A tenant's token
// names the tenant; the operator's token (DATA/admin.token) manages
// tenants. Tenants and the hashes of their tokens live in the cluster's
// JetStream KV bucket host_tenants, so every node answers for every tenant;
// a token itself is never stored.

const tenantsBucket = "host_tenants"

// Token prefixes: "ht_" + tenant + "_" + secret for tenants, "ho_" + secret
// for the operator.
const (
	tenantTokenPrefix   = "ht_"
	operatorTokenPrefix = "ho_"
)

// Tenant is one tenant as the API shows it. Its token hash never leaves
// the node.
type Tenant struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Rotated time.Time `json:"rotated,omitzero"`
	Revoked bool      `json:"revoked,omitempty"`
	// Limits overrides the node's defaults where a field is set.
	Limits Limits `json:"limits,omitzero"`

	// TokenHash is the sha256 of the tenant's token, as stored in the
	// bucket; the Registry hands out no tenant with it set.
	TokenHash string `json:"token_hash,omitempty"`
}

func (t Tenant) public() Tenant {
	t.TokenHash = ""
	return t
}

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

// Registry is the node's view of the tenants bucket, kept current by
// Watch; a token that names a tenant the view does not know yet is looked
// up in the bucket directly.
type Registry struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu        sync.RWMutex
	byName    map[string]Tenant
	operators map[string]bool // token hashes
}

// OpenRegistry creates (or finds) the tenants bucket, with replicas
// copies, and reads it.
func OpenRegistry(ctx context.Context, log *slog.Logger, js jetstream.JetStream, replicas int) (*Registry, error) {
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
	t := &Registry{kv: kv, log: log, byName: map[string]Tenant{}, operators: map[string]bool{}}
	return t, t.load(ctx)
}

func (ts *Registry) load(ctx context.Context) error {
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

func (ts *Registry) apply(key string, value []byte, deleted bool) {
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

// Watch applies the bucket's changes to the view until ctx ends.
func (ts *Registry) Watch(ctx context.Context) {
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

// EnsureOperator makes sure dataDir/admin.token exists (mode 0600) and
// that its hash is an operator token of the cluster. It returns the file's
// path and reports whether it wrote a new file.
func (ts *Registry) EnsureOperator(ctx context.Context, dataDir string) (string, bool, error) {
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

// Authenticate maps a bearer token to its principal, or fails with
// ErrUnauthorized.
func (ts *Registry) Authenticate(ctx context.Context, tok string) (Principal, error) {
	if tok == "" {
		return Principal{}, fmt.Errorf("%w: this node needs a token: --token or HOST_TOKEN for the CLI, Authorization: Bearer for HTTP, ?access_token= for a browser WebSocket", ErrUnauthorized)
	}
	h := hashToken(tok)
	bad := fmt.Errorf("%w: the token is not valid (revoked, rotated, or never issued)", ErrUnauthorized)
	if strings.HasPrefix(tok, operatorTokenPrefix) {
		ts.mu.RLock()
		ok := ts.operators[h]
		ts.mu.RUnlock()
		if !ok {
			return Principal{}, bad
		}
		return Principal{Operator: true}, nil
	}
	rest, ok := strings.CutPrefix(tok, tenantTokenPrefix)
	if !ok {
		return Principal{}, bad
	}
	i := strings.LastIndexByte(rest, '_')
	if i <= 0 {
		return Principal{}, bad
	}
	name := rest[:i]
	if ValidateName(name) != nil {
		return Principal{}, bad
	}
	ts.mu.RLock()
	t, known := ts.byName[name]
	ts.mu.RUnlock()
	if !known {
		// Created on another node a moment ago: read it once.
		e, err := ts.kv.Get(ctx, "t."+name)
		if err != nil {
			return Principal{}, bad
		}
		ts.apply(e.Key(), e.Value(), false)
		ts.mu.RLock()
		t, known = ts.byName[name]
		ts.mu.RUnlock()
		if !known {
			return Principal{}, bad
		}
	}
	if t.Revoked || subtle.ConstantTimeCompare([]byte(h), []byte(t.TokenHash)) != 1 {
		return Principal{}, bad
	}
	return Principal{Tenant: name}, nil
}

// Get returns a tenant from the view.
func (ts *Registry) Get(name string) (Tenant, bool) {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	t, ok := ts.byName[name]
	return t.public(), ok
}

// Limits returns a tenant's own limits, which override the node's defaults
// where a field is set.
func (ts *Registry) Limits(name string) (Limits, bool) {
	t, ok := ts.Get(name)
	return t.Limits, ok
}

// List returns every tenant, by name.
func (ts *Registry) List() []Tenant {
	ts.mu.RLock()
	out := make([]Tenant, 0, len(ts.byName))
	for _, t := range ts.byName {
		out = append(out, t.public())
	}
	ts.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Create makes a tenant and returns its token, shown once.
func (ts *Registry) Create(ctx context.Context, name string, lim Limits) (Tenant, string, error) {
	if err := ValidateName(name); err != nil {
		return Tenant{}, "", err
	}
	if err := lim.Validate(); err != nil {
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
func (ts *Registry) update(ctx context.Context, name string, f func(*Tenant)) (Tenant, error) {
	if err := ValidateName(name); err != nil {
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

// Rotate issues a new token; the old one stops working at once on every
// node that has seen the change (the watch carries it in milliseconds).
func (ts *Registry) Rotate(ctx context.Context, name string) (Tenant, string, error) {
	tok := tenantTokenPrefix + name + "_" + newSecret()
	t, err := ts.update(ctx, name, func(t *Tenant) {
		t.TokenHash, t.Revoked, t.Rotated = hashToken(tok), false, time.Now().UTC()
	})
	return t.public(), tok, err
}

// Revoke disables the tenant's token. Its programs and objects stay;
// Rotate issues a new token.
func (ts *Registry) Revoke(ctx context.Context, name string) (Tenant, error) {
	t, err := ts.update(ctx, name, func(t *Tenant) { t.Revoked, t.TokenHash = true, "" })
	return t.public(), err
}

// SetLimits replaces a tenant's limit overrides.
func (ts *Registry) SetLimits(ctx context.Context, name string, lim Limits) (Tenant, error) {
	if err := lim.Validate(); err != nil {
		return Tenant{}, err
	}
	t, err := ts.update(ctx, name, func(t *Tenant) { t.Limits = lim })
	return t.public(), err
}
