package store

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// Deferred writes. A transaction that Defer was called on keeps its state
// writes and its log appends in memory and hands them to SQLite in one
// go, when it commits or when something must read what SQLite holds: in a
// batch of calls that each write the key the call before wrote (a
// counter), thirty writes of one key become one, and a call that only
// reads, writes and publishes runs no SQL statement at all. Its savepoint
// is marked in memory too and opened in SQLite only if the call does run
// a statement (SQLite then undoes that statement's part, and the memory
// its own).
//
// What a deferred transaction commits is what it would have committed
// writing through: the change set it records for copies is the same,
// operation by operation, and each event keeps the seq the call was told.
// The one difference is when a write meets a full file: at the commit
// (Flush), not at the call's Put, and SQLite may then have rolled back the
// whole transaction. A caller that defers runs the calls again, one to a
// transaction, when that happens (the host's batches do), so the call that
// filled the file is the one that fails.

const (
	// maxDeferredBytes: past this many bytes of values and payloads held,
	// a deferred transaction hands what it holds to SQLite.
	maxDeferredBytes = 1 << 20
	// maxDeferredAppends: past this many events held, the same.
	maxDeferredAppends = 1024
	// maxCachedValue: a value over this many bytes is not kept once
	// SQLite has it (with at most maxWritten keys kept, what a
	// transaction keeps stays near 1 MB however large its values).
	maxCachedValue = 4 << 10
	// appendRows is how many held events one INSERT statement writes.
	appendRows = 16
)

// deferredAppend is an event appended and not yet in SQLite.
type deferredAppend struct {
	seq     uint64
	topic   string
	payload []byte
	at      int64
}

// undoRec is how to put back a state key's entry in written (had false:
// it had none).
type undoRec struct {
	key string
	old stateValue
	had bool
}

// Defer makes the transaction keep its state writes and appends in memory
// until its commit (or until a statement must see them). Call it before
// the first write.
func (t *Tx) Defer() { t.deferring = true }

// Flush hands SQLite every write the transaction holds (Commit does it
// first too): a caller that defers calls it before committing to learn
// whether the writes fit the file (IsFull) while it can still run the
// calls again, one to a transaction.
func (t *Tx) Flush() error {
	if t.done {
		return errors.New("transaction already finished")
	}
	return t.flush()
}

// direct readies the transaction for a statement of its own: under Defer,
// it opens the marked savepoint in SQLite and hands SQLite every write
// held, so the statement sees them and a savepoint rolled back undoes
// them. Every Tx method that runs SQL, except a read of a state key not
// held, calls it first.
func (t *Tx) direct() error {
	if !t.deferring {
		return nil
	}
	if t.sp != nil && !t.sp.open {
		if _, err := t.f.savepoint.ExecContext(bg); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		t.sp.open = true
	}
	return t.flush()
}

// flush hands SQLite the writes held: each state key once, with its last
// value, then the events in seq order. Inside a savepoint each step is
// undoable: a rollback to it undoes SQLite's part and puts back what was
// held.
func (t *Tx) flush() error {
	if t.dirty > 0 {
		for k, e := range t.written {
			if !e.dirty {
				continue
			}
			var err error
			if e.present {
				_, err = t.f.put.ExecContext(bg, []byte(k), e.value)
			} else {
				_, err = t.f.del.ExecContext(bg, []byte(k))
			}
			if err != nil {
				return err
			}
			if len(e.value) > maxCachedValue {
				t.dropEntry(k) // SQLite answers for it now
				continue
			}
			clean := e
			clean.dirty = false
			t.setEntry(k, clean)
		}
	}
	// Events go appendRows to a statement while that many are left: one
	// statement's own cost (binding, running, resetting it) is a good
	// part of a small event's.
	var args [4 * appendRows]any
	for len(t.appends)-t.flushedAppends >= appendRows {
		for i, a := range t.appends[t.flushedAppends : t.flushedAppends+appendRows] {
			args[4*i], args[4*i+1], args[4*i+2], args[4*i+3] = int64(a.seq), a.topic, a.payload, a.at
		}
		if _, err := t.f.appendAt16.ExecContext(bg, args[:]...); err != nil {
			return err
		}
		t.flushedAppends += appendRows // a rollback puts back its mark's count
	}
	for i := t.flushedAppends; i < len(t.appends); i++ {
		a := t.appends[i]
		if _, err := t.f.appendAt.ExecContext(bg, int64(a.seq), a.topic, a.payload, a.at); err != nil {
			return err
		}
		t.flushedAppends = i + 1
	}
	if t.sp == nil {
		t.forgetFlushed()
	}
	t.heldBytes = 0
	return nil
}

