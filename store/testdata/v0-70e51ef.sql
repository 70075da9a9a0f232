-- An object file as the binary of commit 70e51ef made it (user_version 0):
-- its schema verbatim, with conn_floor, before edges.unplaced.
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
INSERT INTO state (key, value) VALUES (CAST('count' AS BLOB), CAST('7' AS BLOB)), (CAST('name' AS BLOB), CAST('ann' AS BLOB));
INSERT INTO log (seq, topic, payload, time) VALUES
	(1, 't', CAST('{"u":"ann"}' AS BLOB), 100),
	(2, 'other', CAST('x' AS BLOB), 200),
	(3, 't', CAST('{"u":"bob"}' AS BLOB), 300);
INSERT INTO cursors (publisher, topic, seq) VALUES ('chat/room1', 't', 5);
INSERT INTO edges (id, kind, follower, node, topic, filter, cursor, attempts, next_due, created) VALUES
	(1, 1, 'A.1', 'A', 't', '', 1, 0, 0, 10),
	(2, 2, 'tally/1', 'A', 't', 'u=ann', 1, 2, 99, 11);
INSERT INTO conn_floor (one, cursor) VALUES (1, 3);
