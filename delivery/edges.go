package delivery

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"fmt"

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
	Attempts int              `json:"attempts"`
	NextDue  int64            `json:"next_due,omitempty"` // Unix ns; 0 = now
	Created  int64            `json:"created"`
}

const edgeCols = `id, kind, follower, node, topic, filter, cursor, attempts, next_due, created`

func scanEdge(row interface{ Scan(...any) error }) (Edge, error) {
	var e Edge
	var kind int
	var cursor int64
	err := row.Scan(&e.ID, &kind, &e.Follower, &e.Node, &e.Topic, &e.Filter, &cursor, &e.Attempts, &e.NextDue, &e.Created)
	e.Kind = abi.FollowerKind(kind)
	e.KindName = e.Kind.String()
	e.Cursor = uint64(cursor)
	return e, err
}

func (t *Tx) queryEdges(q string, args ...any) ([]Edge, error) {
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
	head, err := t.Head()
	if err != nil {
		return Edge{}, err
	}
	t.dropEdges = true
	row := t.f.conn.QueryRowContext(bg, `INSERT INTO edges (kind, follower, node, topic, filter, cursor, created)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, follower, topic) DO UPDATE SET node = excluded.node, filter = excluded.filter
		RETURNING `+edgeCols, int(kind), follower, node, topic, filter, int64(head), now.UnixNano())
	return scanEdge(row)
}

// RemoveEdge removes one edge; it reports whether it existed.
func (t *Tx) RemoveEdge(kind abi.FollowerKind, follower, topic string) (bool, error) {
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE kind = ? AND follower = ? AND topic = ?`, int(kind), follower, topic)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveEdgeID removes the edge with id; it reports whether it existed.
func (t *Tx) RemoveEdgeID(id int64) (bool, error) {
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE id = ?`, id)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveFollower removes every edge a follower holds on this publisher.
func (t *Tx) RemoveFollower(kind abi.FollowerKind, follower string) (int, error) {
	t.dropEdges = true
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE kind = ? AND follower = ?`, int(kind), follower)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Edges lists every edge.
func (t *Tx) Edges() ([]Edge, error) {
	return t.queryEdges(`SELECT ` + edgeCols + ` FROM edges ORDER BY id`)
}

// MayHaveEdges reports whether the publisher may have followers: false only
// when the edge cache is loaded and empty, so a publish with nobody to
// deliver to costs no pump round.
func (f *File) MayHaveEdges() bool { return f.edges == nil || len(f.edges) > 0 }

// cachedEdges returns the file's edges, loading them once.
func (t *Tx) cachedEdges() ([]Edge, error) {
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
	t.f.edges = all
	return all, nil
}

// DueEdges lists edges behind head whose next attempt is due at now.
func (t *Tx) DueEdges(head uint64, now time.Time) ([]Edge, error) {
	all, err := t.cachedEdges()
	if err != nil {
		return nil, err
	}
	var out []Edge
	ns := now.UnixNano()
	for _, e := range all {
		if e.Cursor < head && e.NextDue <= ns {
			out = append(out, e)
		}
	}
	return out, nil
}

// NextDue returns the earliest future attempt among edges behind head.
func (t *Tx) NextDue(head uint64) (time.Time, bool, error) {
	all, err := t.cachedEdges()
	if err != nil {
		return time.Time{}, false, err
	}
	var next int64
	found := false
	for _, e := range all {
		if e.Cursor < head && (!found || e.NextDue < next) {
			next, found = e.NextDue, true
		}
	}
	if !found {
		return time.Time{}, false, nil
	}
	return time.Unix(0, next), true, nil
}

// Events returns up to limit events after seq in order, stopping once
// maxBytes of payload are collected (at least one event is returned).
func (t *Tx) Events(after uint64, limit, maxBytes int) ([]abi.Event, error) {
	return readEvents(t.f.conn, after, 0, "", limit, maxBytes)
}

type queryer interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// readEvents reads events with seq in (after, upTo] (upTo 0 = no bound),
// of topic when topic is not empty.
func readEvents(q queryer, after, upTo uint64, topic string, limit, maxBytes int) ([]abi.Event, error) {
	query := `SELECT seq, topic, payload, time FROM log WHERE seq > ?`
	args := []any{int64(after)}
	if upTo > 0 {
		query += ` AND seq <= ?`
		args = append(args, int64(upTo))
	}
	if topic != "" {
		query += ` AND topic = ?`
		args = append(args, topic)
	}
	query += ` ORDER BY seq LIMIT ?`
	args = append(args, limit)
	rows, err := q.QueryContext(bg, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []abi.Event
	size := 0
	for rows.Next() {
		var e abi.Event
		var seq int64
		if err := rows.Scan(&seq, &e.Topic, &e.Payload, &e.Time); err != nil {
			return nil, err
		}
		e.Seq = uint64(seq)
		size += len(e.Payload)
		out = append(out, e)
		if size >= maxBytes {
			break
		}
	}
	return out, rows.Err()
}

// ErrNoLog is returned when a range is asked of a file that lacks it.
var ErrNoLog = errors.New("events not in this copy of the log")

// AdvanceEdges moves the cursors of many edges forward to cursor in one
// statement: a round's connection edges, which all advance together.
func (t *Tx) AdvanceEdges(ids []int64, cursor uint64) error {
	if len(ids) == 0 {
		return nil
	}
	list, _ := json.Marshal(ids)
	if _, err := t.f.advanceMany.ExecContext(bg, int64(cursor), string(list)); err != nil {
		return fmt.Errorf("advance %d edges: %w", len(ids), err)
	}
	set := make(map[int64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	t.patches = append(t.patches, func(es []Edge) {
		for i := range es {
			if set[es[i].ID] {
				es[i].Cursor = max(es[i].Cursor, cursor)
			}
		}
	})
	return nil
}
