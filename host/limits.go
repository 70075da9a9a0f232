package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Per-call caps that hold for every tenant: one call cannot publish a
// storm, however its guest loops.
const (
	// MaxPublishesPerCall bounds the events one handler call may publish.
	MaxPublishesPerCall = 10_000
	// MaxPublishBytesPerCall bounds the payload bytes one handler call may
	// publish, all events together.
	MaxPublishBytesPerCall = 16 << 20
)

// LimitError is a request refused by a limit: which limit, its value, and
// how much the request wanted. Sizes are 413, counts and rates 429.
// Nothing already stored is touched: the call that went over rolls back.
type LimitError struct {
	What   string // "module size", "programs", "publish rate", ...
	Limit  int64
	Want   int64 // what the request would have made it (or needed)
	Unit   string
	Status int
}

func (e *LimitError) Error() string {
	unit := e.Unit
	if unit != "" {
		unit = " " + unit
	}
	return fmt.Sprintf("%s limit exceeded: the limit is %d%s, this needs %d%s", e.What, e.Limit, unit, e.Want, unit)
}

func sizeLimit(what string, limit, want int64) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: "bytes", Status: http.StatusRequestEntityTooLarge}
}

func countLimit(what string, limit, want int64, unit string) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: unit, Status: http.StatusTooManyRequests}
}

// usageScanEvery is how often a node recounts its tenants' object files.
const usageScanEvery = 5 * time.Second

// Limits bounds what one tenant may use. In a tenant's record a zero field
// means "the node's default" (Config.TenantLimits). Without tenancy no
// tenant limit applies (the node's own limits still do).
//
// Where each is enforced: module size and program count at upload; memory
// pages when an instance is made; object bytes by SQLite (max_page_count)
// on every write; tenant bytes, object count, connections, publish rate and
// concurrency by this node for the tenant's objects and sockets on it
// (so with N nodes a tenant can use up to N times the per-node ones).
type Limits struct {
	// ModuleBytes bounds one uploaded module.
	ModuleBytes int64 `json:"module_bytes,omitempty"`
	// Programs bounds the tenant's program names.
	Programs int `json:"programs,omitempty"`
	// MemoryPages bounds one instance's linear memory, in 64 KiB pages; it
	// can only be lower than the node's --memory-pages.
	MemoryPages uint32 `json:"memory_pages,omitempty"`
	// ObjectBytes bounds one object's file.
	ObjectBytes int64 `json:"object_bytes,omitempty"`
	// TenantBytes bounds the tenant's object files on a node.
	TenantBytes int64 `json:"tenant_bytes,omitempty"`
	// Objects bounds the tenant's objects on a node.
	Objects int `json:"objects,omitempty"`
	// Connections bounds the tenant's open WebSocket connections on a node.
	Connections int `json:"connections,omitempty"`
	// PublishRate is the events per second the tenant's objects may publish
	// on a node, with bursts of PublishBurst.
	PublishRate  float64 `json:"publish_rate,omitempty"`
	PublishBurst int     `json:"publish_burst,omitempty"`
	// Concurrency bounds the tenant's handlers running at once on a node,
	// so one tenant's runaway objects cannot take every core.
	Concurrency int `json:"concurrency,omitempty"`
}

// DefaultTenantLimits are the documented defaults.
func DefaultTenantLimits() Limits {
	return Limits{
		ModuleBytes:  16 << 20,
		Programs:     100,
		MemoryPages:  1024, // 64 MiB
		ObjectBytes:  256 << 20,
		TenantBytes:  4 << 30,
		Objects:      100_000,
		Connections:  10_000,
		PublishRate:  1000,
		PublishBurst: 2000,
		Concurrency:  max(1, runtime.GOMAXPROCS(0)/2),
	}
}

