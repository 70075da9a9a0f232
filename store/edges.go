package store

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/durable-host/host/abi"
)

// Edge is one approved follower of a publisher, a row in the publisher's
// file.
type Edge struct {
	ID       int64            `json:"id"`
	Kind     abi.FollowerKind `json:"-"`
	KindName string           `json:"kind"`
	Follower string           `json:"follower"` // connection id, or "program/id"
	Node     string           `json:"node"`     // the node the follower lives on
	Topic    string           `json:"topic"`
	Filter   string           `json:"filter,omitempty"`
	Cursor   uint64           `json:"cursor"` // last seq done for this edge
	// Attempts counts consecutive failed deliveries: the edge is dropped
	// at the configured maximum.
	Attempts int `json:"attempts"`
	// Unplaced counts consecutive attempts that found no home for the
	// follower. It backs off like Attempts but never drops the edge: a
	// follower that cannot be located has not failed (D20).
	Unplaced int   `json:"unplaced,omitempty"`
	NextDue  int64 `json:"next_due,omitempty"` // Unix ns; 0 = now
	Created  int64 `json:"created"`
	// State and NextAttempt describe the edge for operators (host edges);
	// they are derived, set by Tx.Edges.
	State       EdgeState `json:"state"`
	NextAttempt string    `json:"next_attempt,omitempty"` // RFC 3339
}

// EdgeState is what an edge is doing, as `host edges` shows it.
type EdgeState string

// Edge states.
const (
	// EdgeOK: delivering normally.
	EdgeOK EdgeState = "ok"
	// EdgeRetrying: its last delivery failed; it backs off and is dropped
	// after the maximum attempts.
	EdgeRetrying EdgeState = "retrying"
	// EdgeUnplaced: its follower could not be located (its node is gone
	// and no other serves it yet); it backs off and is never dropped.
	EdgeUnplaced EdgeState = "unplaced"
	// EdgeHeld: another edge of the same follower failed or is unplaced;
	// this one waits with it so the follower sees the publisher's events
	// in publish order.
	EdgeHeld EdgeState = "held"
)

func (e *Edge) describe() {
	switch {
	case e.Unplaced > 0:
		e.State = EdgeUnplaced
	case e.Attempts > 0:
		e.State = EdgeRetrying
	case e.NextDue > 0:
		e.State = EdgeHeld
	default:
		e.State = EdgeOK
	}
	e.NextAttempt = ""
	if e.NextDue > 0 {
		e.NextAttempt = time.Unix(0, e.NextDue).UTC().Format(time.RFC3339Nano)
	}
}

const edgeCols = `id, kind, follower, node, topic, filter, cursor, attempts, unplaced, next_due, created`

func scanEdge(row interface{ Scan(...any) error }) (Edge, error) {
	var e Edge
	var kind int
	var cursor int64
	err := row.Scan(&e.ID, &kind, &e.Follower, &e.Node, &e.Topic, &e.Filter, &cursor, &e.Attempts, &e.Unplaced, &e.NextDue, &e.Created)
	e.Kind = abi.FollowerKind(kind)
	e.KindName = e.Kind.String()
	e.Cursor = uint64(cursor)
	return e, err
}

