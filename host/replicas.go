package host

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// Replica settings.
const (
	// ReplicaSync answers a call once its changes are in the replicated
	// change stream.
	ReplicaSync = "sync"
	// ReplicasAuto: 2 copies once the cluster has three NATS servers, none
	// on fewer.
	ReplicasAuto = -1
	// shipTimeout bounds one change set's publish: a call waits at most
	// this long for its output gate.
	shipTimeout = 10 * time.Second
	// DefaultSnapshotEvery is how many change sets a home ships between
	// snapshots of an object's file.
	DefaultSnapshotEvery = 10000
	// snapshotTimeout bounds one snapshot (copy, store, purge).
	snapshotTimeout = 5 * time.Minute
)

// copiesFor is the default number of copies for a cluster of peers NATS
// servers.
func copiesFor(peers int) int {
	if peers >= 3 {
		return 2
	}
	return 0
}

// replicas is this node's part of replication: shipping the change sets
// of objects homed here (through the file's Shipper), applying those of
// objects homed elsewhere to the copies this node keeps, and bringing a
// file up to its stream's end before this node serves it as home.
//
// It takes what it uses: the change stream, the cluster's placement, and a
// func that says whether an object is active here.
type replicas struct {
	log    *replica.Log
	self   string
	copies int    // copies besides the home
	dir    string // DataDir/replicas
	cl     *cluster.Cluster
	active func(ObjectID) bool
	fenced func(ObjectID)
	// homePath is where id's file is when this node is (or was) its home.
	homePath func(ObjectID) string
	logger   *slog.Logger
	// snapEvery is how many change sets a home ships between snapshots
	// (0 or less: none); snaps is each home object's *snapState.
	snapEvery int
	snaps     sync.Map

	// mu guards open, the copy files kept open, at most maxOpen of them
	// (the node's bound on active objects); it is held for no I/O. The
	// consumer applies one change set at a time; copyMu serialises that
	// with a takeover adopting the copy (held across the stream reads of
	// a catch-up, which are bounded by opTimeout each). opens counts the
	// copy files opened (host_replica_copy_opens_total): one opened again
	// and again means more copies are written than the bound holds.
	mu      sync.Mutex
	open    map[ObjectID]*store.File
	maxOpen int
	opens   atomic.Int64
	copyMu  sync.Mutex
	cons    jetstream.ConsumeContext

	// homeAt is, for each object this node opened as home, the stream
	// sequence its file was at then (ObjectID → uint64): a change set
	// another node shipped after it means this node was taken over; one
	// from before (the old home's, read late) means nothing.
	homeAt sync.Map

	// afterRestore, when set (tests), runs in readShipped between the
	// snapshot's restore and the catch-up after it.
	afterRestore func()
	// failOpens is how many of the next openHome calls fail before doing
	// anything: set by tests only, to stand for a stream without a leader.
	failOpens atomic.Int32

	// retrying holds the objects whose copy is being made again in the
	// background after a failure (ObjectID → struct{}); wg counts those
	// goroutines.
	retrying sync.Map
	wg       sync.WaitGroup

	// async: calls are answered once committed here, and each home
	// object's change sets are shipped by its queue (ObjectID →
	// *shipQueue) right after; see shipq.go. ctx ends the queues'
	// publishes when the node stops. shipGate, when set (tests only),
	// pauses every queue before each publish until it is closed.
	async    bool
	queues   sync.Map
	ctx      context.Context
	shipGate atomic.Pointer[chan struct{}]
	// shipHeld (tests only): ObjectID → chan struct{}, pausing that
	// object's queue as shipGate pauses all.
	shipHeld sync.Map
}

// Copy retries: the first wait, and how many attempts (500 ms doubling
// to 32 s, as durable deliveries back off: about a minute in all).
const (
	copyRetryBase     = 500 * time.Millisecond
	copyRetryAttempts = 8
)

