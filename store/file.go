package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/durable-host/host/abi"
)

// Sync is SQLite's synchronous setting for object files.
type Sync string

// Sync settings. With WAL, Normal survives a crash of the process (a commit
// is in the OS before it returns) but the last commits may be lost on power
// loss; Full fsyncs every commit and survives power loss.
const (
	SyncNormal Sync = "NORMAL"
	SyncFull   Sync = "FULL"
)

// File is one object's SQLite file: its state, its event log, its edges (as
// a publisher) and its receive cursors (as a follower). It is used by one
// goroutine at a time: the object's single handler, or its pump between
// handlers.
type File struct {
	path string
	db   *sql.DB
	conn *sql.Conn

	get, put, del, scan, appendLog, head *sql.Stmt
	appendAt, appendAt16                 *sql.Stmt
	cursorGet, cursorPut                 *sql.Stmt
	advance, floorGet, floorPut          *sql.Stmt
	savepoint, release, rollbackTo       *sql.Stmt

	// edges caches the edge rows for the pump, which reads them every
	// round; nil when not loaded. Commits keep it current, rollbacks drop
	// it. edgesGen names the load (EdgesGeneration).
	edges    []Edge
	edgesGen uint64

	// ship, when set, makes each change set durable before its commit
	// (SetShipper); pos is the file's position, read at Open and moved by
	// each commit that ships. captureAll records change sets without
	// shipping them.
	ship       Shipper
	pos        Position
	captureAll bool

	logSync logSync
	// sync is the synchronous setting in force (SetSync).
	sync Sync
}

// Open opens the object file at path, creating it if needed and upgrading
// a file written by an earlier version to the current schema (Version).
func Open(ctx context.Context, path string, sync Sync) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if sync == "" {
		sync = SyncNormal
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+string(sync)+")")
	q.Add("_pragma", "temp_store(MEMORY)")
	db, err := sql.Open("sqlite", dsn(path, q))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	f := &File{path: path, db: db, sync: sync}
	if err := f.init(ctx); err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return f, nil
}

// dsn names the file at path for the driver, with q's parameters; every
// connection waits up to 10 s for another's write lock.
func dsn(path string, q url.Values) string {
	q.Add("_pragma", "busy_timeout(10000)")
	return "file:" + path + "?" + q.Encode()
}

