package host

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// ObjectID names an object: a program and an id within it.
type ObjectID = names.Object

// ParseObjectID parses "program/id".
func ParseObjectID(s string) (ObjectID, error) { return names.Parse(s) }

// object is one active object: its file, its instance, and the lock that
// lets one handler run at a time.
type object struct {
	id  ObjectID
	env *objectEnv

	// sem is the object's lock, a channel so waiting respects contexts:
	// one handler (or the pump) at a time. Everything below is guarded by
	// it.
	sem    chan struct{}
	file   *store.File
	prog   client.Program
	module *vm.Module
	// running is prog's version, read without the lock (inspection).
	running atomic.Int64
	inst    *vm.Instance
	closed  bool
	calls   int64
	lastErr error
	// capped is the byte cap set on the file (0: none); frozen when the
	// tenant is over its storage and the file may not grow.
	capped int64
	frozen bool

	pump pumpState

	// methodTimes is each method's recent handler time here (guarded by
	// the object's lock): a slow method does not join a batch.
	methodTimes map[string]time.Duration
	// callsOut holds the methods seen calling another object here
	// (guarded by the object's lock): they run in batches of their own.
	callsOut map[string]bool
	// solo: a batch met the file's storage limit, so this object runs its
	// calls one per transaction, where the call that does not fit is the
	// one that fails, until its limit changes (guarded by the object's
	// lock).
	solo bool
	// recorded counts the calls recorded with an idempotency key since
	// activation (guarded by the object's lock), for pruning.
	recorded int

	// qmu guards queue: the calls waiting for a batch, in arrival order.
	qmu   sync.Mutex
	queue []*pendingCall

	// gate is the output gate under --sync full (nil otherwise), made
	// with the object and kept for its life: readers outside its lock
	// ask it what is durable. gating is set (under the lock) while a
	// batch of calls runs: its commits owe the streams' hint and the
	// pump's kick (owedHint, owedKick) to the batch's release; deferSync
	// when, besides, they commit without an fsync and leave it to the
	// gate (a lone call on an idle gate fsyncs in its commit instead).
	gate               *syncGate
	gating, deferSync  bool
	owedHint, owedKick bool
	// syncInline: the caller that holds the lock starts the gate's
	// syncer with a round of its own once it lets go (runBatch).
	syncInline bool

	// Guarded by objects.mu.
	refs     int
	lastUsed time.Time
	elem     *list.Element
}

func (o *object) lock(ctx context.Context) error {
	select {
	case o.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", o.id, ctx.Err())
	}
}

func (o *object) unlock() { <-o.sem }

// objectEnv is what every active object uses of its node, one for all of
// them.
type objectEnv struct {
	dataDir string // the files are under dataDir/objects
	// openFile opens the file at path for the object's home: directly, or
	// brought up to its change stream's end where copies are on.
	openFile func(ctx context.Context, id ObjectID, path string) (*store.File, error)
	programs *programs
	engine   *vm.Engine
	usage    *tenancy.Usage // nil without tenancy
	metrics  *metrics
	log      *slog.Logger
	// After a handler's transaction that published commits: the streams'
	// hint, and a pump round when the file may have edges.
	hint, kick func(ObjectID)
	// follows runs the follows a handler asks for.
	follows follows
	// maxBatch bounds the calls one commit covers; no further call starts
	// in a batch that has run for batchTime.
	maxBatch  int
	batchTime time.Duration
	// batchedCall: a method slower than this here (or never seen) starts
	// a batch of its own.
	batchedCall time.Duration
	// now is the clock handlers and alarms see.
	now func() time.Time
	// alarmFileChanged schedules the alarm a home's file holds (after a
	// commit that wrote it, and when the file opens); alarmRetry looks at
	// an object's alarm again at a time.
	alarmFileChanged func(ObjectID, *store.File)
	alarmRetry       func(ObjectID, time.Time)
	// call runs an object's call of another object on its home: the
	// node's call.
	call func(ctx context.Context, id ObjectID, req callRequest) ([]byte, error)
	// budget is the handler budget, for error messages.
	budget time.Duration
	// gated: files open with SyncNormal and each object's output gate
	// makes its commits durable (--sync full with group commit).
	gated bool
	// syncHook, when set (by tests), runs before each of the gates'
	// fsyncs.
	syncHook atomic.Pointer[func()]
	// callRecordAge and callRecords bound the recorded calls of an
	// object.
	callRecordAge time.Duration
	callRecords   int
}

