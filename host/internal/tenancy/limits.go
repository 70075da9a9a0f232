package tenancy

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"runtime"
)

// LimitError is a request refused by a limit, a tenant's or one the node
// holds every call to: which limit, its value, and how much the request
// wanted. Sizes are 413, counts and rates 429. Nothing already stored is
// touched: the call that went over rolls back.
type LimitError struct {
	What   string // "module size", "programs", "publish rate", ...
	Limit  int64
	Want   int64 // what the request would have made it (or needed)
	Unit   string
	Status int // the HTTP status the API answers with
}

func (e *LimitError) Error() string {
	unit := e.Unit
	if unit != "" {
		unit = " " + unit
	}
	return fmt.Sprintf("%s limit exceeded: the limit is %d%s, this needs %d%s", e.What, e.Limit, unit, e.Want, unit)
}

// SizeLimit is a size over its limit (413).
func SizeLimit(what string, limit, want int64) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: "bytes", Status: http.StatusRequestEntityTooLarge}
}

// CountLimit is a count or rate over its limit (429).
func CountLimit(what string, limit, want int64, unit string) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: unit, Status: http.StatusTooManyRequests}
}

// Limits bounds what one tenant may use. In a tenant's record a zero field
// means "the node's default" (the node's Config.TenantLimits). Without tenancy no
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

// DefaultLimits are the documented defaults.
func DefaultLimits() Limits {
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

// Validate reports every problem with l at once, as ErrBadRequest.
func (l Limits) Validate() error {
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
