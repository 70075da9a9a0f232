package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/durable-host/host/abi"
)

// Query selects events of a log, ascending: those with seq in
// (After, Through] on Topic whose payload passes Match. Every reader of a
// log (the pump, streams, ranged deliveries, the holder serving a range)
// asks with one.
type Query struct {
	// After is exclusive.
	After uint64
	// Through, when set, is the last seq wanted, and the range must be in
	// this copy of the log: a log that ends before it fails with ErrNoLog
	// (a stale copy). 0: no upper bound.
	Through uint64
	// Capped leaves out the events after Cap, with no error: what a
	// reader may see of a log whose tail is not shipped yet (Cap 0: no
	// event is shipped yet, so none is seen).
	Capped bool
	Cap    uint64
	// CapAfter, when set, is asked once the read's snapshot is taken
	// (after its first row): the events past the cap it gives are left
	// out. What it knows of commits is then at least as new as the
	// snapshot: the output gate's cap, which must not show a commit not
	// yet durable.
	CapAfter func() (uint64, bool)
	// Topic selects one topic; "" every topic.
	Topic string
	// Match, when set, keeps the events whose payload it accepts: a
	// delivery filter (the store knows no filter syntax). nil: every event.
	Match func(payload []byte) bool
	// Limit caps the events returned (0: no cap). MaxBytes stops the read
	// once that much payload is in (0: no cap); at least one event is
	// returned when any matches.
	Limit, MaxBytes int
	// Latest asks for the latest matching event only (0 or 1 of them).
	Latest bool
}

// ErrNoLog is returned when a range is asked of a copy of a log that lacks
// it: the file does not exist, or its log ends before the range does.
var ErrNoLog = errors.New("events not in this copy of the log")

// Read returns the events q selects, from this transaction's view of the
// log.
func (t *Tx) Read(q Query) ([]abi.Event, error) {
	if err := t.direct(); err != nil {
		return nil, err
	}
	return readLog(bg, t.f.conn, q)
}

// Read returns the events q selects from the object file at path, through
// a read-only connection of its own that sees committed transactions only:
// streams and ranged deliveries read a file its object may be writing. A
// file that does not exist yet, or whose first open is still creating its
// schema, has no events (with q.Through set: ErrNoLog).
func Read(ctx context.Context, path string, q Query) ([]abi.Event, error) {
	db, err := openReadOnly(path)
	if errors.Is(err, os.ErrNotExist) {
		if q.Through > 0 {
			return nil, fmt.Errorf("%w: %v", ErrNoLog, err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer db.Close()
	evs, err := readLog(ctx, db, q)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		// The object's first call is creating the file.
		if q.Through > 0 {
			return nil, fmt.Errorf("%w: %s has no log yet", ErrNoLog, path)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return evs, nil
}

// openReadOnly opens the object file at path read-only; the error wraps
// os.ErrNotExist when there is no such file.
func openReadOnly(path string) (*sql.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn(path, url.Values{"mode": {"ro"}}))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

type queryer interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

// readLog runs q on db.
func readLog(ctx context.Context, db queryer, q Query) ([]abi.Event, error) {
	if q.Through > 0 {
		var head int64
		if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM log`).Scan(&head); err != nil {
			return nil, err
		}
		if uint64(head) < q.Through {
			return nil, fmt.Errorf("%w: copy ends at %d, range ends at %d", ErrNoLog, head, q.Through)
		}
	}
	query := `SELECT seq, topic, payload, time FROM log WHERE seq > ?`
	args := []any{int64(q.After)}
	if q.Through > 0 {
		query += ` AND seq <= ?`
		args = append(args, int64(q.Through))
	}
	if q.Capped {
		query += ` AND seq <= ?`
		args = append(args, int64(q.Cap))
	}
	if q.Topic != "" {
		query += ` AND topic = ?`
		args = append(args, q.Topic)
	}
	limit := q.Limit
	if q.Latest {
		query += ` ORDER BY seq DESC`
		limit = 1
	} else {
		query += ` ORDER BY seq`
	}
	if limit > 0 && q.Match == nil {
		// With a filter, rows are read until enough of them match.
		query += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := db.QueryContext(ctx, query, args...)
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
		if q.Match != nil && !q.Match(e.Payload) {
			continue
		}
		e.Seq = uint64(seq)
		size += len(e.Payload)
		out = append(out, e)
		if (limit > 0 && len(out) >= limit) || (q.MaxBytes > 0 && size >= q.MaxBytes) {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if q.CapAfter == nil || len(out) == 0 {
		return out, nil
	}
	c, ok := q.CapAfter()
	// The snapshot's work is done: its connection is free for a read
	// again (the only one of a read-only file, or a transaction's).
	rows.Close()
	if !ok {
		return out, nil
	}
	kept := out[:0]
	for _, e := range out {
		if e.Seq <= c {
			kept = append(kept, e)
		}
	}
	if q.Latest && len(kept) == 0 {
		// The latest is not durable yet: the latest that is, read under
		// the cap (what it leaves is durable already).
		q.CapAfter = nil
		if !q.Capped || c < q.Cap {
			q.Capped, q.Cap = true, c
		}
		return readLog(ctx, db, q)
	}
	return kept, nil
}