// follows makes and undoes a follower's edges at the publisher's home,
// wherever that is: the node's Follow and Unfollow.
type follows interface {
	Follow(ctx context.Context, publisher ObjectID, req abi.FollowRequest) (store.Edge, error)
	Unfollow(ctx context.Context, publisher ObjectID, kind abi.FollowerKind, follower, topic string) (bool, error)
}

// objects is the registry of active objects, bounded by an LRU: at most
// maxActive, and none idle for longer than idle.
type objects struct {
	env       *objectEnv
	maxActive int
	idle      time.Duration

	// mu guards active, lru and each object's refs, lastUsed and elem. It is
	// never held while waiting for an object's lock.
	mu     sync.Mutex
	active map[ObjectID]*object
	lru    *list.List // front = most recently used
	closed bool
}

func newObjects(env *objectEnv, maxActive int, idle time.Duration) *objects {
	return &objects{env: env, maxActive: maxActive, idle: idle, active: map[ObjectID]*object{}, lru: list.New()}
}

// acquire returns the active object for id (making it active if needed) with
// a reference the caller must release.
func (r *objects) acquire(id ObjectID) (*object, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrShuttingDown
	}
	o, ok := r.active[id]
	if !ok {
		o = &object{id: id, env: r.env, sem: make(chan struct{}, 1)}
		if r.env.gated {
			o.gate = &syncGate{}
		}
		r.active[id] = o
		o.elem = r.lru.PushFront(o)
	} else {
		r.lru.MoveToFront(o.elem)
	}
	o.refs++
	o.lastUsed = time.Now()
	victims := r.overLimit()
	r.mu.Unlock()
	r.deactivate(victims)
	return o, nil
}

func (r *objects) release(o *object) {
	r.mu.Lock()
	o.refs--
	o.lastUsed = time.Now()
	r.mu.Unlock()
}

// overLimit removes idle objects past the active bound from the registry and
// returns them for closing. Called with mu held.
func (r *objects) overLimit() []*object {
	var out []*object
	for e := r.lru.Back(); e != nil && len(r.active) > r.maxActive; {
		o := e.Value.(*object)
		prev := e.Prev()
		if o.refs == 0 {
			r.remove(o)
			out = append(out, o)
		}
		e = prev
	}
	return out
}

func (r *objects) remove(o *object) {
	delete(r.active, o.id)
	r.lru.Remove(o.elem)
}

// deactivate closes objects already removed from the registry, waiting for a
// handler or pump that still holds one.
func (r *objects) deactivate(os []*object) {
	for _, o := range os {
		o.sem <- struct{}{}
		o.close()
		<-o.sem
	}
}

// reapIdle deactivates objects unused for longer than the idle timeout.
func (r *objects) reapIdle(now time.Time) int {
	r.mu.Lock()
	var idle []*object
	for e := r.lru.Back(); e != nil; {
		o := e.Value.(*object)
		prev := e.Prev()
		if o.refs == 0 && now.Sub(o.lastUsed) >= r.idle {
			r.remove(o)
			idle = append(idle, o)
		}
		e = prev
	}
	r.mu.Unlock()
	r.deactivate(idle)
	return len(idle)
}

// evict deactivates id if it is active (its file is closed once the
// handler holding it is done).
func (r *objects) evict(id ObjectID) {
	r.mu.Lock()
	o, ok := r.active[id]
	if ok {
		r.remove(o)
	}
	r.mu.Unlock()
	if ok {
		r.deactivate([]*object{o})
	}
}

// closeAll deactivates everything and refuses new activations.
func (r *objects) closeAll() {
	r.mu.Lock()
	r.closed = true
	var all []*object
	for _, o := range r.active {
		all = append(all, o)
	}
	r.active = map[ObjectID]*object{}
	r.lru.Init()
	r.mu.Unlock()
	r.deactivate(all)
}

// activeIDs lists the active objects.
func (r *objects) activeIDs() []ObjectID {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ObjectID, 0, len(r.active))
	for id := range r.active {
		out = append(out, id)
	}
	return out
}

// durableCap is the output gate's cap on reads of id's log (see
// syncGate.cap): none unless id is active here under a gate with commits
// not yet durable. A reader asks once its snapshot is taken; an object not
// active then made what it committed durable as it closed.
func (r *objects) durableCap(id ObjectID) (uint64, bool) {
	r.mu.Lock()
	o := r.active[id]
	r.mu.Unlock()
	if o == nil || o.gate == nil {
		return 0, false
	}
	return o.gate.cap()
}

