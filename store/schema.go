package store

import (
	"context"
	"database/sql"
	"fmt"
)

// upgrade brings a file made by an earlier version to the current schema:
// every table is created where missing, and columns are added where
// missing (checked by name, so it is idempotent and needs no version
// number): edges.unplaced came with backing off followers that cannot be
// located.
func upgrade(ctx context.Context, c *sql.Conn) error {
	if _, err := c.ExecContext(ctx, schema); err != nil {
		return err
	}
	var n int
	if err := c.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info('edges') WHERE name = 'unplaced'`).Scan(&n); err != nil {
		return fmt.Errorf("schema upgrade: %w", err)
	}
	if n == 0 {
		if _, err := c.ExecContext(ctx, `ALTER TABLE edges ADD COLUMN unplaced INTEGER NOT NULL DEFAULT 0`); err != nil {
			return fmt.Errorf("schema upgrade: edges.unplaced: %w", err)
		}
	}
	return nil
}

const schema = `
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
