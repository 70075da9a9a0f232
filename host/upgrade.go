package host

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm"
)

// Hot update. A program's newest version is known on every node from the
// registry's watch (and at once on the node that took the upload or the
// rollback). An active object checks, under its lock and before each
// call, whether it runs the newest version, and moves onto it there: a
// call in flight finishes on the code it started on, the next one runs
// the new code, and nothing else about the object changes (its file, its
// edges, its sockets' subscriptions). The upgrader does the same ahead of
// calls for every object of the program active on this node, so that an
// object nobody calls does not keep the old code and its instance: it
// drops them, and its next call takes a new instance of the new version
// from the engine's pool, as an activation does.

// announceWait bounds how long an upload or a rollback waits for the other
// live nodes to take up the new version; one that does not answer in time
// learns it from the registry's watch.
const announceWait = 10 * time.Second

// announce tells every other live node that pr is now the newest version
// of its program, and returns when each has taken it up (or announceWait
// passed): once an upload answers, every node shapes events with the new
// version and moves its objects onto it at their next call.
func (n *Node) announce(ctx context.Context, pr client.Program) {
	ctx, cancel := context.WithTimeout(ctx, announceWait)
	defer cancel()
	var wg sync.WaitGroup
	for _, node := range n.cluster.Nodes() {
		if node.ID == n.id {
			continue
		}
		wg.Go(func() {
			if _, err := opNewVersion.on(ctx, n, node.ID, pr); err != nil {
				n.log.Warn("a node did not take up the new version at once; it will from the registry", slog.String("node", node.ID),
					slog.String("program", pr.Name), slog.Int("version", pr.Version), slog.Any("err", err))
			}
		})
	}
	wg.Wait()
}

// opNewVersion makes a program's new version the newest on the node asked.
var opNewVersion = nodeOp("new_version", announceWait, (*Node).newVersionLocal)

func (n *Node) newVersionLocal(ctx context.Context, pr client.Program) (struct{}, error) {
	// Where the program runs (active objects, or sockets whose frames it
	// shapes) the new version is fetched and compiled before it is the
	// newest: the next event shaped, or the next call, waits for neither.
	// Elsewhere the first use fetches it, as for any program.
	var m *vm.Module
	if n.objects.anyOf(pr.Name) || n.shaper.shapes(pr.Name) {
		var err error
		if m, err = n.programs.load(ctx, pr.Digest, nil); err != nil {
			return struct{}{}, err
		}
	}
	n.programs.setNewest(pr, m)
	return struct{}{}, nil
}

// upgrades are the programs whose objects active here are to be moved onto
// a new version.
type upgrades struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
}

// programChanged queues name's active objects for the upgrader.
func (n *Node) programChanged(name string) {
	u := &n.upgrades
	u.mu.Lock()
	if u.pending == nil {
		u.pending = map[string]bool{}
	}
	u.pending[name] = true
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// runUpgrades moves queued programs' active objects until ctx is done.
func (n *Node) runUpgrades(ctx context.Context) {
	u := &n.upgrades
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.wake:
		}
		u.mu.Lock()
		names := u.pending
		u.pending = nil
		u.mu.Unlock()
		for name := range names {
			n.upgradeActive(ctx, name)
		}
	}
}

// upgradeActive moves every object of program active here onto its newest
// version, one object at a time, each between two of its calls.
func (n *Node) upgradeActive(ctx context.Context, program string) {
	start := time.Now()
	// Compiled once, before any object's lock is taken.
	if err := n.programs.warm(ctx, program); err != nil {
		n.log.Warn("new version not compiled; objects move onto it at their next call", slog.String("program", program), slog.Any("err", err))
		return
	}
	objs := n.objects.pin(program)
	defer n.objects.unpin(objs)
	moved := 0
	for _, o := range objs {
		if err := o.lock(ctx); err != nil {
			return
		}
		cur, ok := n.programs.current(program)
		if ok && !o.closed && o.module != nil && o.prog.Version < cur.Version {
			// The old instance goes now; the next call takes a new one
			// (made ahead by the engine's pool), as an activation does.
			if err := o.upgrade(ctx, cur); err != nil {
				n.log.Warn("object not moved onto the new version; it moves at its next call", slog.String("object", o.id.String()), slog.Any("err", err))
			} else {
				moved++
			}
		}
		o.unlock()
	}
	if moved > 0 {
		cur, _ := n.programs.current(program)
		n.log.Info("active objects moved onto the new version", slog.String("program", program),
			slog.Int("version", cur.Version), slog.Int("objects", moved), slog.Duration("took", time.Since(start)))
	}
}

// pin returns the objects of program active now, each with a reference
// that keeps it in the registry until unpin (and leaves its last use as
// it was: moving an idle object does not keep it active).
func (r *objects) pin(program string) []*object {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*object
	for id, o := range r.active {
		if id.Program == program {
			o.refs++
			out = append(out, o)
		}
	}
	return out
}

func (r *objects) unpin(objs []*object) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range objs {
		o.refs--
	}
}

// anyOf reports whether an object of program is active here.
func (r *objects) anyOf(program string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.active {
		if id.Program == program {
			return true
		}
	}
	return false
}

// shapes reports whether sockets here have had frames shaped by program.
func (s *shaper) shapes(program string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pools[program] != nil
}
