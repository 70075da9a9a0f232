package host

import (
	"sync"
	"sync/atomic"
)

// syncGate is an object's output gate under --sync full: its calls commit
// without an fsync, and what they make visible outside (replies, stream
// reads, deliveries to followers) waits for an fsync of the object's
// write-ahead log that began after the commit. The fsync runs on a
// goroutine of the gate's own, so the object runs its next batch while the
// last one is made durable, and one fsync covers every commit made before
// it began: the output gate of Cloudflare's Durable Objects, for one
// SQLite file.
//
// The gate's own state is under mu.
type syncGate struct {
	mu sync.Mutex
	// sync makes every commit so far durable: the open file's SyncLog
	// (set by reset, under the object's lock, when the file opens; nil
	// while it is closed, after a flush).
	sync func() error
	// pending runs, in order, once every commit made before it was
	// added is durable.
	pending []func(error)
	// dirty: a commit was made since the last fsync began.
	dirty bool
	// running: the syncer goroutine runs (it ends when nothing is
	// pending).
	running bool

	// committing is set from just before a commit to just after the
	// commit's head is recorded; head is the log's last seq as of the
	// last commit, synced the last seq made durable. A reader whose
	// snapshot began before it checks them leaves out what is not
	// durable (cap).
	committing atomic.Bool
	head       atomic.Uint64
	synced     atomic.Uint64
}

// reset starts the gate on a file just opened and made durable, whose log
// ends at head, synced by sync; or, with sync nil, on a file closed after
// a flush.
func (g *syncGate) reset(sync func() error, head uint64) {
	g.mu.Lock()
	g.sync = sync
	g.mu.Unlock()
	g.head.Store(head)
	g.synced.Store(head)
}

// beginCommit is called before a commit: readers cap from here on.
func (g *syncGate) beginCommit() { g.committing.Store(true) }

// endCommit records a commit's outcome: when ok, the log's head after it
// (0 when it appended nothing), and whether it is durable already (it
// fsynced in SQLite's commit, which syncs the whole log: every commit
// before it too) or owes an fsync.
func (g *syncGate) endCommit(ok bool, head uint64, durable bool) {
	if ok {
		storeMax(&g.head, head)
		if durable {
			storeMax(&g.synced, head)
		} else {
			g.mu.Lock()
			g.dirty = true
			g.mu.Unlock()
		}
	}
	g.committing.Store(false)
}

// storeMax raises a to v unless it is past it.
func storeMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// cap is the last seq a reader may see, and whether there is a cap: the
// reader's snapshot must have begun before cap is called. Every commit
// that snapshot holds began before, so it is either still committing or
// its head is recorded: either way past synced until an fsync covers it.
func (g *syncGate) cap() (uint64, bool) {
	synced := g.synced.Load()
	if g.committing.Load() || g.head.Load() > synced {
		return synced, true
	}
	return 0, false
}

// after runs release once every commit made before this call is durable:
// at once when none waits for an fsync, else after one, in the order after
// was called. A failed fsync is release's error, and the next one is tried
// again. When after reports true, no syncer runs and the caller must start
// one: run on a goroutine of its own, or a round on its own first.
func (g *syncGate) after(release func(error)) (start bool) {
	g.mu.Lock()
	if g.idleLocked() {
		g.mu.Unlock()
		release(nil)
		return false
	}
	g.pending = append(g.pending, release)
	if g.running {
		g.mu.Unlock()
		return false
	}
	g.running = true
	g.mu.Unlock()
	return true
}

// idle reports whether no commit waits for an fsync and no syncer runs.
func (g *syncGate) idle() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.idleLocked()
}

func (g *syncGate) idleLocked() bool { return !g.dirty && !g.running }

// flush waits until every commit made before it is durable.
func (g *syncGate) flush() error {
	done := make(chan error, 1)
	if g.after(func(err error) { done <- err }) {
		go g.run()
	}
	return <-done
}

// run is the syncer: rounds until nothing is pending.
func (g *syncGate) run() {
	for g.round() {
	}
}

// round is one of the syncer's rounds: it takes what is pending (the
// syncer starts, and goes on, only when something is), fsyncs if a commit
// was made since the last fsync began, and releases what it took. It
// reports whether more is pending (the syncer goes on: the caller runs
// another round, or run); if not, the syncer has stopped.
func (g *syncGate) round() bool {
	g.mu.Lock()
	take := g.pending
	g.pending = nil
	need := g.dirty && g.sync != nil
	sync := g.sync
	g.dirty = false
	head := g.head.Load()
	g.mu.Unlock()
	var err error
	if need {
		if err = sync(); err != nil {
			g.mu.Lock()
			g.dirty = true
			g.mu.Unlock()
		} else {
			storeMax(&g.synced, head)
		}
	}
	for _, release := range take {
		release(err)
	}
	g.mu.Lock()
	more := len(g.pending) > 0
	if !more {
		g.running = false
	}
	g.mu.Unlock()
	return more
}