// forgetFlushed lets go of the events SQLite has, when no savepoint is
// marked (a rollback to one puts back events it held before the mark and
// wrote after it, so they are kept while it is).
func (t *Tx) forgetFlushed() {
	n := copy(t.appends, t.appends[t.flushedAppends:])
	clear(t.appends[n:])
	t.appends = t.appends[:n]
	t.flushedAppends = 0
}

// setEntry sets key's entry in written, noting under a savepoint how to
// put back the one before, and keeps the count of entries not in SQLite.
func (t *Tx) setEntry(k string, e stateValue) {
	old, had := t.written[k]
	if t.sp != nil {
		t.undo = append(t.undo, undoRec{key: k, old: old, had: had})
	}
	if had && old.dirty {
		t.dirty--
	}
	if e.dirty {
		t.dirty++
	}
	if t.written == nil {
		t.written = map[string]stateValue{}
	}
	t.written[k] = e
}

// dropEntry removes key's entry (SQLite answers for it), noting under a
// savepoint how to put it back.
func (t *Tx) dropEntry(k string) {
	old, had := t.written[k]
	if !had {
		return
	}
	if t.sp != nil {
		t.undo = append(t.undo, undoRec{key: k, old: old, had: had})
	}
	if old.dirty {
		t.dirty--
	}
	delete(t.written, k)
}

// deferWrite holds a state write (deleted: a delete) if the transaction
// defers and can hold it, and reports whether it did.
func (t *Tx) deferWrite(key, value []byte, deleted bool) bool {
	if !t.deferring {
		return false
	}
	k := string(key)
	if _, ok := t.written[k]; !ok && len(t.written) >= maxWritten {
		return false
	}
	e := stateValue{dirty: true}
	if !deleted {
		e.value, e.present = bytes.Clone(value), true // Put makes nil empty
	}
	t.setEntry(k, e)
	t.heldBytes += len(key) + len(value)
	return true
}

// deferAppend holds an event and returns its seq; ok is false when the
// transaction does not defer.
func (t *Tx) deferAppend(topic string, payload []byte, at time.Time) (seq uint64, ok bool, err error) {
	if !t.deferring {
		return 0, false, nil
	}
	if t.nextSeq == 0 {
		head, err := t.f.Head()
		if err != nil {
			return 0, true, err
		}
		t.nextSeq = head + 1
	}
	seq = t.nextSeq
	t.nextSeq++
	t.appends = append(t.appends, deferredAppend{seq: seq, topic: topic, payload: bytes.Clone(payload), at: at.UnixNano()})
	t.heldBytes += len(topic) + len(payload)
	return seq, true, nil
}

// overHeld hands SQLite what the transaction holds once that is past
// the bounds.
func (t *Tx) overHeld() error {
	if t.heldBytes > maxDeferredBytes || len(t.appends)-t.flushedAppends > maxDeferredAppends {
		return t.direct()
	}
	return nil
}

// deferredMark is a deferred transaction's savepoint: marked in memory,
// opened in SQLite only when a statement runs inside it.
type deferredMark struct {
	open           bool
	appends        int
	flushedAppends int
	nextSeq        uint64
}

// rollBackHeld undoes, in memory, what the transaction held and changed
// since the savepoint m.
func (t *Tx) rollBackHeld(m *deferredMark) {
	for i := len(t.undo) - 1; i >= 0; i-- {
		u := t.undo[i]
		if cur, ok := t.written[u.key]; ok && cur.dirty {
			t.dirty--
		}
		if u.had {
			t.written[u.key] = u.old
			if u.old.dirty {
				t.dirty++
			}
		} else {
			delete(t.written, u.key)
		}
	}
	t.undo = t.undo[:0]
	clear(t.appends[m.appends:])
	t.appends = t.appends[:m.appends]
	t.flushedAppends = m.flushedAppends
	t.nextSeq = m.nextSeq
}