// isActive reports whether id is active here (so this node is its home).
func (r *objects) isActive(id ObjectID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.active[id]
	return ok
}

func (r *objects) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.active)
}

// close releases the instance and the file. Called with the object locked.
func (o *object) close() {
	o.closed = true
	o.dropInstance()
	if o.module != nil {
		o.module.Close(context.Background())
		o.module = nil
		o.running.Store(0)
	}
	if o.file != nil {
		if o.gate != nil {
			// What committed is durable before the file goes: the last
			// replies are released.
			if err := o.gate.flush(); err != nil {
				o.env.log.Error("object file not made durable as it closed", slog.String("object", o.id.String()), slog.Any("err", err))
			}
			o.gate.reset(nil, 0)
		}
		o.file.Close()
		o.file = nil
	}
}

func (o *object) dropInstance() {
	if o.inst != nil {
		o.inst.Close(context.Background())
		o.inst = nil
	}
}

// readyFile opens the object's file if needed. Called locked.
func (o *object) readyFile(ctx context.Context) error {
	open, err := o.fileOpener()
	if err != nil || open == nil {
		return err
	}
	return open(ctx)
}

// fileOpener checks what opening the object's file needs (a new file is
// refused while its tenant is at a limit) and returns the opening itself,
// or nil when the file is open.
func (o *object) fileOpener() (func(context.Context) error, error) {
	if o.closed {
		return nil, errDeactivated
	}
	if o.file != nil {
		return nil, nil
	}
	path := objectFile(o.env.dataDir, o.id)
	tu := o.env.usage.Of(tenancy.TenantOf(o.id.Program))
	undo := func() {}
	if tu != nil {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if undo, err = tu.NewObject(); err != nil {
				return nil, err
			}
		}
	}
	return func(ctx context.Context) error {
		f, err := o.env.openFile(ctx, o.id, path)
		if err != nil {
			undo()
			return err
		}
		if o.gate != nil {
			// What the file holds is durable before the gate starts on it
			// (a process that crashed may have left commits unsynced).
			head, err := f.Head()
			if err == nil {
				err = f.SyncLog()
			}
			if err != nil {
				f.Close()
				undo()
				return err
			}
			env := o.env
			o.gate.reset(func() error {
				if h := env.syncHook.Load(); h != nil {
					(*h)()
				}
				return f.SyncLog()
			}, head)
		}
		o.file, o.capped, o.frozen = f, 0, false
		// A home's file may hold an alarm set before a restart or on the
		// home this one took the object over from.
		o.env.alarmFileChanged(o.id, f)
		return nil
	}, nil
}

// capStorage keeps the file within the tenant's limits before a handler
// runs: capped at ObjectBytes, and frozen at its size while the tenant is
// over TenantBytes on this node. Called locked.
func (o *object) capStorage(tu *tenancy.Use) error {
	if tu == nil {
		return nil
	}
	frozen, capped := tu.Frozen(), tu.Limits().ObjectBytes
	if o.capped == capped && o.frozen == frozen {
		return nil
	}
	limit := capped
	if frozen {
		limit = 1 // max_page_count never goes below the pages in use
	}
	if err := o.file.Limit(limit); err != nil {
		return err
	}
	o.capped, o.frozen = capped, frozen
	o.solo = false
	return nil
}

// storageFull names the limit a full object file ran into.
func (o *object) storageFull(tu *tenancy.Use) error {
	if tu == nil {
		return fmt.Errorf("%w: object storage: the disk is full", ErrUnavailable)
	}
	size, _ := o.file.Size()
	return tu.StorageFull(o.frozen, size)
}