func (f *File) init(ctx context.Context) error {
	var err error
	if f.conn, err = f.db.Conn(ctx); err != nil {
		return err
	}
	if err := migrate(ctx, f.conn); err != nil {
		return err
	}
	prep := func(dst **sql.Stmt, q string) {
		if err == nil {
			*dst, err = f.conn.PrepareContext(ctx, q)
		}
	}
	prep(&f.get, `SELECT value FROM state WHERE key = ?`)
	prep(&f.put, `INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`)
	prep(&f.del, `DELETE FROM state WHERE key = ?`)
	prep(&f.scan, `SELECT key, value FROM state WHERE key >= ? ORDER BY key LIMIT ?`)
	prep(&f.appendLog, `INSERT INTO log (topic, payload, time) VALUES (?, ?, ?)`)
	prep(&f.appendAt, `INSERT INTO log (seq, topic, payload, time) VALUES (?, ?, ?, ?)`)
	prep(&f.appendAt16, `INSERT INTO log (seq, topic, payload, time) VALUES `+strings.Repeat(`(?, ?, ?, ?), `, appendRows-1)+`(?, ?, ?, ?)`)
	prep(&f.head, `SELECT COALESCE(MAX(seq), 0) FROM log`)
	prep(&f.cursorGet, `SELECT seq FROM cursors WHERE publisher = ? AND topic = ?`)
	prep(&f.cursorPut, `INSERT INTO cursors (publisher, topic, seq) VALUES (?, ?, ?) ON CONFLICT (publisher, topic) DO UPDATE SET seq = excluded.seq`)
	prep(&f.advance, `UPDATE edges SET cursor = MAX(cursor, ?), attempts = ?, unplaced = ?, next_due = ?, node = COALESCE(?, node) WHERE id = ?`)
	prep(&f.floorGet, `SELECT COALESCE((SELECT cursor FROM conn_floor WHERE one = 1), 0)`)
	prep(&f.savepoint, `SAVEPOINT call`)
	prep(&f.release, `RELEASE call`)
	prep(&f.rollbackTo, `ROLLBACK TO call`)
	prep(&f.floorPut, `INSERT INTO conn_floor (one, cursor) VALUES (1, ?) ON CONFLICT (one) DO UPDATE SET cursor = MAX(cursor, excluded.cursor)`)
	if err == nil {
		f.pos, err = f.readPosition()
	}
	return err
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Close closes the file.
func (f *File) Close() error {
	// Statements prepared on the connection keep it (and its three file
	// descriptors) open until they are closed.
	for _, st := range []*sql.Stmt{f.get, f.put, f.del, f.scan, f.appendLog, f.appendAt, f.appendAt16, f.head, f.cursorGet, f.cursorPut, f.advance, f.floorGet, f.floorPut, f.savepoint, f.release, f.rollbackTo} {
		if st != nil {
			st.Close()
		}
	}
	if f.conn != nil {
		f.conn.Close()
	}
	err := f.db.Close()
	f.closeLogSync()
	return err
}

// SetSync sets how the next commits sync, outside a transaction (SQLite
// refuses a change inside one).
func (f *File) SetSync(s Sync) error {
	if s == f.sync {
		return nil
	}
	if _, err := f.conn.ExecContext(context.Background(), "PRAGMA synchronous = "+string(s)); err != nil {
		return fmt.Errorf("set synchronous %s: %w", s, err)
	}
	f.sync = s
	return nil
}

// Tx is one transaction on a File: a handler's writes and publishes, or the
// pump's edge updates.
type Tx struct {
	f         *File
	done      bool
	published int
	// lastSeq is the seq of the last event appended (0: none), as of
	// the last savepoint rolled back to.
	lastSeq uint64
	// written holds the state keys this transaction wrote, with what it
	// wrote (absent: deleted), so a read of one is answered without
	// SQLite: in a batch of calls each reading the key the one before
	// wrote, that is most reads. Writing through, a savepoint rolled back
	// to drops it; deferring (Defer), it also holds the writes not yet in
	// SQLite (dirty counts them), and a savepoint rolled back to puts it
	// back as it was through undo.
	written map[string]stateValue
	dirty   int

	// Deferred writes (deferred.go): deferring is set by Defer; appends
	// are the events held, the first flushedAppends of them in SQLite;
	// nextSeq is the seq the next event takes (0: not read yet);
	// heldBytes bounds what is held; sp is the savepoint marked, undo how
	// to put back what changed in memory since.
	deferring      bool
	appends        []deferredAppend
	flushedAppends int
	nextSeq        uint64
	heldBytes      int
	sp             *deferredMark
	mark           deferredMark // what sp points at: one savepoint at a time
	undo           []undoRec

	// Edge cache upkeep: patches apply to File.edges on commit; a change
	// the cache cannot follow drops it.
	dropEdges bool
	patches   []func([]Edge)

	// ops is the change set so far, when capture is on; pos is the
	// position SetPosition wrote, the file's once committed.
	ops []byte
	pos *Position
	// applying is set while Apply runs another file's change set: the
	// writes it makes are not this file's own to record.
	applying bool
	// alarmChanged: the transaction wrote the alarm (AlarmChanged).
	alarmChanged bool
}

// Begin starts a write transaction. SQLite calls use a background context:
// a cancellable one would cost a goroutine per statement in the driver, and
// the VM's budget stops the guest that issues them.
func (f *File) Begin() (*Tx, error) {
	if _, err := f.conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &Tx{f: f}, nil
}

// Commit commits the transaction.
func (t *Tx) Commit() error {
	if t.done {
		return errors.New("transaction already finished")
	}
	t.done = true
	if err := t.flush(); err != nil {
		t.f.conn.ExecContext(context.Background(), "ROLLBACK")
		t.f.edges = nil
		return fmt.Errorf("commit: %w", err)
	}
	shipped := false
	if t.f.ship != nil && len(t.ops) > 0 {
		pos, err := t.f.ship(t.ops, t.f.pos)
		if err == nil {
			err = t.SetPosition(pos)
			shipped = err == nil
		}
		if err != nil {
			t.f.conn.ExecContext(context.Background(), "ROLLBACK")
			t.f.edges = nil
			return fmt.Errorf("commit: %w", err)
		}
	}
	if _, err := t.f.conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		t.f.conn.ExecContext(context.Background(), "ROLLBACK")
		t.f.edges = nil
		if shipped {
			// The stream holds a change this file does not: it is behind.
			return fmt.Errorf("commit: %w: %v", ErrBehind, err)
		}
		return fmt.Errorf("commit: %w", err)
	}
	if t.pos != nil {
		t.f.pos = *t.pos
	}
	switch {
	case t.dropEdges:
		t.f.edges = nil
	case t.f.edges != nil:
		for _, p := range t.patches {
			p(t.f.edges)
		}
	}
	return nil
}

