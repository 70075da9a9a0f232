package store

import "fmt"

// Savepoint marks a point inside a transaction: RollbackTo undoes what the
// transaction did after it (its writes, the changes it recorded for
// shipping, its appends, its edge-cache patches) and keeps what came
// before; Release keeps everything. It is how a group of calls shares one
// commit while each fails alone. One savepoint is open at a time.
type Savepoint struct {
	t         *Tx
	ops       int
	published int
	patches   int
	dropEdges bool
	alarm     bool
	lastSeq   uint64
	// held: the transaction defers (deferred.go), and this is its mark.
	held *deferredMark
}

// Savepoint marks the transaction as it is now.
func (t *Tx) Savepoint() (Savepoint, error) {
	s := Savepoint{t: t, ops: len(t.ops), published: t.published, patches: len(t.patches), dropEdges: t.dropEdges, alarm: t.alarmChanged, lastSeq: t.lastSeq}
	if t.deferring {
		// Marked in memory; opened in SQLite by the first statement
		// that runs inside it (direct).
		t.forgetFlushed()
		t.mark = deferredMark{appends: len(t.appends), flushedAppends: t.flushedAppends, nextSeq: t.nextSeq}
		t.sp = &t.mark
		t.undo = t.undo[:0]
		s.held = t.sp
		return s, nil
	}
	if _, err := t.f.savepoint.ExecContext(bg); err != nil {
		return Savepoint{}, fmt.Errorf("savepoint: %w", err)
	}
	return s, nil
}

// Release keeps what the transaction did since the savepoint.
func (s Savepoint) Release() error {
	if m := s.held; m != nil {
		t := s.t
		t.sp = nil
		t.undo = t.undo[:0]
		if !m.open {
			return nil
		}
	}
	if _, err := s.t.f.release.ExecContext(bg); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// RollbackTo undoes what the transaction did since the savepoint and
// releases it. The transaction stays open. If SQLite cannot roll back to
// it, the error says so and the whole transaction must be rolled back.
func (s Savepoint) RollbackTo() error {
	t := s.t
	if m := s.held; m == nil || m.open {
		if _, err := t.f.rollbackTo.ExecContext(bg); err != nil {
			return fmt.Errorf("roll back to savepoint: %w", err)
		}
		if _, err := t.f.release.ExecContext(bg); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
	}
	t.ops = t.ops[:s.ops]
	t.published = s.published
	t.patches = t.patches[:s.patches]
	t.dropEdges = s.dropEdges
	t.alarmChanged = s.alarm
	t.lastSeq = s.lastSeq
	if m := s.held; m != nil {
		// What it held and changed in memory since is put back as it
		// was; SQLite undid its own part above.
		t.rollBackHeld(m)
		t.sp = nil
		return nil
	}
	t.written = nil // what it wrote since may be undone: SQLite answers
	return nil
}

// Ops is the size in bytes of the change set the transaction recorded so
// far (0 when nothing is captured): a group of calls stops growing before
// its change set gets too large to ship.
func (t *Tx) Ops() int { return len(t.ops) }