// ready opens the file and makes the instance if needed. Called locked.
func (o *object) ready(ctx context.Context) (err error) {
	open, err := o.fileOpener()
	if err != nil {
		return err
	}
	if open != nil {
		// A cold activation opens (often creates) the SQLite file while the
		// instance starts: about 3 ms and 8 ms of mostly separate work.
		// The limits were checked above, so a refused object costs no VM.
		done := make(chan error, 1)
		go func() { done <- open(ctx) }()
		defer func() {
			if ferr := <-done; err == nil {
				err = ferr
			}
		}()
	}
	env := o.env
	if o.module != nil {
		// A new version became current since this object's last call:
		// this call, at a call boundary, runs it (the call before
		// finished on the old one).
		if cur, ok := env.programs.current(o.id.Program); ok && cur.Version > o.prog.Version {
			if err := o.upgrade(ctx, cur); err != nil {
				// The old version still runs this call; the next tries
				// again.
				env.log.Warn("object not moved onto its program's new version", slog.String("object", o.id.String()), slog.Int("version", cur.Version), slog.Any("err", err))
			}
		}
	}
	if o.module == nil {
		pr, err := env.programs.latestFresh(ctx, o.id.Program)
		if err != nil {
			return err
		}
		m, err := env.programs.module(ctx, pr.Digest, nil)
		if err != nil {
			return err
		}
		o.setProgram(pr, m)
	}
	if o.inst == nil {
		pages := env.usage.Of(tenancy.TenantOf(o.id.Program)).MemoryPages()
		inst, _, err := env.engine.InstantiatePooled(ctx, o.module, pages, env.programs.isNewest(o.prog))
		if err != nil {
			return err
		}
		o.inst = inst
	}
	return nil
}

// upgrade moves the object onto version pr of its program: the same
// module under a new version number (a rollback to code it runs) costs
// nothing; other code replaces the instance, and the next handler runs
// on a new one. Called locked, between calls.
func (o *object) upgrade(ctx context.Context, pr client.Program) error {
	if pr.Digest == o.prog.Digest {
		o.prog = pr
		o.running.Store(int64(pr.Version))
		return nil
	}
	m, err := o.env.programs.module(ctx, pr.Digest, nil)
	if err != nil {
		return err
	}
	o.dropInstance()
	o.module.Close(context.Background())
	o.setProgram(pr, m)
	return nil
}

func (o *object) setProgram(pr client.Program, m *vm.Module) {
	o.prog, o.module = pr, m
	o.running.Store(int64(pr.Version))
}

var errDeactivated = errors.New("object was deactivated")

// handle runs one handler of the object's program as one transaction:
// run gets the call's host (its transaction); a broken instance is dropped;
// then the transaction commits (kicking the pump if it published) or rolls
// back with the error. Called locked.
func (o *object) handle(ctx context.Context, run func(h *objectHost) error) error {
	tu := o.env.usage.Of(tenancy.TenantOf(o.id.Program))
	// One of the tenant's handler slots: a tenant's runaway objects wait
	// for each other, not for the node.
	release, err := tu.Acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	tx, err := o.begin(ctx, tu)
	if err != nil {
		return err
	}
	if err := o.runHandler(ctx, tx, tu, run); err != nil {
		tx.Rollback()
		return o.storageErr(tu, err)
	}
	return o.commit(tx, tu)
}

// begin readies the object and starts its transaction. Called locked,
// holding one of the tenant's handler slots.
func (o *object) begin(ctx context.Context, tu *tenancy.Use) (*store.Tx, error) {
	if err := o.ready(ctx); err != nil {
		return nil, err
	}
	if err := o.capStorage(tu); err != nil {
		return nil, err
	}
	return o.beginTx()
}

// runHandler runs one handler in tx and returns what failed it: the
// guest's error, or the platform's (storage, a per-call cap, the tenant's
// publish rate), which wins whatever the guest made of it. A broken
// instance is dropped (the next handler makes a new one). The caller rolls
// back on an error.
func (o *object) runHandler(ctx context.Context, tx *store.Tx, tu *tenancy.Use, run func(h *objectHost) error) error {
	before := tx.Published()
	h := &objectHost{o: o, tx: tx, ctx: ctx}
	err := run(h)
	if o.inst.Broken() {
		o.dropInstance()
	}
	if h.calledOut && h.method != "" {
		if o.callsOut == nil {
			o.callsOut = map[string]bool{}
		}
		if len(o.callsOut) < maxTimedMethods {
			o.callsOut[h.method] = true
		}
	}
	if h.err != nil {
		err = h.err
	}
	if err == nil {
		err = tu.Publish(tx.Published() - before)
	}
	return err
}

