package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Version is the schema version this package writes, kept in the file's
// PRAGMA user_version. Open upgrades a file at an earlier version and
// refuses one at a later version (written by a newer binary).
const Version = 4

// alarmsSince is the version whose step made the alarm table.
const alarmsSince = 3

// ErrSchemaTooNew is returned by Open for a file written by a newer binary
// whose schema this one does not know.
var ErrSchemaTooNew = errors.New("object file schema is newer than this binary")

// migrations[v] brings a file at version v to v+1. A new file starts at 0
// and takes every step. To change the schema (a column, a table), append a
// step and raise Version; never edit a step that has shipped, since files
// written with it exist.
var migrations = []func(ctx context.Context, c *sql.Conn) error{
	// 0 → 1: files made before the version was kept. Every table is
	// created where missing (a new file, or one made before conn_floor),
	// and edges gains the unplaced column where it lacks it (files made
	// before followers that cannot be located backed off).
	func(ctx context.Context, c *sql.Conn) error {
		if _, err := c.ExecContext(ctx, schemaV1); err != nil {
			return err
		}
		var n int
		if err := c.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info('edges') WHERE name = 'unplaced'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := c.ExecContext(ctx, `ALTER TABLE edges ADD COLUMN unplaced INTEGER NOT NULL DEFAULT 0`); err != nil {
				return fmt.Errorf("edges.unplaced: %w", err)
			}
		}
		return nil
	},
	// 1 → 2: the file's position on its object's change stream, for
	// replicas (files made before replicas have none: position zero).
	func(ctx context.Context, c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS replication (
	one     INTEGER PRIMARY KEY CHECK (one = 1),
	applied INTEGER NOT NULL,
	seq     INTEGER NOT NULL,
	sum     INTEGER NOT NULL
)`)
		return err
	},
	// 2 → 3: the object's one pending alarm (a file made before alarms
	// has none).
	func(ctx context.Context, c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS alarm (
	one      INTEGER PRIMARY KEY CHECK (one = 1),
	time     INTEGER NOT NULL,
	attempts INTEGER NOT NULL,
	next     INTEGER NOT NULL
)`)
		return err
	},
	// 3 → 4: recorded calls, for calls made once in effect (a file made
	// before them has none).
	func(ctx context.Context, c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS calls (
	key     TEXT PRIMARY KEY,
	request BLOB NOT NULL,
	reply   BLOB NOT NULL,
	at      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS calls_at ON calls(at)`)
		return err
	},
}

// schemaV1 is the schema at version 1, as version 0's last binary wrote it.
const schemaV1 = `
CREATE TABLE IF NOT EXISTS state (
	key   BLOB PRIMARY KEY,
	value BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log (
	seq     INTEGER PRIMARY KEY,
	topic   TEXT NOT NULL,
	payload BLOB NOT NULL,
	time    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS log_topic ON log(topic, seq);
CREATE TABLE IF NOT EXISTS edges (
	id       INTEGER PRIMARY KEY,
	kind     INTEGER NOT NULL,
	follower TEXT NOT NULL,
	node     TEXT NOT NULL,
	topic    TEXT NOT NULL,
	filter   TEXT NOT NULL DEFAULT '',
	cursor   INTEGER NOT NULL,
	attempts INTEGER NOT NULL DEFAULT 0,
	unplaced INTEGER NOT NULL DEFAULT 0,
	next_due INTEGER NOT NULL DEFAULT 0,
	created  INTEGER NOT NULL,
	UNIQUE (kind, follower, topic)
);
CREATE TABLE IF NOT EXISTS conn_floor (
	one    INTEGER PRIMARY KEY CHECK (one = 1),
	cursor INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
	publisher TEXT NOT NULL,
	topic     TEXT NOT NULL,
	seq       INTEGER NOT NULL,
	PRIMARY KEY (publisher, topic)
) WITHOUT ROWID;
`

// migrate brings the file on c to Version in one transaction: a crash
// halfway leaves it at its old version, and a reader never sees half a
// schema. A file already at Version costs one pragma read.
func migrate(ctx context.Context, c *sql.Conn) error {
	v, err := userVersion(ctx, c)
	if err != nil {
		return err
	}
	if v == Version {
		return nil
	}
	if v > Version {
		return tooNew(v)
	}
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("schema upgrade: %w", err)
	}
	if err := migrateTx(ctx, c); err != nil {
		c.ExecContext(context.Background(), "ROLLBACK")
		return fmt.Errorf("schema upgrade: %w", err)
	}
	if _, err := c.ExecContext(ctx, "COMMIT"); err != nil {
		c.ExecContext(context.Background(), "ROLLBACK")
		return fmt.Errorf("schema upgrade: %w", err)
	}
	return nil
}

func migrateTx(ctx context.Context, c *sql.Conn) error {
	// Read again under the write lock: another opener may have upgraded it.
	v, err := userVersion(ctx, c)
	switch {
	case err != nil:
		return err
	case v == Version:
		return nil
	case v > Version:
		return tooNew(v)
	}
	for ; v < Version; v++ {
		if err := migrations[v](ctx, c); err != nil {
			return fmt.Errorf("version %d to %d: %w", v, v+1, err)
		}
	}
	// user_version is in the file's header, written with the transaction.
	_, err = c.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", Version))
	return err
}

func tooNew(v int) error {
	return fmt.Errorf("%w: the file is at version %d, this binary knows up to %d", ErrSchemaTooNew, v, Version)
}

func userVersion(ctx context.Context, c *sql.Conn) (int, error) {
	var v int
	if err := c.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}