func (t *Tx) queryEdges(q string, args ...any) ([]Edge, error) {
	if err := t.direct(); err != nil {
		return nil, err
	}
	rows, err := t.f.conn.QueryContext(bg, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Edge
	for rows.Next() {
		e, err := scanEdge(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// AddEdge records an approved follower. A new edge starts at the log's head:
// nothing already published is replayed down it. Following again (same kind,
// follower and topic) updates the node and filter and keeps the cursor.
func (t *Tx) AddEdge(kind abi.FollowerKind, follower, node, topic, filter string, now time.Time) (Edge, error) {
	head, err := t.Head() // first: it writes what the transaction holds (direct)
	if err != nil {
		return Edge{}, err
	}
	t.dropEdges = true
	row := t.f.conn.QueryRowContext(bg, `INSERT INTO edges (kind, follower, node, topic, filter, cursor, created)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, follower, topic) DO UPDATE SET node = excluded.node, filter = excluded.filter
		RETURNING `+edgeCols, int(kind), follower, node, topic, filter, int64(head), now.UnixNano())
	e, err := scanEdge(row)
	if err != nil {
		return Edge{}, err
	}
	t.rec(opAddEdge, e.ID, int(kind), follower, node, topic, filter, head, now.UnixNano())
	es := []Edge{e}
	err = t.withFloor(es)
	es[0].describe()
	return es[0], err
}

// RemoveEdge removes one edge; it reports whether it existed.
func (t *Tx) RemoveEdge(kind abi.FollowerKind, follower, topic string) (bool, error) {
	if err := t.direct(); err != nil {
		return false, err
	}
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE kind = ? AND follower = ? AND topic = ?`, int(kind), follower, topic)
	if err != nil {
		return false, err
	}
	t.rec(opRemoveEdge, int(kind), follower, topic)
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveEdgeID removes the edge with id; it reports whether it existed.
func (t *Tx) RemoveEdgeID(id int64) (bool, error) {
	if err := t.direct(); err != nil {
		return false, err
	}
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE id = ?`, id)
	if err != nil {
		return false, err
	}
	t.rec(opRemoveEdgeID, id)
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveFollower removes every edge a follower holds on this publisher.
func (t *Tx) RemoveFollower(kind abi.FollowerKind, follower string) (int, error) {
	if err := t.direct(); err != nil {
		return 0, err
	}
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE kind = ? AND follower = ?`, int(kind), follower)
	if err != nil {
		return 0, err
	}
	t.rec(opRemoveFollow, int(kind), follower)
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Edges lists every edge.
func (t *Tx) Edges() ([]Edge, error) {
	es, err := t.queryEdges(`SELECT ` + edgeCols + ` FROM edges ORDER BY id`)
	if err != nil {
		return nil, err
	}
	for i := range es {
		es[i].describe()
	}
	return es, t.withFloor(es)
}

// MayHaveEdges reports whether the publisher may have followers: false only
// when the edge cache is loaded and empty, so a publish with nobody to
// deliver to costs no pump round.
func (f *File) MayHaveEdges() bool { return f.edges == nil || len(f.edges) > 0 }

// CachedEdges returns the file's edges as Edges does, loading them once
// and then from memory: the pump reads them every round. Commits keep the
// cache current and rollbacks drop it. The slice is the cache itself: read
// it, do not change it.
func (t *Tx) CachedEdges() ([]Edge, error) {
	if t.f.edges != nil {
		return t.f.edges, nil
	}
	all, err := t.Edges()
	if err != nil {
		return nil, err
	}
	if all == nil {
		all = []Edge{}
	}
	t.f.edges, t.f.edgesGen = all, edgeGens.Add(1)
	return all, nil
}

// edgeGens numbers edge cache loads across every file of the process, so
// a generation is never seen twice, even from a file closed and opened
// again.
var edgeGens atomic.Uint64

// EdgesGeneration names the edges CachedEdges returned: it changes when an
// edge is added, removed or followed again (the cache is loaded anew) and
// stays while only cursors, attempts and an object follower's node move
// (they are patched in place). The pump rebuilds what it derives from the
// edges, such as each node's connection edge set, only when it changes.
func (t *Tx) EdgesGeneration() uint64 { return t.f.edgesGen }

// AdvanceConnections records that every connection edge has done at least
// seq, in one row however many connections there are. A round owes every
// connection edge behind the head (they never back off) and advances each
// to the batch's last seq whether or not its push landed, so their cursors
// move together; an edge created later starts at the head, above the floor.
// A connection edge's cursor is the larger of its row's and this floor.
// One row instead of one per connection: at 5,000 sockets the per-row
// update was a fifth of a publish round's CPU.
func (t *Tx) AdvanceConnections(seq uint64) error {
	if err := t.direct(); err != nil {
		return err
	}
	if _, err := t.f.floorPut.ExecContext(bg, int64(seq)); err != nil {
		return fmt.Errorf("advance connection edges: %w", err)
	}
	t.rec(opConnFloor, seq)
	t.patches = append(t.patches, func(es []Edge) {
		for i := range es {
			if es[i].Kind == abi.FollowerConnection {
				es[i].Cursor = max(es[i].Cursor, seq)
			}
		}
	})
	return nil
}

// connFloor returns the seq every connection edge has done. Its callers
// read the edges first, which wrote what the transaction holds.
func (t *Tx) connFloor() (uint64, error) {
	var floor int64
	if err := t.f.floorGet.QueryRowContext(bg).Scan(&floor); err != nil {
		return 0, fmt.Errorf("connection floor: %w", err)
	}
	return uint64(floor), nil
}

// withFloor raises connection edges' cursors to the floor.
func (t *Tx) withFloor(es []Edge) error {
	floor, err := t.connFloor()
	if err != nil || floor == 0 {
		return err
	}
	for i := range es {
		if es[i].Kind == abi.FollowerConnection {
			es[i].Cursor = max(es[i].Cursor, floor)
		}
	}
	return nil
}

// DueNow makes the unplaced object edges of follower due at once (it is
// served again) and reports how many there were.
func (t *Tx) DueNow(follower string) (int, error) {
	if err := t.direct(); err != nil {
		return 0, err
	}
	res, err := t.f.conn.ExecContext(bg, `UPDATE edges SET next_due = 0 WHERE kind = ? AND follower = ? AND unplaced > 0`, int(abi.FollowerObject), follower)
	if err != nil {
		return 0, fmt.Errorf("edges of %s due: %w", follower, err)
	}
	k, _ := res.RowsAffected()
	if k > 0 {
		t.rec(opDueNow, follower)
		t.patches = append(t.patches, func(es []Edge) {
			for i := range es {
				if es[i].Kind == abi.FollowerObject && es[i].Follower == follower && es[i].Unplaced > 0 {
					es[i].NextDue = 0
				}
			}
		})
	}
	return int(k), nil
}

// AdvanceEdge records an edge's progress: the cursor only moves forward;
// attempts and unplaced are its failure and not-located streaks; a
// non-empty node rehomes the follower.
func (t *Tx) AdvanceEdge(id int64, cursor uint64, attempts, unplaced int, nextDue time.Time, node string) error {
	if err := t.direct(); err != nil {
		return err
	}
	var due int64
	if !nextDue.IsZero() {
		due = nextDue.UnixNano()
	}
	var nodeArg any
	if node != "" {
		nodeArg = node
	}
	if _, err := t.f.advance.ExecContext(bg, int64(cursor), attempts, unplaced, due, nodeArg, id); err != nil {
		return fmt.Errorf("advance edge %d: %w", id, err)
	}
	t.rec(opAdvanceEdge, id, cursor, attempts, unplaced, due, node)
	t.patches = append(t.patches, func(es []Edge) {
		for i := range es {
			if es[i].ID == id {
				es[i].Cursor = max(es[i].Cursor, cursor)
				es[i].Attempts, es[i].Unplaced, es[i].NextDue = attempts, unplaced, due
				if node != "" {
					es[i].Node = node
				}
			}
		}
	})
	return nil
}
