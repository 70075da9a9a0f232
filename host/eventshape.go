package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/vm"
)

// shapeIdle bounds the idle instances a program's shaping pool keeps.
const shapeIdle = 4

// errStateless fails an event handler that reaches for the object's state:
// the handler runs where the socket is, which is not the object's home.
var errStateless = errors.New("an event handler runs on the socket's node, without the object's state, log or edges: shape the frame from the event alone")

// shaper runs programs' event exports on the node holding the sockets, in
// instances of the program that have no object behind them: state, publish
// and follow fail the handler. An object therefore has one home and one
// file whatever node its watchers attach to, and a node runs an event
// export once per event and attached object for all its sockets there
// (delivery.Item.Shape), not once per socket. Each event is shaped by the
// program's newest version.
type shaper struct {
	programs *programs
	engine   *vm.Engine
	usage    *tenancy.Usage // nil without tenancy
	metrics  *metrics
	log      *slog.Logger

	// mu guards pools, by program name.
	mu    sync.Mutex
	pools map[string]*shapePool
}

// shapePool is one program version's idle instances.
type shapePool struct {
	digest string
	module *vm.Module
	// mu guards idle and stale.
	mu    sync.Mutex
	idle  []*vm.Instance
	stale bool // replaced by a newer version: instances are closed on return
}

func newShaper(p *programs, e *vm.Engine, u *tenancy.Usage, m *metrics, log *slog.Logger) *shaper {
	return &shaper{programs: p, engine: e, usage: u, metrics: m, log: log, pools: map[string]*shapePool{}}
}

// frame returns what the sockets attached to id get for it: the frame the
// program's event export makes of it, shaped once per node.
func (s *shaper) frame(ctx context.Context, id ObjectID, it *delivery.Item) ([]byte, error) {
	pr, err := s.programs.latest(ctx, id.Program)
	if err != nil {
		return nil, err
	}
	return it.Shape(pr.Digest+" "+id.String(), func() ([]byte, error) {
		return s.run(ctx, pr, id, &it.Event)
	})
}

func (s *shaper) run(ctx context.Context, pr client.Program, id ObjectID, ev *abi.Event) ([]byte, error) {
	pool, err := s.pool(ctx, pr)
	if err != nil {
		return nil, err
	}
	tu := s.usage.Of(tenancy.TenantOf(id.Program))
	release, err := tu.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	inst, err := s.take(ctx, pool, tu)
	if err != nil {
		return nil, err
	}
	s.metrics.eventCalls.Inc()
	frame, err := inst.Event(statelessHost{self: id.String(), log: s.log}, ev)
	s.put(pool, inst)
	return frame, err
}

// pool returns the pool of pr's version, replacing an older version's.
func (s *shaper) pool(ctx context.Context, pr client.Program) (*shapePool, error) {
	s.mu.Lock()
	p := s.pools[pr.Name]
	s.mu.Unlock()
	if p != nil && p.digest == pr.Digest {
		return p, nil
	}
	m, err := s.programs.module(ctx, pr.Digest, nil)
	if err != nil {
		return nil, err
	}
	np := &shapePool{digest: pr.Digest, module: m}
	s.mu.Lock()
	old := s.pools[pr.Name]
	if old != nil && old.digest == pr.Digest {
		s.mu.Unlock()
		m.Close(ctx) // another caller made it first
		return old, nil
	}
	s.pools[pr.Name] = np
	s.mu.Unlock()
	if old != nil {
		old.retire()
	}
	return np, nil
}

func (s *shaper) take(ctx context.Context, p *shapePool, tu *tenancy.Use) (*vm.Instance, error) {
	p.mu.Lock()
	if k := len(p.idle); k > 0 {
		inst := p.idle[k-1]
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		return inst, nil
	}
	p.mu.Unlock()
	return s.engine.InstantiateLimited(ctx, p.module, tu.MemoryPages())
}

// put returns an instance to its pool, or closes it: broken, stale, or
// past the idle bound.
func (s *shaper) put(p *shapePool, inst *vm.Instance) {
	p.mu.Lock()
	if !inst.Broken() && !p.stale && len(p.idle) < shapeIdle {
		p.idle = append(p.idle, inst)
		inst = nil
	}
	p.mu.Unlock()
	if inst != nil {
		inst.Close(context.Background())
	}
}

// retire closes a replaced version's idle instances and gives back its
// module; instances still running close when they are put back.
func (p *shapePool) retire() {
	p.mu.Lock()
	p.stale = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, inst := range idle {
		inst.Close(context.Background())
	}
	p.module.Close(context.Background())
}

func (s *shaper) close() {
	s.mu.Lock()
	pools := s.pools
	s.pools = map[string]*shapePool{}
	s.mu.Unlock()
	for _, p := range pools {
		p.retire()
	}
}

// statelessHost is the vm.Host of an event handler: no state, no log, no
// edges. Reaching for them fails the handler with errStateless.
type statelessHost struct {
	self string
	log  *slog.Logger
}

var _ vm.Host = statelessHost{}

func stateless(what string) error { return fmt.Errorf("%s: %w", what, errStateless) }

func (statelessHost) Get(context.Context, []byte) ([]byte, bool, error) {
	return nil, false, stateless("state get")
}
func (statelessHost) Put(context.Context, []byte, []byte) error { return stateless("state put") }
func (statelessHost) Delete(context.Context, []byte) error      { return stateless("state delete") }
func (statelessHost) Scan(context.Context, []byte, int) ([]abi.Pair, error) {
	return nil, stateless("state scan")
}
func (statelessHost) Publish(context.Context, string, []byte) error {
	return stateless("publish")
}
func (statelessHost) Follow(context.Context, abi.FollowRequest) error { return stateless("follow") }
func (statelessHost) Unfollow(context.Context, abi.FollowRequest) error {
	return stateless("unfollow")
}
func (statelessHost) SetAlarm(context.Context, time.Time) error { return stateless("alarm set") }
func (statelessHost) Alarm(context.Context) (time.Time, bool, error) {
	return time.Time{}, false, stateless("alarm get")
}
func (statelessHost) DeleteAlarm(context.Context) error { return stateless("alarm delete") }
func (statelessHost) Now() time.Time                    { return time.Now() }
func (statelessHost) Deadline() time.Time               { return time.Time{} }
func (statelessHost) Call(context.Context, abi.CallRequest) ([]byte, error) {
	return nil, stateless("object call")
}
func (h statelessHost) Self() string                { return h.self }
func (h statelessHost) Log(level int32, msg string) { guestLog(h.log, h.self, level, msg) }
