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
}

// Savepoint marks the transaction as it is now.
func (t *Tx) Savepoint() (Savepoint, error) {
	if _, err := t.f.savepoint.ExecContext(bg); err != nil {
		return Savepoint{}, fmt.Errorf("savepoint: %w", err)
	}
	return Savepoint{t: t, ops: len(t.ops), published: t.published, patches: len(t.patches), dropEdges: t.dropEdges, alarm: t.alarmChanged, lastSeq: t.lastSeq}, nil
}

// Release keeps what the transaction did since the savepoint.
func (s Savepoint) Release() error {
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
	if _, err := t.f.rollbackTo.ExecContext(bg); err != nil {
		return fmt.Errorf("roll back to savepoint: %w", err)
	}
	if _, err := t.f.release.ExecContext(bg); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	t.ops = t.ops[:s.ops]
	t.published = s.published
	t.patches = t.patches[:s.patches]
	t.dropEdges = s.dropEdges
	t.alarmChanged = s.alarm
	t.lastSeq = s.lastSeq
	t.written = nil // what it wrote since may be undone: SQLite answers
	return nil
}

// Ops is the size in bytes of the change set the transaction recorded so
// far (0 when nothing is captured): a group of calls stops growing before
// its change set gets too large to ship.
func (t *Tx) Ops() int { return len(t.ops) }