// commit commits tx (shipping its change set first when copies are on)
// and, if it published, tells the streams and kicks the pump. Under the
// output gate, a batch's commit made without an fsync (deferSync) leaves
// the fsync to the gate, and a batch's commit owes its hint and kick to
// the batch's release (runBatch); any other commit fsyncs in SQLite's
// commit, as without the gate.
func (o *object) commit(tx *store.Tx, tu *tenancy.Use) error {
	g := o.gate
	if g != nil {
		g.beginCommit()
	}
	err := tx.Commit()
	if g != nil {
		g.endCommit(err == nil, tx.LastSeq(), !o.deferSync)
	}
	if err != nil {
		return o.storageErr(tu, err)
	}
	if tx.AlarmChanged() {
		o.env.alarmFileChanged(o.id, o.file)
	}
	if tx.Published() > 0 {
		if o.gating {
			o.owedHint = true
			o.owedKick = o.owedKick || o.file.MayHaveEdges()
			return nil
		}
		o.env.hint(o.id)
		if o.file.MayHaveEdges() {
			o.env.kick(o.id)
		}
	}
	return nil
}

// beginTx starts a transaction on the object's file. Under the output gate
// it sets how the commit syncs first (SQLite allows no change inside a
// transaction): without an fsync when deferSync (the gate makes it
// durable), else in the commit itself.
func (o *object) beginTx() (*store.Tx, error) {
	if o.gate != nil {
		mode := store.SyncFull
		if o.deferSync {
			mode = store.SyncNormal
		}
		if err := o.file.SetSync(mode); err != nil {
			return nil, err
		}
	}
	return o.file.Begin()
}

// between runs f in a transaction of the object's own (not a handler's:
// the pump's, an alarm's record of a failed run) and commits it. Called locked, with the file open.
func (o *object) between(f func(*store.Tx) error) error {
	if o.gate != nil {
		// The pump reads the log here: only what is durable.
		if err := o.gate.flush(); err != nil {
			return err
		}
	}
	tx, err := o.beginTx()
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	return o.commit(tx, o.env.usage.Of(tenancy.TenantOf(o.id.Program)))
}

// storageErr names the limit behind a full file; other errors are as is.
func (o *object) storageErr(tu *tenancy.Use, err error) error {
	if store.IsFull(err) {
		return o.storageFull(tu)
	}
	return err
}