func (l Limits) validate() error {
	var errs []error
	if l.ModuleBytes < 0 || l.Programs < 0 || l.ObjectBytes < 0 || l.TenantBytes < 0 || l.Objects < 0 ||
		l.Connections < 0 || l.PublishRate < 0 || l.PublishBurst < 0 || l.Concurrency < 0 {
		errs = append(errs, errors.New("limits cannot be negative"))
	}
	if l.MemoryPages > 65536 {
		errs = append(errs, errors.New("memory pages must be at most 65536"))
	}
	if l.ObjectBytes != 0 && l.ObjectBytes < 64<<10 {
		errs = append(errs, errors.New("object bytes must be at least 65536 (an empty object file is a few pages)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return nil
}

// Over returns l with every zero field taken from d.
func (l Limits) Over(d Limits) Limits {
	pick := func(a, b int64) int64 {
		if a != 0 {
			return a
		}
		return b
	}
	return Limits{
		ModuleBytes:  pick(l.ModuleBytes, d.ModuleBytes),
		Programs:     int(pick(int64(l.Programs), int64(d.Programs))),
		MemoryPages:  uint32(pick(int64(l.MemoryPages), int64(d.MemoryPages))),
		ObjectBytes:  pick(l.ObjectBytes, d.ObjectBytes),
		TenantBytes:  pick(l.TenantBytes, d.TenantBytes),
		Objects:      int(pick(int64(l.Objects), int64(d.Objects))),
		Connections:  int(pick(int64(l.Connections), int64(d.Connections))),
		PublishRate:  cmp.Or(l.PublishRate, d.PublishRate),
		PublishBurst: int(pick(int64(l.PublishBurst), int64(d.PublishBurst))),
		Concurrency:  int(pick(int64(l.Concurrency), int64(d.Concurrency))),
	}
}

// tenantUse is what one tenant uses on this node, with the limits in
// force. Without tenancy there is none.
//
// A change of the tenant's limits makes a new record with a new rate
// limiter and handler slots, but the counts are one set per tenant, shared
// by every record: what was counted against the old record (an open
// connection, say) is given back to the same counter.
type tenantUse struct {
	name string
	lim  Limits
	*tenantCounts
	pub *rate.Limiter
	sem chan struct{}
}

// tenantCounts is what a tenant has open or stored on this node.
type tenantCounts struct {
	conns   atomic.Int64
	objects atomic.Int64 // object files on this node
	bytes   atomic.Int64 // their size, refreshed by the usage scan
}

// usage holds the tenantUse of every tenant seen on this node.
type usage struct {
	n  *Node
	mu sync.Mutex
	m  map[string]*tenantUse
}

// of returns the use record of tenant, current with its limits; nil
// without tenancy.
func (u *usage) of(tenant string) *tenantUse {
	if !u.n.cfg.Auth || tenant == "" {
		return nil
	}
	lim := u.n.cfg.TenantLimits
	if t, ok := u.n.tenants.get(tenant); ok {
		lim = t.Limits.Over(lim)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	tu := u.m[tenant]
	if tu != nil && tu.lim == lim {
		return tu
	}
	nu := &tenantUse{name: tenant, lim: lim, tenantCounts: &tenantCounts{},
		pub: rate.NewLimiter(rate.Limit(lim.PublishRate), lim.PublishBurst),
		sem: make(chan struct{}, lim.Concurrency)}
	if tu != nil {
		nu.tenantCounts = tu.tenantCounts
	}
	u.m[tenant] = nu
	return nu
}

// acquire takes one of the tenant's handler slots, waiting for one, and
// returns its release. A call chain that already holds one of this
// tenant's slots (a handler's follow runs the publisher's hook on its
// behalf) takes no second one: with the limit at one slot it would wait
// for itself until its budget ran out.
func (tu *tenantUse) acquire(ctx context.Context) (release func(), err error) {
	if tu == nil || ctx.Value(slotKey{tu.name}) != nil {
		return func() {}, nil
	}
	select {
	case tu.sem <- struct{}{}:
		return func() { <-tu.sem }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for one of tenant %s's %d handler slots: %v", ErrUnavailable, tu.name, tu.lim.Concurrency, ctx.Err())
	}
}

// slotKey marks a context whose call chain holds one of tenant's handler
// slots.
type slotKey struct{ tenant string }

// holdingSlot marks ctx as holding one of tenant's handler slots.
func holdingSlot(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, slotKey{tenant}, true)
}

// openConn counts one more WebSocket connection or stream against the
// tenant's limit; release gives it back.
func (tu *tenantUse) openConn() (release func(), err error) {
	if tu == nil {
		return func() {}, nil
	}
	if c := tu.conns.Add(1); c > int64(tu.lim.Connections) {
		tu.conns.Add(-1)
		return nil, countLimit("connections", int64(tu.lim.Connections), c, "open connections and streams on this node")
	}
	return func() { tu.conns.Add(-1) }, nil
}

// publish takes n events from the tenant's publish rate.
func (tu *tenantUse) publish(n int) error {
	if tu == nil || n == 0 {
		return nil
	}
	if !tu.pub.AllowN(time.Now(), n) {
		return &LimitError{What: "publish rate", Limit: int64(tu.lim.PublishRate), Want: int64(n),
			Unit: fmt.Sprintf("events/s (bursts of %d); this call published", tu.lim.PublishBurst), Status: http.StatusTooManyRequests}
	}
	return nil
}

// scan recounts every tenant's object files and bytes on this node; the
// node runs it at start and every few seconds.
func (u *usage) scan() {
	if !u.n.cfg.Auth {
		return
	}
	root := filepath.Join(u.n.cfg.DataDir, "objects")
	dirs, err := os.ReadDir(root)
	if err != nil {
		return
	}
	type tally struct{ objects, bytes int64 }
	per := map[string]*tally{}
	for _, d := range dirs {
		t := tenantOf(d.Name())
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
		tu := u.of(t)
		tu.objects.Store(c.objects)
		tu.bytes.Store(c.bytes)
	}
}
