package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Alarm is an object's one pending alarm: the time its handler asked for,
// the failed runs so far and when the next run is due (Time at first,
// later the retry's time). It lives in the object's file, so it commits
// with the handler that set it, survives a crash and reaches the copies
// with the rest of the file.
type Alarm struct {
	Time     time.Time `json:"time"`
	Attempts int       `json:"attempts"`
	Next     time.Time `json:"next"`
}

const alarmRow = `SELECT time, attempts, next FROM alarm WHERE one = 1`

func scanAlarm(row *sql.Row) (Alarm, bool, error) {
	var at, next int64
	var a Alarm
	err := row.Scan(&at, &a.Attempts, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return Alarm{}, false, nil
	}
	if err != nil {
		return Alarm{}, false, fmt.Errorf("alarm: %w", err)
	}
	a.Time, a.Next = time.Unix(0, at), time.Unix(0, next)
	return a, true, nil
}

// Alarm reads the pending alarm in this transaction.
func (t *Tx) Alarm() (Alarm, bool, error) {
	if err := t.direct(); err != nil {
		return Alarm{}, false, err
	}
	return scanAlarm(t.f.conn.QueryRowContext(bg, alarmRow))
}

// Alarm reads the pending alarm as of the last commit.
func (f *File) Alarm() (Alarm, bool, error) { return scanAlarm(f.conn.QueryRowContext(bg, alarmRow)) }

// SetAlarm sets the pending alarm, replacing any other.
func (t *Tx) SetAlarm(a Alarm) error {
	if err := t.direct(); err != nil {
		return err
	}
	t.alarmChanged = true
	_, err := t.f.conn.ExecContext(bg, `INSERT INTO alarm (one, time, attempts, next) VALUES (1, ?, ?, ?)
		ON CONFLICT (one) DO UPDATE SET time = excluded.time, attempts = excluded.attempts, next = excluded.next`,
		a.Time.UnixNano(), a.Attempts, a.Next.UnixNano())
	t.rec(opSetAlarm, a.Time.UnixNano(), a.Attempts, a.Next.UnixNano())
	if err != nil {
		return fmt.Errorf("set alarm: %w", err)
	}
	return nil
}

// DeleteAlarm removes the pending alarm, if any.
func (t *Tx) DeleteAlarm() error {
	if err := t.direct(); err != nil {
		return err
	}
	t.alarmChanged = true
	_, err := t.f.conn.ExecContext(bg, `DELETE FROM alarm WHERE one = 1`)
	t.rec(opDeleteAlarm)
	if err != nil {
		return fmt.Errorf("delete alarm: %w", err)
	}
	return nil
}

// AlarmChanged reports whether the transaction wrote the alarm (a part it
// rolled back to a savepoint included): the caller reads it again after
// the commit to schedule what the file holds.
func (t *Tx) AlarmChanged() bool { return t.alarmChanged }

// ReadAlarm reads the pending alarm of the object file at path through a
// read-only connection, without opening the file for writing: how a
// starting node finds its objects' alarms without activating them. A file
// made before alarms existed has none; one that does not exist wraps
// os.ErrNotExist.
func ReadAlarm(ctx context.Context, path string) (Alarm, bool, error) {
	db, err := openReadOnly(path)
	if err != nil {
		return Alarm{}, false, err
	}
	defer db.Close()
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return Alarm{}, false, fmt.Errorf("%s: schema version: %w", path, err)
	}
	if v < alarmsSince {
		return Alarm{}, false, nil
	}
	a, ok, err := scanAlarm(db.QueryRowContext(ctx, alarmRow))
	if err != nil {
		return Alarm{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return a, ok, nil
}
