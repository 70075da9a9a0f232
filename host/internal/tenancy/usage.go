package tenancy

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Usage holds the Use of every tenant seen on this node. A node without
// tenancy has none: a nil *Usage, whose Of is nil, and a nil *Use limits
// nothing.
type Usage struct {
	defaults Limits
	own      func(tenant string) (Limits, bool)

	mu sync.Mutex // guards m
	m  map[string]*Use
}

// NewUsage counts against defaults, overridden field by field by what own
// returns for a tenant (the Registry's Limits).
func NewUsage(defaults Limits, own func(tenant string) (Limits, bool)) *Usage {
	return &Usage{defaults: defaults, own: own, m: map[string]*Use{}}
}

// Use is what one tenant uses on this node, with the limits in force.
//
// A change of the tenant's limits makes a new record with a new rate
// limiter and handler slots, but the counts are one set per tenant, shared
// by every record: what was counted against the old record (an open
// connection, say) is given back to the same counter.
type Use struct {
	tenant string
	lim    Limits
	*counts
	pub *rate.Limiter
	sem chan struct{}
}

// counts is what a tenant has open or stored on this node.
type counts struct {
	conns   atomic.Int64
	objects atomic.Int64 // object files on this node
	bytes   atomic.Int64 // their size, refreshed by Recount
}

// Counts is what a tenant has open or stored on this node, as the API
// shows it (in this order).
type Counts struct {
	Bytes       int64 `json:"bytes"`       // its object files' size at the last recount
	Connections int64 `json:"connections"` // open WebSocket connections and streams
	Objects     int64 `json:"objects"`     // object files
}

// Of returns the use record of tenant, current with its limits; nil for
// the operator ("") and without tenancy.
func (u *Usage) Of(tenant string) *Use {
	if u == nil || tenant == "" {
		return nil
	}
	lim := u.defaults
	if own, ok := u.own(tenant); ok {
		lim = own.Over(lim)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	tu := u.m[tenant]
	if tu != nil && tu.lim == lim {
		return tu
	}
	nu := &Use{tenant: tenant, lim: lim, counts: &counts{},
		pub: rate.NewLimiter(rate.Limit(lim.PublishRate), lim.PublishBurst),
		sem: make(chan struct{}, lim.Concurrency)}
	if tu != nil {
		nu.counts = tu.counts
	}
	u.m[tenant] = nu
	return nu
}

// Recount sets tenant's object files and their bytes on this node to a
// fresh count; the node recounts its files at start and every few seconds.
func (u *Usage) Recount(tenant string, objects, bytes int64) {
	tu := u.Of(tenant)
	if tu == nil {
		return
	}
	tu.objects.Store(objects)
	tu.bytes.Store(bytes)
}

// Tenant names the tenant.
func (tu *Use) Tenant() string { return tu.tenant }

// Limits are the tenant's limits in force: its own over the node's.
func (tu *Use) Limits() Limits { return tu.lim }

// Counts reads what the tenant has open or stored on this node.
func (tu *Use) Counts() Counts {
	return Counts{Bytes: tu.bytes.Load(), Connections: tu.conns.Load(), Objects: tu.objects.Load()}
}

// MemoryPages bounds one of the tenant's instances; 0 (the node's own
// bound) without tenancy.
func (tu *Use) MemoryPages() uint32 {
	if tu == nil {
		return 0
	}
	return tu.lim.MemoryPages
}

// Acquire takes one of the tenant's handler slots, waiting for one, and
// returns its release. A call chain that already holds one of this
// tenant's slots (a handler's follow runs the publisher's hook on its
// behalf) takes no second one: with the limit at one slot it would wait
// for itself until its budget ran out.
func (tu *Use) Acquire(ctx context.Context) (release func(), err error) {
	if tu == nil || ctx.Value(slotKey{tu.tenant}) != nil {
		return func() {}, nil
	}
	select {
	case tu.sem <- struct{}{}:
		return func() { <-tu.sem }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for one of tenant %s's %d handler slots: %v", ErrUnavailable, tu.tenant, tu.lim.Concurrency, ctx.Err())
	}
}

// slotKey marks a context whose call chain holds one of tenant's handler
// slots.
type slotKey struct{ tenant string }

// HoldingSlot marks ctx as holding one of tenant's handler slots: Acquire
// under it takes none.
func HoldingSlot(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, slotKey{tenant}, true)
}

// OpenConn counts one more WebSocket connection or stream against the
// tenant's limit; release gives it back.
func (tu *Use) OpenConn() (release func(), err error) {
	if tu == nil {
		return func() {}, nil
	}
	if c := tu.conns.Add(1); c > int64(tu.lim.Connections) {
		tu.conns.Add(-1)
		return nil, CountLimit("connections", int64(tu.lim.Connections), c, "open connections and streams on this node")
	}
	return func() { tu.conns.Add(-1) }, nil
}

// NewObject counts one more object file, refused while the tenant is at
// its storage (a new file is new bytes) or at its object count; undo gives
// the count back when the file was not made after all.
func (tu *Use) NewObject() (undo func(), err error) {
	if tu == nil {
		return func() {}, nil
	}
	if b := tu.bytes.Load(); b >= tu.lim.TenantBytes {
		return nil, SizeLimit("tenant storage", tu.lim.TenantBytes, b+1)
	}
	if c := tu.objects.Add(1); c > int64(tu.lim.Objects) {
		tu.objects.Add(-1)
		return nil, CountLimit("objects", int64(tu.lim.Objects), c, "objects on this node")
	}
	return func() { tu.objects.Add(-1) }, nil
}

// Frozen reports whether the tenant's files on this node are at its
// storage limit: they may not grow until a recount finds room.
func (tu *Use) Frozen() bool { return tu.bytes.Load() >= tu.lim.TenantBytes }

// StorageFull names the limit a full object file of size bytes ran into:
// the tenant's storage when its files were frozen, else the object's own.
func (tu *Use) StorageFull(frozen bool, size int64) error {
	if frozen {
		return SizeLimit("tenant storage", tu.lim.TenantBytes, tu.bytes.Load()+1)
	}
	return SizeLimit("object storage", tu.lim.ObjectBytes, size+1)
}

// AllowProgram refuses a new program name past the tenant's limit; names
// are the tenant's programs now.
func (tu *Use) AllowProgram(names []string, name string) error {
	if tu == nil || slices.Contains(names, name) || len(names) < tu.lim.Programs {
		return nil
	}
	return CountLimit("programs", int64(tu.lim.Programs), int64(len(names)+1), "programs")
}

// Publish takes n events from the tenant's publish rate.
func (tu *Use) Publish(n int) error {
	if tu == nil || n == 0 {
		return nil
	}
	if !tu.pub.AllowN(time.Now(), n) {
		return &LimitError{What: "publish rate", Limit: int64(tu.lim.PublishRate), Want: int64(n),
			Unit: fmt.Sprintf("events/s (bursts of %d); this call published", tu.lim.PublishBurst), Status: http.StatusTooManyRequests}
	}
	return nil
}