// call runs one method as one transaction. Called locked.
func (o *object) call(ctx context.Context, req *callRequest) ([]byte, error) {
	var reply []byte
	err := o.handle(ctx, func(h *objectHost) error {
		var err error
		reply, err = o.callOnce(h, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	o.calls++
	return reply, nil
}

// objectExists reports whether the object has a file on this node.
func (n *Node) objectExists(id ObjectID) bool {
	_, err := os.Stat(n.objectPath(id))
	return err == nil
}

func (n *Node) objectPath(id ObjectID) string { return objectFile(n.cfg.DataDir, id) }

// objectFiles lists the objects whose files are under root, laid out as
// root/PROGRAM/ID.db (a node's objects, or the copies it keeps).
func objectFiles(root string) []ObjectID {
	var out []ObjectID
	progs, _ := os.ReadDir(root)
	for _, p := range progs {
		files, _ := os.ReadDir(filepath.Join(root, p.Name()))
		for _, f := range files {
			if name, ok := strings.CutSuffix(f.Name(), ".db"); ok {
				if id := (ObjectID{Program: p.Name(), ID: name}); id.Validate() == nil {
					out = append(out, id)
				}
			}
		}
	}
	return out
}

// objectFile is where id's file lives in the data directory dataDir.
func objectFile(dataDir string, id ObjectID) string {
	return filepath.Join(dataDir, "objects", id.Program, id.ID+".db")
}

// objectHost is the vm.Host of one handler call: the object's transaction.
type objectHost struct {
	o   *object
	tx  *store.Tx
	err error // a failure the guest cannot see (storage), fails the call
	// ctx is the handler's call's: its chain when an object called, and
	// the deadline that comes with it.
	ctx context.Context
	// method is the running method ("" for other handlers); event and
	// topic the event a receive handler runs for, which keys its calls.
	method string
	event  *abi.Event
	topic  string
	// calls counts the object calls the handler made; calledOut is set
	// by the first.
	calls     int
	calledOut bool

	published, publishedBytes int64
	// alarmWritten: the handler set or deleted the alarm.
	alarmWritten bool
}

var _ vm.Host = (*objectHost)(nil)

func (h *objectHost) fail(err error) error {
	if err != nil && h.err == nil {
		h.err = err
	}
	return err
}

func (h *objectHost) Get(_ context.Context, k []byte) ([]byte, bool, error) {
	v, ok, err := h.tx.Get(k)
	return v, ok, h.fail(err)
}

func (h *objectHost) Put(_ context.Context, k, v []byte) error {
	return h.fail(h.tx.Put(k, v))
}

func (h *objectHost) Delete(_ context.Context, k []byte) error {
	return h.fail(h.tx.Delete(k))
}

func (h *objectHost) Scan(_ context.Context, prefix []byte, limit int) ([]abi.Pair, error) {
	p, err := h.tx.Scan(prefix, limit)
	return p, h.fail(err)
}

// Per-call caps that hold for every tenant, and without tenancy: one call
// cannot publish a storm, however its guest loops.
const (
	// MaxPublishesPerCall bounds the events one handler call may publish.
	MaxPublishesPerCall = 10_000
	// MaxPublishBytesPerCall bounds the payload bytes one handler call may
	// publish, all events together.
	MaxPublishBytesPerCall = 16 << 20
)

// Publish appends an event in the call's transaction. Past the per-call
// caps the whole call fails and rolls back, whatever the guest does with
// the error: a publish storm commits nothing.
func (h *objectHost) Publish(_ context.Context, topic string, payload []byte) error {
	h.published++
	h.publishedBytes += int64(len(payload))
	if h.published > MaxPublishesPerCall {
		return h.fail(tenancy.CountLimit("events published by one call", MaxPublishesPerCall, h.published, "events"))
	}
	if h.publishedBytes > MaxPublishBytesPerCall {
		return h.fail(tenancy.SizeLimit("bytes published by one call", MaxPublishBytesPerCall, h.publishedBytes))
	}
	_, err := h.tx.Append(topic, payload, time.Now())
	return h.fail(err)
}

// Follow makes this object a durable follower. The publisher's hook runs
// now, while this handler waits (bounded by followLockWait for the
// publisher's lock). The edge is committed by the publisher even if this
// handler later fails: the follower then receives events it did not expect,
// which at-least-once delivery allows.
// A plain PROGRAM/ID is in this object's tenant; TENANT.PROGRAM/ID names
// another tenant's object, whose follow hook decides.
func (h *objectHost) Follow(ctx context.Context, req abi.FollowRequest) error {
	who := principal{Tenant: tenancy.TenantOf(h.o.id.Program)}
	pub, err := names.FollowTarget(who, req.Publisher)
	if err != nil {
		return fmt.Errorf("%w: %v", abi.ErrBadRequest, err)
	}
	req.Kind = abi.FollowerObject
	req.Follower = h.o.id.String()
	req.Tenant = who.Tenant
	// This handler holds one of its tenant's slots; a hook it waits for
	// runs on that slot.
	_, err = h.o.env.follows.Follow(tenancy.HoldingSlot(ctx, who.Tenant), pub, req)
	return guestFollowErr(err)
}

func (h *objectHost) Unfollow(ctx context.Context, req abi.FollowRequest) error {
	pub, err := names.FollowTarget(principal{Tenant: tenancy.TenantOf(h.o.id.Program)}, req.Publisher)
	if err != nil {
		return fmt.Errorf("%w: %v", abi.ErrBadRequest, err)
	}
	_, err = h.o.env.follows.Unfollow(ctx, pub, abi.FollowerObject, h.o.id.String(), req.Topic)
	return guestFollowErr(err)
}

// guestFollowErr turns follow failures into statuses the guest sees.
func guestFollowErr(err error) error {
	var re *vm.RefusedError
	switch {
	case err == nil, errors.As(err, &re):
		return err
	case errors.Is(err, ErrBadRequest), errors.Is(err, ErrUnknownProgram), errors.Is(err, ErrUnknownObject):
		return fmt.Errorf("%w: %v", abi.ErrBadRequest, err)
	}
	return fmt.Errorf("%w: %v", abi.ErrUnavailable, err)
}

func (h *objectHost) Self() string { return h.o.id.String() }

func (h *objectHost) Now() time.Time { return h.o.env.now() }

func (h *objectHost) Log(level int32, msg string) {
	guestLog(h.o.env.log, h.o.id.String(), level, msg)
}

// guestLog writes a guest's log line at its level.
func guestLog(log *slog.Logger, object string, level int32, msg string) {
	lv := slog.LevelInfo
	switch level {
	case abi.LogDebug:
		lv = slog.LevelDebug
	case abi.LogWarn:
		lv = slog.LevelWarn
	case abi.LogError:
		lv = slog.LevelError
	}
	log.Log(context.Background(), lv, msg, slog.String("object", object))
}