// Rollback abandons the transaction; after Commit it does nothing.
func (t *Tx) Rollback() error {
	if t.done {
		return nil
	}
	t.done = true
	if t.dropEdges || len(t.patches) > 0 {
		t.f.edges = nil
	}
	_, err := t.f.conn.ExecContext(context.Background(), "ROLLBACK")
	return err
}

// LastSeq is the seq of the last event this transaction appended and did
// not roll back (0: none): once committed, the log's head.
func (t *Tx) LastSeq() uint64 { return t.lastSeq }

// Published reports how many events this transaction appended.
func (t *Tx) Published() int { return t.published }

var bg = context.Background()

// Get reads a state value.
func (t *Tx) Get(key []byte) ([]byte, bool, error) {
	if w, ok := t.written[string(key)]; ok {
		return w.value, w.present, nil
	}
	var v []byte
	err := t.f.get.QueryRowContext(bg, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if v == nil {
		v = []byte{}
	}
	return v, true, nil
}

// Put writes a state value.
func (t *Tx) Put(key, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	if t.deferWrite(key, value, false) {
		t.rec(opPut, key, value)
		return t.overHeld()
	}
	if err := t.direct(); err != nil {
		return err
	}
	_, err := t.f.put.ExecContext(bg, key, value)
	t.rec(opPut, key, value)
	t.wrote(key, value, false, err)
	return err
}

// Delete removes a state value.
func (t *Tx) Delete(key []byte) error {
	if t.deferWrite(key, nil, true) {
		t.rec(opDelete, key)
		return t.overHeld()
	}
	if err := t.direct(); err != nil {
		return err
	}
	_, err := t.f.del.ExecContext(bg, key)
	t.rec(opDelete, key)
	t.wrote(key, nil, true, err)
	return err
}

// stateValue is a state key's value as a transaction wrote it.
type stateValue struct {
	value   []byte
	present bool
	// dirty: held by a deferring transaction, not yet in SQLite.
	dirty bool
}

// maxWritten bounds the keys a transaction remembers writing.
const maxWritten = 256

// wrote remembers what a write left under key: value (copied: the
// caller's slice may be the guest's memory), or nothing when deleted. A
// failed write, or one of a value over maxCachedValue, forgets the key:
// SQLite answers for it.
func (t *Tx) wrote(key, value []byte, deleted bool, err error) {
	k := string(key)
	if err != nil || len(value) > maxCachedValue {
		t.dropEntry(k)
		return
	}
	if _, ok := t.written[k]; !ok && len(t.written) >= maxWritten {
		return
	}
	if deleted {
		t.setEntry(k, stateValue{})
		return
	}
	t.setEntry(k, stateValue{value: bytes.Clone(value), present: true})
}

// Scan returns up to limit pairs whose key starts with prefix, in key order.
func (t *Tx) Scan(prefix []byte, limit int) ([]abi.Pair, error) {
	if err := t.direct(); err != nil {
		return nil, err
	}
	rows, err := t.f.scan.QueryContext(bg, append([]byte{}, prefix...), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []abi.Pair
	for rows.Next() {
		var p abi.Pair
		if err := rows.Scan(&p.Key, &p.Value); err != nil {
			return nil, err
		}
		if !bytes.HasPrefix(p.Key, prefix) {
			break
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Append appends an event to the log and returns its seq.
func (t *Tx) Append(topic string, payload []byte, at time.Time) (uint64, error) {
	if payload == nil {
		payload = []byte{}
	}
	if seq, ok, err := t.deferAppend(topic, payload, at); ok {
		if err != nil {
			return 0, err
		}
		t.published++
		t.lastSeq = seq
		t.rec(opAppend, seq, topic, payload, at.UnixNano())
		return seq, t.overHeld()
	}
	if err := t.direct(); err != nil {
		return 0, err
	}
	res, err := t.f.appendLog.ExecContext(bg, topic, payload, at.UnixNano())
	if err != nil {
		return 0, err
	}
	seq, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	t.published++
	t.lastSeq = uint64(seq)
	t.rec(opAppend, uint64(seq), topic, payload, at.UnixNano())
	return uint64(seq), nil
}

// Head returns the log's last seq (0 when empty).
func (t *Tx) Head() (uint64, error) {
	if err := t.direct(); err != nil {
		return 0, err
	}
	return t.f.Head()
}

// Head returns the log's last seq (0 when empty).
func (f *File) Head() (uint64, error) {
	var h int64
	err := f.head.QueryRowContext(bg).Scan(&h)
	return uint64(h), err
}

// Cursor returns the receive cursor for (publisher, topic): the last seq
// whose handler committed here.
func (t *Tx) Cursor(publisher, topic string) (uint64, error) {
	if err := t.direct(); err != nil {
		return 0, err
	}
	var s int64
	err := t.f.cursorGet.QueryRowContext(bg, publisher, topic).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return uint64(s), err
}

// SetCursor advances the receive cursor inside this transaction.
func (t *Tx) SetCursor(publisher, topic string, seq uint64) error {
	if err := t.direct(); err != nil {
		return err
	}
	_, err := t.f.cursorPut.ExecContext(bg, publisher, topic, int64(seq))
	t.rec(opSetCursor, publisher, topic, seq)
	return err
}

// Limit caps the file at max bytes (0 lifts the cap): a write that needs a
// page past it fails, IsFull reports that error, and the transaction rolls
// back with nothing lost. A cap below the current size freezes growth:
// updates in place and deletes still work.
func (f *File) Limit(limit int64) error {
	pages := int64(0xfffffffe) // SQLite's own maximum
	if limit > 0 {
		var size int64
		if err := f.conn.QueryRowContext(bg, `PRAGMA page_size`).Scan(&size); err != nil {
			return err
		}
		pages = max(limit/size, 1)
	}
	// max_page_count never goes below the current page count: asking for
	// less pins the file at its current size.
	_, err := f.conn.ExecContext(bg, `PRAGMA max_page_count = `+strconv.FormatInt(pages, 10))
	return err
}

// Size is the database's size in bytes (pages in use, WAL included).
func (f *File) Size() (int64, error) {
	var pages, size int64
	if err := f.conn.QueryRowContext(bg, `PRAGMA page_count`).Scan(&pages); err != nil {
		return 0, err
	}
	if err := f.conn.QueryRowContext(bg, `PRAGMA page_size`).Scan(&size); err != nil {
		return 0, err
	}
	return pages * size, nil
}

// IsFull reports whether err is SQLite's "database or disk is full": the
// file reached its Limit (or the disk is full).
func IsFull(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL
}
