-- An object file as the binary of commit 017f875 made it (user_version 3,
-- the last schema before recorded calls): version 2's tables and the
-- alarm, with a row in each.
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
CREATE TABLE IF NOT EXISTS replication (
	one     INTEGER PRIMARY KEY CHECK (one = 1),
	applied INTEGER NOT NULL,
	seq     INTEGER NOT NULL,
	sum     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS alarm (
	one      INTEGER PRIMARY KEY CHECK (one = 1),
	time     INTEGER NOT NULL,
	attempts INTEGER NOT NULL,
	next     INTEGER NOT NULL
);
INSERT INTO alarm (one, time, attempts, next) VALUES (1, 1800000000000000000, 0, 1800000000000000000);
INSERT INTO state (key, value) VALUES (CAST('count' AS BLOB), CAST('7' AS BLOB));
INSERT INTO log (seq, topic, payload, time) VALUES (1, 't', CAST('{"u":"ann"}' AS BLOB), 100);
INSERT INTO cursors (publisher, topic, seq) VALUES ('chat/room1', 't', 5);
INSERT INTO replication (one, applied, seq, sum) VALUES (1, 4, 9, 12345);
PRAGMA user_version = 3;
