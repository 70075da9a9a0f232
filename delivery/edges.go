package delivery

import (
	"context"
	"database/sql"
	"errors"
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
	row := t.f.conn.QueryRowContext(bg, `INSERT INTO edges (kind, follower, node, topic, filter, cursor, created)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, follower, topic) DO UPDATE SET node = excluded.node, filter = excluded.filter
		RETURNING `+edgeCols, int(kind), follower, node, topic, filter, int64(head), now.UnixNano())
	return scanEdge(row)
}

// RemoveEdge removes one edge; it reports whether it existed.
func (t *Tx) RemoveEdge(kind abi.FollowerKind, follower, topic string) (bool, error) {
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE kind = ? AND follower = ? AND topic = ?`, int(kind), follower, topic)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveEdgeID removes the edge with id; it reports whether it existed.
func (t *Tx) RemoveEdgeID(id int64) (bool, error) {
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM edges WHERE id = ?`, id)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveFollower removes every edge a follower holds on this publisher.
func (t *Tx) RemoveFollower(kind abi.FollowerKind, follower string) (int, error) {
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

// DueEdges lists edges behind head whose next attempt is due at now.
func (t *Tx) DueEdges(head uint64, now time.Time) ([]Edge, error) {
	return t.queryEdges(`SELECT `+edgeCols+` FROM edges WHERE cursor < ? AND next_due <= ? ORDER BY id`, int64(head), now.UnixNano())
}

// NextDue returns the earliest future attempt among edges behind head.
func (t *Tx) NextDue(head uint64) (time.Time, bool, error) {
	var ns sql.NullInt64
	err := t.f.conn.QueryRowContext(bg, `SELECT MIN(next_due) FROM edges WHERE cursor < ?`, int64(head)).Scan(&ns)
	if err != nil || !ns.Valid {
		return time.Time{}, false, err
	}
	return time.Unix(0, ns.Int64), true, nil
}

// HasEdges reports whether the publisher has any edge.
func (t *Tx) HasEdges() (bool, error) {
	var n int
	err := t.f.conn.QueryRowContext(bg, `SELECT EXISTS (SELECT 1 FROM edges)`).Scan(&n)
	return n == 1, err
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
