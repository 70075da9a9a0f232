package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// Asynchronous acknowledgement (--replica-ack async). A home commits a
// change set to its own file and answers the call at once; the change set
// is queued, and one goroutine per object ships the queue to the change
// stream in commit order, each publish fenced by the previous one's stream
// sequence as in sync mode. What a crash of the home can lose is what was
// queued and not yet in the stream: at most AsyncWindow change sets (each
// one commit of a group-commit batch), since a commit that finds the
// queue full waits for room.
//
// Only the reply goes out early. Deliveries to followers and stream reads
// on the home wait until what was committed before them is in the stream
// (waitShipped), so no follower or stream reader sees an event a takeover
// could give another meaning: a seq, once delivered, names the same event
// on every home.
//
// The file's position records the count and checksum of each commit but
// stream sequence 0 (not known yet); the queue knows the real ones. A
// file closed with its queue shipped is found at the stream's end when it
// is opened again (count and checksum match the stream's last change set),
// and one that was not (a crash) does not continue the stream: it is set
// aside and made again, as any diverged file.

// Async acknowledgement settings.
const (
	// ReplicaAsync answers a call once its changes are committed to the
	// home's file; they are shipped right after.
	ReplicaAsync = "async"
	// AsyncWindow is how many committed change sets of one object may wait
	// to be shipped: the most a crash of the home loses with async
	// acknowledgement.
	AsyncWindow = 32
	// shipRetryMax is the longest wait between attempts to ship a change
	// set the stream did not take (no leader for a while).
	shipRetryMax = time.Second
	// seqMemory is how many shipped change sets' stream sequences a queue
	// remembers, for a snapshot taken a little behind the queue's head.
	seqMemory = 4 * AsyncWindow
)

// errNotShipped: a snapshot's position is not known shipped (yet).
var errNotShipped = errors.New("snapshot position not shipped yet")

// shipQueue is one home object's change sets committed and not yet
// shipped. Its goroutine runs while the queue holds any.
type shipQueue struct {
	id   ObjectID
	path string
	r    *replicas

	// mu guards everything below; room and shipped are broadcast
	// whenever items shrink or err is set. Held for no I/O.
	mu      sync.Mutex
	changed *sync.Cond
	items   []shipItem
	// acked is the position of the last change set the stream took;
	// committed the position after the last one queued.
	acked, committed store.Position
	// shippedHead is the file's log head as of the last change set the
	// stream took: events after it are not shipped yet.
	shippedHead uint64
	// head reads the log head in the committing transaction.
	head func() (uint64, error)
	// err, once set, refuses further commits: the object was fenced,
	// or the node is stopping.
	err     error
	running bool
	// seqs remembers shipped positions' stream sequences by change count.
	seqs map[uint64]uint64
}

type shipItem struct {
	changes []byte
	at      store.Position // the file's position before it (Seq unknown)
	head    uint64         // the log head after it
}

// newShipQueue starts a queue for the home file f (caught up: its
// position's stream sequence is real, and all of it shipped).
func (r *replicas) newShipQueue(id ObjectID, path string, f *store.File) (*shipQueue, error) {
	head, err := f.Head()
	if err != nil {
		return nil, err
	}
	at := f.Position()
	q := &shipQueue{id: id, path: path, r: r, acked: at, committed: at, shippedHead: head, head: f.Head, seqs: map[uint64]uint64{}}
	q.changed = sync.NewCond(&q.mu)
	return q, nil
}

// shipper is the file's Shipper: it queues the change set and returns the
// position after it, with no stream sequence.
func (q *shipQueue) shipper(changes []byte, at store.Position) (store.Position, error) {
	if max := q.r.log.MaxChanges(); len(changes) > max {
		return at, fmt.Errorf("%w: the transaction's changes are %d bytes, over the %d a replicated change set can carry", ErrTooLarge, len(changes), max)
	}
	head, err := q.head() // this transaction's appends included
	if err != nil {
		return at, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) >= AsyncWindow && q.err == nil {
		// Wait for room, as long as a sync publish may take.
		t := time.AfterFunc(shipTimeout, func() {
			q.mu.Lock()
			q.changed.Broadcast()
			q.mu.Unlock()
		})
		deadline := time.Now().Add(shipTimeout)
		for len(q.items) >= AsyncWindow && q.err == nil && time.Now().Before(deadline) {
			q.changed.Wait()
		}
		t.Stop()
		if len(q.items) >= AsyncWindow && q.err == nil {
			return at, fmt.Errorf("%w: %d change sets of %s wait to be shipped", ErrUnavailable, len(q.items), q.id)
		}
	}
	if q.err != nil {
		return at, q.err
	}
	if at.Applied != q.committed.Applied || at.Sum != q.committed.Sum {
		// A change set queued earlier did not commit here (its commit
		// failed after it was queued): the file is behind what is
		// shipped. It is closed and caught up from the stream when next
		// used, as a sync home's file is after ErrBehind.
		q.r.fenced(q.id)
		return at, fmt.Errorf("%w: %s is at change %d, its queue at %d", store.ErrBehind, q.id, at.Applied, q.committed.Applied)
	}
	next := store.Position{Applied: at.Applied + 1, Sum: replica.Chain(at.Sum, changes)}
	q.items = append(q.items, shipItem{changes: bytes.Clone(changes), at: at, head: head})
	q.committed = next
	if !q.running {
		q.running = true
		q.r.wg.Add(1)
		go q.run()
	}
	return next, nil
}