// retry makes this node's copy of id current in the background after a
// failure (a stream or the snapshot store without a leader for a while,
// after a node left), backing off between attempts, until it succeeds,
// the object is active here or no longer kept here while home holds it
// (home "": the object's home asked for the copy, which settles it),
// the attempts run out, or ctx ends. Otherwise an idle object's copy
// would wait for the object's next write.
func (r *replicas) retry(ctx context.Context, id ObjectID, home string) {
	if _, busy := r.retrying.LoadOrStore(id, struct{}{}); busy {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.retrying.Delete(id)
		wait := copyRetryBase
		for range copyRetryAttempts {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if r.active(id) || home != "" && !r.keeps(id, home) {
				return
			}
			err := r.ensure(ctx, id)
			if err == nil {
				return
			}
			r.logger.Warn("make a copy again", slog.String("object", id.String()), slog.Duration("after", wait), slog.Any("err", err))
			wait = min(2*wait, 32*time.Second)
		}
	}()
}

// opTimeout bounds one read of the change stream: a stream without a
// leader (an election after a node died) fails the read instead of
// holding up the copy or the takeover behind it.
const opTimeout = 5 * time.Second

func (r *replicas) copyPath(id ObjectID) string {
	return filepath.Join(r.dir, id.Program, id.ID+".db")
}

func subjectOf(id ObjectID) string { return replica.Subject(id.Program, id.ID) }

// openHome opens the object's file at path to serve it as its home: a
// copy kept here becomes the file, the file catches up to its stream's
// end, and unless this node shipped the stream's last change set, a
// takeover mark fences whoever held it before. From then on each commit
// ships first.
func (r *replicas) openHome(ctx context.Context, id ObjectID, path string, sync store.Sync) (*store.File, error) {
	if r.failOpens.Load() > 0 && r.failOpens.Add(-1) >= 0 {
		return nil, errors.New("open as home: failed by a test")
	}
	// A queue left from an earlier time this node was home ships
	// first: the file is not at the stream's end before it has.
	if err := r.waitShipped(ctx, id); err != nil && !errors.Is(err, store.ErrFenced) {
		return nil, err
	}
	r.queues.Delete(id)
	if err := r.adoptCopy(id, path); err != nil {
		return nil, err
	}
	f, err := store.Open(ctx, path, sync)
	if err != nil {
		return nil, err
	}
	if err := r.catchUpHome(ctx, id, f); err != nil {
		f.Close()
		if rerr := r.remake(ctx, id, path, err); rerr != nil {
			return nil, rerr
		}
		if f, err = store.Open(ctx, path, sync); err != nil {
			return nil, err
		}
		if err := r.catchUpHome(ctx, id, f); err != nil {
			f.Close()
			return nil, err
		}
	}
	at := f.Position()
	if r.async {
		q, err := r.newShipQueue(id, path, f)
		if err != nil {
			f.Close()
			return nil, err
		}
		r.queues.Store(id, q)
		f.SetShipper(q.shipper)
	} else {
		f.SetShipper(r.shipper(id, path))
	}
	r.homeAt.Store(id, at.Seq)
	return f, nil
}

func (r *replicas) timed(id ObjectID, what string, start time.Time, err error) {
	r.logger.Debug(what, slog.String("object", id.String()), slog.Duration("took", time.Since(start)), slog.Any("err", err))
}

func (r *replicas) catchUpHome(ctx context.Context, id ObjectID, f *store.File) (err error) {
	start := time.Now()
	defer func() { r.timed(id, "catch up as home", start, err) }()
	subj := subjectOf(id)
	last, err := r.log.Last(ctx, subj)
	if err != nil {
		return err
	}
	if err := adoptSeq(f, last); err != nil {
		return err
	}
	for {
		at := f.Position()
		if at.Seq < last.Seq {
			if _, _, err := r.log.CatchUp(ctx, subj, f); err != nil {
				return err
			}
			at = f.Position()
		}
		if last.Node == r.self && at.Seq == last.Seq {
			return nil
		}
		_, err := r.log.Mark(ctx, subj, r.self, f)
		if !errors.Is(err, replica.ErrFenced) {
			return err
		}
		// The old home shipped meanwhile: take that too, then mark.
		if last, err = r.log.Last(ctx, subj); err != nil {
			return err
		}
	}
}