// run ships the queue, oldest first, until it is empty or refused.
func (q *shipQueue) run() {
	defer q.r.wg.Done()
	wait := 10 * time.Millisecond
	for {
		q.mu.Lock()
		if len(q.items) == 0 || q.err != nil {
			q.running = false
			q.mu.Unlock()
			return
		}
		it := q.items[0]
		at := it.at
		at.Seq = q.acked.Seq
		q.mu.Unlock()
		if g := q.r.shipGate.Load(); g != nil {
			select { // tests: shipping paused
			case <-*g:
			case <-q.r.ctx.Done():
			}
		}
		if g, ok := q.r.shipHeld.Load(q.id); ok {
			select { // tests: this object's shipping paused
			case <-g.(chan struct{}):
			case <-q.r.ctx.Done():
			}
		}

		ctx, cancel := context.WithTimeout(q.r.ctx, shipTimeout)
		p, err := q.r.log.Ship(ctx, subjectOf(q.id), q.r.self, it.changes, at)
		cancel()
		switch {
		case err == nil:
			wait = 10 * time.Millisecond
			q.mu.Lock()
			q.items = q.items[1:]
			q.acked = p
			q.shippedHead = it.head
			q.seqs[p.Applied] = p.Seq
			delete(q.seqs, p.Applied-seqMemory)
			q.changed.Broadcast()
			q.mu.Unlock()
			q.r.shipped(q.id, q.path, p)
		case errors.Is(err, store.ErrFenced) || errors.Is(err, ErrTooLarge) || q.r.ctx.Err() != nil:
			q.fail(err)
			return
		default:
			// The stream did not take it (no leader for a moment): the
			// same change set again, the message id making a publish
			// that did land a duplicate.
			q.r.logger.Warn("ship a change set again", slog.String("object", q.id.String()), slog.Duration("after", wait), slog.Any("err", err))
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-q.r.ctx.Done():
				t.Stop()
			}
			wait = min(2*wait, shipRetryMax)
		}
	}
}

// fail refuses the queue: what it holds is lost to the stream.
func (q *shipQueue) fail(err error) {
	q.mu.Lock()
	lost := len(q.items)
	q.items = nil
	if q.err == nil {
		q.err = err
	}
	q.running = false
	q.changed.Broadcast()
	q.mu.Unlock()
	if errors.Is(err, store.ErrFenced) {
		q.r.logger.Warn("object fenced: another node took it over; change sets committed here and not shipped are lost (async acknowledgement)",
			slog.String("object", q.id.String()), slog.Int("lost", lost))
		q.r.fenced(q.id)
	} else if lost > 0 {
		q.r.logger.Error("change sets not shipped", slog.String("object", q.id.String()), slog.Int("lost", lost), slog.Any("err", err))
		q.r.fenced(q.id)
	}
}

// wait returns once every change set queued before it is shipped, or the
// queue was refused (its error), or ctx ends.
func (q *shipQueue) wait(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	target := q.committed.Applied
	if q.acked.Applied >= target || q.err != nil {
		return q.err
	}
	stop := context.AfterFunc(ctx, func() {
		q.mu.Lock()
		q.changed.Broadcast()
		q.mu.Unlock()
	})
	defer stop()
	for q.acked.Applied < target && q.err == nil && ctx.Err() == nil {
		q.changed.Wait()
	}
	if q.err != nil {
		return q.err
	}
	if q.acked.Applied < target {
		return fmt.Errorf("%w: waiting for %s's changes to be shipped: %w", ErrUnavailable, q.id, ctx.Err())
	}
	return nil
}

// seqOf returns the stream sequence of the change set that brought the
// object to change count applied, waiting until it is shipped.
func (q *shipQueue) seqOf(ctx context.Context, applied uint64) (uint64, error) {
	if err := q.wait(ctx); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if seq, ok := q.seqs[applied]; ok {
		return seq, nil
	}
	if applied == q.acked.Applied {
		return q.acked.Seq, nil
	}
	return 0, errNotShipped
}

// shipped returns the log head as of the last change set shipped.
func (q *shipQueue) shipped() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shippedHead
}

// status is what the queue holds: its shipped position and how many
// change sets wait.
func (q *shipQueue) status() (store.Position, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.acked, len(q.items)
}