// adoptSeq records in f the stream sequence of its stream's last change
// set when f is at that change set but does not know its sequence: its
// change sets were shipped after they committed (async acknowledgement).
func adoptSeq(f *store.File, last replica.Tail) error {
	at := f.Position()
	if at.Seq != 0 || at.Applied == 0 || last.Applied != at.Applied || last.Sum != at.Sum {
		return nil
	}
	at.Seq = last.Seq
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	if err := tx.SetPosition(at); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// waitShipped returns once the change sets committed so far on id's home
// file here are in the stream (at once without async acknowledgement, or
// when id has no queue here). An error: the queue was refused (fenced),
// or ctx ended first.
func (r *replicas) waitShipped(ctx context.Context, id ObjectID) error {
	if q := r.queue(id); q != nil {
		return q.wait(ctx)
	}
	return nil
}

// allShipped reports whether id has nothing committed here that waits to
// be shipped.
func (r *replicas) allShipped(id ObjectID) bool {
	q := r.queue(id)
	if q == nil {
		return true
	}
	_, waiting := q.status()
	return waiting == 0
}

// readCap is the last seq of id's log a reader may see here, and whether
// there is one: under async acknowledgement, what is shipped (0 when no
// event is yet); none otherwise.
func (r *replicas) readCap(id ObjectID) (uint64, bool) {
	if q := r.queue(id); q != nil {
		return q.shipped(), true
	}
	return 0, false
}

// queue is id's ship queue here: nil without async acknowledgement, or
// when this node is not id's home.
func (r *replicas) queue(id ObjectID) *shipQueue {
	if r == nil || !r.async {
		return nil
	}
	if v, ok := r.queues.Load(id); ok {
		return v.(*shipQueue)
	}
	return nil
}

// drain waits until every queue has shipped what it holds, or ctx ends.
func (r *replicas) drain(ctx context.Context) {
	if !r.async {
		return
	}
	r.queues.Range(func(k, v any) bool {
		if err := v.(*shipQueue).wait(ctx); err != nil && ctx.Err() == nil {
			r.logger.Warn("ship before stopping", slog.String("object", k.(ObjectID).String()), slog.Any("err", err))
		}
		return ctx.Err() == nil
	})
}

// remake makes a file that could not catch up (err) ready to catch up
// again: a file behind its stream's snapshot is replaced by the snapshot,
// and a diverged one is set aside (never skipped) and made again from the
// snapshot, if any, and the stream. Any other err is returned as is. The
// file must be closed.
func (r *replicas) remake(ctx context.Context, id ObjectID, path string, err error) error {
	switch {
	case errors.Is(err, replica.ErrBehindSnapshot):
		r.logger.Info("file behind its change stream's snapshot; restoring the snapshot", slog.String("object", id.String()))
	case errors.Is(err, replica.ErrDiverged):
		r.logger.Error("file diverged from its change stream; making it again", slog.String("object", id.String()), slog.Any("err", err))
		if err := setAside(path); err != nil {
			return err
		}
	default:
		return err
	}
	if _, _, err := r.log.Restore(ctx, subjectOf(id), path); err != nil {
		return err
	}
	return nil
}

// snapState is a home object's snapshots: the position of the latest and
// whether one is being made.
type snapState struct {
	mu    sync.Mutex
	known bool   // last was read from the stream
	last  uint64 // applied count of the latest snapshot (0: none)
	busy  bool
}

// shipped starts a snapshot of the home file at path when its position p
// is snapEvery change sets past the latest snapshot; one at a time per
// object, off the call's path.
func (r *replicas) shipped(id ObjectID, path string, p store.Position) {
	if r.snapEvery <= 0 {
		return
	}
	v, _ := r.snaps.LoadOrStore(id, &snapState{})
	s := v.(*snapState)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy || s.known && p.Applied < s.last+uint64(r.snapEvery) || !s.known && p.Applied < uint64(r.snapEvery) {
		return
	}
	s.busy = true
	go r.snapshot(id, path, p, s)
}

func (r *replicas) snapshot(id ObjectID, path string, p store.Position, s *snapState) {
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	subj := subjectOf(id)
	s.mu.Lock()
	known, last := s.known, s.last
	s.mu.Unlock()
	var err error
	defer func() {
		s.mu.Lock()
		s.busy = false
		s.mu.Unlock()
		if err != nil {
			r.logger.Warn("snapshot", slog.String("object", id.String()), slog.Any("err", err))
		}
	}()
	if !known {
		// The stream's first change set is at the latest snapshot.
		var first replica.Tail
		if first, err = r.log.First(ctx, subj); err != nil {
			return
		}
		last = first.Applied
		if last <= 1 {
			last = 0
		}
		s.mu.Lock()
		s.known, s.last = true, last
		s.mu.Unlock()
		if p.Applied < last+uint64(r.snapEvery) {
			return
		}
	}
	start := time.Now()
	var seqOf replica.SeqOf
	if q := r.queue(id); q != nil {
		seqOf = q.seqOf
	}
	at, size, err := r.log.SnapshotShipped(ctx, subj, path, last, seqOf)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.last = max(s.last, at.Applied)
	s.mu.Unlock()
	r.logger.Debug("snapshot", slog.String("object", id.String()), slog.Uint64("applied", at.Applied), slog.Int64("bytes", size), slog.Duration("took", time.Since(start)))
}

func (r *replicas) shipper(id ObjectID, path string) store.Shipper {
	ship := r.log.Shipper(subjectOf(id), r.self, shipTimeout)
	return func(changes []byte, at store.Position) (store.Position, error) {
		p, err := ship(changes, at)
		if err == nil {
			r.shipped(id, path, p)
		}
		if errors.Is(err, store.ErrFenced) {
			r.logger.Warn("object fenced: another node took it over; this node's transaction is rolled back", slog.String("object", id.String()))
		}
		if err != nil && !errors.Is(err, ErrTooLarge) {
			// Fenced, or unsure whether it landed: this file may be
			// behind its stream. It is closed after this call and
			// caught up when next used.
			r.fenced(id)
		}
		return p, err
	}
}

// setAside renames a diverged file (and its WAL) out of the way, kept for
// inspection.
func setAside(path string) error {
	return moveFile(path, path+".diverged-"+time.Now().UTC().Format("20060102T150405"))
}

// sqliteFiles are the suffixes of an SQLite file's parts in WAL mode.
var sqliteFiles = []string{"", "-wal", "-shm"}

// moveFile renames an SQLite file with its WAL and shared memory, the parts
// that exist.
func moveFile(from, to string) error {
	for _, ext := range sqliteFiles {
		if err := os.Rename(from+ext, to+ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// adoptCopy makes this node's copy of id its home file: the copy is
// current where the old home's file (if any, from an earlier life of this
// data directory) may not be.
func (r *replicas) adoptCopy(id ObjectID, path string) error {
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	r.closeCopy(id)
	cp := r.copyPath(id)
	if _, err := os.Stat(cp); err != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(path); err == nil {
		if err := setAside(path); err != nil {
			return err
		}
	}
	if err := moveFile(cp, path); err != nil {
		return fmt.Errorf("adopt the copy of %s: %w", id, err)
	}
	return nil
}

// keepAsCopy makes the home file at path (of an object home holds now)
// this node's copy if it keeps one and has none yet, and reports whether
// it did; otherwise the file is deleted.
func (r *replicas) keepAsCopy(id ObjectID, home, path string) (bool, error) {
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	if _, err := os.Stat(r.copyPath(id)); err != nil && r.keeps(id, home) {
		return true, r.homeToCopy(id, path)
	}
	return false, store.RemoveFile(path)
}

// homeToCopy moves the home file at path to id's copy path. Called with
// copyMu held.
func (r *replicas) homeToCopy(id ObjectID, path string) error {
	cp := r.copyPath(id)
	if err := os.MkdirAll(filepath.Dir(cp), 0o755); err != nil {
		return err
	}
	return moveFile(path, cp)
}

// start applies, from now on, every change set shipped by another node to
// the copies this node keeps.
func (r *replicas) start(ctx context.Context, js jetstream.JetStream) error {
	c, err := js.OrderedConsumer(ctx, replica.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"host.changes.>"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return fmt.Errorf("change stream consumer: %w", err)
	}
	r.cons, err = c.Consume(func(m jetstream.Msg) { r.receive(ctx, m) },
		// The ordered consumer recreates itself after these (a missed
		// heartbeat, a server gone); said, so a copy that stops following
		// its stream shows why.
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			r.logger.Warn("change stream consumer", slog.Any("err", err))
		}))
	return err
}

func (r *replicas) stop() {
	if r.cons != nil {
		r.cons.Stop()
	}
	r.wg.Wait() // the retries end with the node's background context
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	for _, id := range r.openIDs() {
		r.closeCopy(id)
	}
	r.log.Close()
}

func (r *replicas) openIDs() []ObjectID {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ObjectID, 0, len(r.open))
	for id := range r.open {
		out = append(out, id)
	}
	return out
}

// objectOfSubject parses host.changes.PROGRAM.HEXID.
func objectOfSubject(subj string) (ObjectID, bool) {
	rest, ok := strings.CutPrefix(subj, "host.changes.")
	if !ok {
		return ObjectID{}, false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return ObjectID{}, false
	}
	id, err := hex.DecodeString(rest[i+1:])
	if err != nil {
		return ObjectID{}, false
	}
	o := ObjectID{Program: rest[:i], ID: string(id)}
	return o, o.Validate() == nil
}

// receive handles one change set from the stream.
func (r *replicas) receive(ctx context.Context, m jetstream.Msg) {
	id, ok := objectOfSubject(m.Subject())
	if !ok {
		return
	}
	from := replica.Shipped(m.Headers())
	if from == r.self {
		return
	}
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	if r.active(id) {
		// Another node shipped for an object active here after this node
		// became its home: it took the object over, and this node must
		// not serve it again from this file.
		if at, ok := r.homeAt.Load(id); !ok || meta.Sequence.Stream > at.(uint64) {
			r.fenced(id)
		}
		return
	}
	if !r.keeps(id, from) {
		r.drop(id)
		return
	}
	if err := r.apply(ctx, id, meta.Sequence.Stream, m); err != nil {
		r.logger.Warn("apply a change set to a copy", slog.String("object", id.String()), slog.Any("err", err))
		r.retry(ctx, id, from)
	}
}

// keeps reports whether this node is one of id's copies while from holds it.
func (r *replicas) keeps(id ObjectID, home string) bool {
	for _, n := range r.cl.Copies(cluster.Object(id), home, r.copies) {
		if n == r.self {
			return true
		}
	}
	return false
}

// apply brings this node's copy of id to the change set in m: applied when
// it is the next, skipped when the copy has it, and when the copy is
// behind (it was made late, or this node was away) caught up from the
// stream first. A copy that does not continue the stream is made again.
func (r *replicas) apply(ctx context.Context, id ObjectID, seq uint64, m jetstream.Msg) error {
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	f, err := r.copyFile(ctx, id)
	if err != nil {
		return err
	}
	at := f.Position()
	switch applied := replica.Applied(m.Headers()); {
	case applied <= at.Applied:
		return nil
	case applied == at.Applied+1:
		c, err := r.log.Decode(seq, m.Headers(), m.Data(), at)
		if err == nil {
			err = r.log.Apply(f, c)
		}
		if !errors.Is(err, replica.ErrDiverged) {
			return err
		}
	default:
		_, _, err = r.log.CatchUp(ctx, subjectOf(id), f)
		if !errors.Is(err, replica.ErrDiverged) && !errors.Is(err, replica.ErrBehindSnapshot) {
			return err
		}
	}
	return r.remakeCopy(ctx, id, err)
}

// remakeCopy makes this node's copy of id again after a catch-up failed
// with err (see remake), and catches it up. Called with copyMu held.
func (r *replicas) remakeCopy(ctx context.Context, id ObjectID, err error) error {
	r.closeCopy(id)
	if err := r.remake(ctx, id, r.copyPath(id), err); err != nil {
		return err
	}
	f, err := r.copyFile(ctx, id)
	if err != nil {
		return err
	}
	_, _, err = r.log.CatchUp(ctx, subjectOf(id), f)
	return err
}

// ensure makes this node's copy of id (if it has none) and catches it up
// to its stream's end.
func (r *replicas) ensure(ctx context.Context, id ObjectID) error {
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	f, err := r.copyFile(ctx, id)
	if err != nil {
		return err
	}
	_, _, err = r.log.CatchUp(ctx, subjectOf(id), f)
	if errors.Is(err, replica.ErrBehindSnapshot) || errors.Is(err, replica.ErrDiverged) {
		err = r.remakeCopy(ctx, id, err)
	}
	return err
}

// copyFile returns the open copy of id, opening it (and closing another
// past the bound). Called with copyMu held.
//
// The bound must hold the copies being written: the consumer applies
// every change set on one goroutine, and a copy evicted and opened again
// costs an open and the evicted file's close (which checkpoints its WAL),
// several times the apply itself. With 64, a node keeping 100 copies of
// objects written all the time spent half its time reopening files and
// fell seconds behind the stream for good under load.
func (r *replicas) copyFile(ctx context.Context, id ObjectID) (*store.File, error) {
	r.mu.Lock()
	f := r.open[id]
	var evict *store.File
	if f == nil && len(r.open) >= max(r.maxOpen, 1) {
		for k, g := range r.open {
			evict = g
			delete(r.open, k)
			break
		}
	}
	r.mu.Unlock()
	if evict != nil {
		evict.Close()
	}
	if f != nil {
		return f, nil
	}
	if err := r.adoptHomeFile(id); err != nil {
		return nil, err
	}
	f, err := store.Open(ctx, r.copyPath(id), store.SyncNormal)
	if err != nil {
		return nil, err
	}
	r.opens.Add(1)
	r.mu.Lock()
	r.open[id] = f
	r.mu.Unlock()
	return f, nil
}

// adoptHomeFile starts id's copy from this node's old home file of it,
// when there is no copy yet and the object is not active here: a home
// that was taken over (paused past its lease, say) applies the new home's
// change sets to a copy before it retires its file, and the file it held
// is a prefix of the stream (a catch-up finds it out if not, and sets it
// aside). Starting from it spares the copy a transfer from the start, and
// keeps what the old home committed on disk instead of deleting it when
// the retirement finds a copy already made. Called with copyMu held.
func (r *replicas) adoptHomeFile(id ObjectID) error {
	if r.homePath == nil || r.active(id) || r.queue(id) != nil {
		return nil // held here, or change sets here wait to be shipped from it
	}
	if _, err := os.Stat(r.copyPath(id)); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	home := r.homePath(id)
	if _, err := os.Stat(home); err != nil {
		return nil
	}
	r.logger.Info("a copy starts from this node's file of the object, which it no longer holds", slog.String("object", id.String()))
	return r.homeToCopy(id, home)
}

// closeCopy closes id's copy if it is open. Called with copyMu held.
func (r *replicas) closeCopy(id ObjectID) {
	r.mu.Lock()
	f := r.open[id]
	delete(r.open, id)
	r.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// drop removes a copy this node no longer keeps. The consumer calls it for
// every change set of an object it does not copy, so having none costs a
// stat and no lock.
func (r *replicas) drop(id ObjectID) {
	p := r.copyPath(id)
	if _, err := os.Stat(p); err != nil {
		return
	}
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	r.closeCopy(id)
	for _, ext := range sqliteFiles {
		os.Remove(p + ext)
	}
}

// copyIDs lists the objects this node keeps a copy of.
func (r *replicas) copyIDs() []ObjectID { return objectFiles(r.dir) }

// CopyInfo is one node's copy of an object, for `host replicas`.
type CopyInfo = api.CopyInfo

// info describes this node's copy of id, or its file when this node is its
// home (ok false: neither here).
func (r *replicas) info(ctx context.Context, id ObjectID, homePath string, home bool) (CopyInfo, bool, error) {
	path := r.copyPath(id)
	if home {
		path = homePath
	}
	p, err := store.ReadPosition(ctx, path)
	if errors.Is(err, os.ErrNotExist) {
		return CopyInfo{}, false, nil
	}
	if err != nil {
		return CopyInfo{}, false, err
	}
	info := CopyInfo{Node: r.self, Home: home, Position: p}
	if q := r.queue(id); q != nil && home {
		acked, waiting := q.status()
		if info.Unshipped = waiting; waiting == 0 && acked.Applied == p.Applied {
			info.Position.Seq = acked.Seq
		}
	}
	return info, true, nil
}

// readCopy reads a range of id's log from the copy this node keeps; a copy
// that has not applied the range yet (the consumer applies change sets a
// moment after their commit) catches up from the stream first. ErrNoLog:
// no copy here, or the stream does not have the range either.
func (r *replicas) readCopy(ctx context.Context, id ObjectID, q store.Query) ([]abi.Event, error) {
	path := r.copyPath(id)
	evs, err := store.Read(ctx, path, q)
	if !errors.Is(err, store.ErrNoLog) {
		return evs, err
	}
	if _, serr := os.Stat(path); serr != nil {
		return nil, err
	}
	if ferr := r.ensure(ctx, id); ferr != nil {
		return nil, fmt.Errorf("%w: catching the copy up: %v", store.ErrNoLog, ferr)
	}
	return store.Read(ctx, path, q)
}

// readShipped reads a range of id's log from the shipped replica: its
// change stream applied to a scratch file, the last tier of the read path
// (no copy here, and the holder cannot answer).
func (r *replicas) readShipped(ctx context.Context, id ObjectID, q store.Query) ([]abi.Event, error) {
	dir := filepath.Join(r.dir, ".scratch")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, "read-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for attempt := 1; ; attempt++ {
		evs, err := r.readShippedInto(ctx, id, q, filepath.Join(tmp, fmt.Sprintf("o%d.db", attempt)))
		// The home took a newer snapshot and purged the change sets the
		// one restored needed, between the restore and the catch-up:
		// the newer one has them.
		if errors.Is(err, replica.ErrBehindSnapshot) && attempt < shippedReadAttempts {
			continue
		}
		return evs, err
	}
}

// shippedReadAttempts bounds readShipped's restores: each is beaten only
// by a snapshot taken while it ran.
const shippedReadAttempts = 3

// readShippedInto is one attempt of readShipped, in a scratch file at
// path: the snapshot if the stream was purged after one, then the stream.
func (r *replicas) readShippedInto(ctx context.Context, id ObjectID, q store.Query, path string) ([]abi.Event, error) {
	if _, _, err := r.log.Restore(ctx, subjectOf(id), path); err != nil {
		return nil, err
	}
	if r.afterRestore != nil {
		r.afterRestore()
	}
	f, err := store.Open(ctx, path, store.SyncNormal)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, _, err := r.log.CatchUp(ctx, subjectOf(id), f); err != nil {
		return nil, err
	}
	tx, err := f.Begin()
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	return tx.Read(q)
}
