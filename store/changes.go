package store

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"strings"
	"time"

	"github.com/durable-host/host/abi"
)

// A change set is what one committed transaction did to the file, as a
// list of operations in a compact binary form: enough for a copy of the
// file that is at the same position to reach the next one by Apply. Every
// write a Tx makes is recorded with the values it wrote (an appended
// event's seq, an added edge's id), never with what to compute, so applying
// needs nothing but the copy's own rows.
//
// Capture is on when the File has a Shipper: a single node without
// replicas records nothing.

// op codes of a change set. Append only: copies written by an older
// binary's home must apply.
const (
	opPut byte = iota + 1
	opDelete
	opAppend       // seq, topic, payload, time
	opAddEdge      // id, kind, follower, node, topic, filter, cursor, created
	opRemoveEdge   // kind, follower, topic
	opRemoveEdgeID // id
	opRemoveFollow // kind, follower
	opConnFloor    // seq
	opDueNow       // follower
	opAdvanceEdge  // id, cursor, attempts, unplaced, due, node ("" keeps it)
	opSetCursor    // publisher, topic, seq
	opSetAlarm     // time, attempts, next
	opDeleteAlarm  // (none)
	opRecordCall   // key, request, reply, at
	opPruneCalls   // before, keep
)

// Position is how far a file is along its object's change stream: the
// number of change sets it holds, the stream sequence of the last one, and
// a checksum over all of them in order. The home writes it with each
// change set it ships, a copy with each one it applies, in the same
// transaction, so the file and its position never disagree.
type Position struct {
	Applied uint64 `json:"applied"`
	Seq     uint64 `json:"seq"`
	Sum     uint64 `json:"sum,string"`
}

// Shipper makes a transaction's changes durable elsewhere before it commits
// (the replicated log): given the change set and the file's position, it
// returns the position after it, or an error, and the transaction rolls
// back with nothing changed. An error wrapping ErrFenced says another node
// holds the object now.
type Shipper func(changes []byte, at Position) (Position, error)

// Errors of replication.
var (
	// ErrFenced: the object's change stream moved on without this file (a
	// node took the object over); this file must not be written again.
	ErrFenced = errors.New("object fenced: another node holds it now")
	// ErrBehind: the change was shipped but the file's own commit failed;
	// the file is behind its stream and must catch up before it is used.
	ErrBehind = errors.New("object file behind its change stream")
	// ErrBadChanges: a change set that does not decode or does not apply.
	ErrBadChanges = errors.New("bad change set")
)

// SetShipper turns change capture on: every transaction that changes the
// file ships its change set through s before it commits. nil turns it off.
func (f *File) SetShipper(s Shipper) { f.ship = s }

// Position returns the file's position on its change stream, as of its
// last commit.
func (f *File) Position() Position { return f.pos }

// readPosition reads the position from the file.
func (f *File) readPosition() (Position, error) {
	var p Position
	var applied, seq, sum int64
	err := f.conn.QueryRowContext(bg, `SELECT applied, seq, sum FROM replication WHERE one = 1`).Scan(&applied, &seq, &sum)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("replication position: %w", err)
	}
	return Position{Applied: uint64(applied), Seq: uint64(seq), Sum: uint64(sum)}, nil
}

// ReadPosition reads the position of the object file at path through a
// read-only connection (the file may be in use); a file that does not exist
// wraps os.ErrNotExist.
func ReadPosition(ctx context.Context, path string) (Position, error) {
	db, err := openReadOnly(path)
	if err != nil {
		return Position{}, err
	}
	defer db.Close()
	var applied, seq, sum int64
	err = db.QueryRowContext(ctx, `SELECT applied, seq, sum FROM replication WHERE one = 1`).Scan(&applied, &seq, &sum)
	if errors.Is(err, sql.ErrNoRows) || err != nil && strings.Contains(err.Error(), "no such table") {
		return Position{}, nil
	}
	if err != nil {
		return Position{}, fmt.Errorf("replication position of %s: %w", path, err)
	}
	return Position{Applied: uint64(applied), Seq: uint64(seq), Sum: uint64(sum)}, nil
}

// SetPosition records the file's position in this transaction (a copy,
// after Apply).
func (t *Tx) SetPosition(p Position) error {
	if err := t.direct(); err != nil {
		return err
	}
	_, err := t.f.conn.ExecContext(bg, `INSERT INTO replication (one, applied, seq, sum) VALUES (1, ?, ?, ?)
		ON CONFLICT (one) DO UPDATE SET applied = excluded.applied, seq = excluded.seq, sum = excluded.sum`,
		int64(p.Applied), int64(p.Seq), int64(p.Sum))
	if err != nil {
		return fmt.Errorf("replication position: %w", err)
	}
	t.pos = &p
	return nil
}

// Changes returns the change set recorded so far (nil when capture is off
// or nothing changed). The slice is the transaction's own.
func (t *Tx) Changes() []byte { return t.ops }

func (t *Tx) capturing() bool { return !t.applying && (t.f.ship != nil || t.f.captureAll) }

func (t *Tx) rec(op byte, fields ...any) {
	if !t.capturing() {
		return
	}
	b := append(t.ops, op)
	for _, v := range fields {
		switch v := v.(type) {
		case int64:
			b = binary.AppendVarint(b, v)
		case uint64:
			b = binary.AppendUvarint(b, v)
		case int:
			b = binary.AppendVarint(b, int64(v))
		case string:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		case []byte:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		default:
			panic(fmt.Sprintf("store: change field of type %T", v))
		}
	}
	t.ops = b
}

// decoder reads a change set's fields; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", ErrBadChanges, what)
	}
}

func (d *decoder) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("integer")
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("integer")
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	l := d.uint()
	if d.err != nil {
		return nil
	}
	if l > uint64(len(d.b)) {
		d.fail("bytes")
		d.b = nil
		return nil
	}
	v := d.b[:l:l]
	d.b = d.b[l:]
	return v
}

func (d *decoder) str() string { return string(d.bytes()) }

// Apply applies a change set made by the home at this file's position. The
// caller records the new position with SetPosition in the same
// transaction. A change set that does not decode wraps ErrBadChanges.
//
// Each operation runs through the Tx method that recorded it, so its SQL
// is written once; only an append and an added edge take the seq and id
// the home recorded instead of computing them.
func (t *Tx) Apply(changes []byte) error {
	if err := t.direct(); err != nil {
		return err
	}
	t.applying = true
	defer func() { t.applying = false }()
	t.dropEdges = true
	d := &decoder{b: changes}
	for len(d.b) > 0 && d.err == nil {
		op := d.b[0]
		d.b = d.b[1:]
		if err := t.applyOp(op, d); err != nil {
			if d.err != nil {
				return d.err
			}
			if IsFull(err) || errors.Is(err, ErrBadChanges) {
				return err
			}
			return fmt.Errorf("%w: operation %d: %v", ErrBadChanges, op, err)
		}
	}
	return d.err
}

// applyOp decodes one operation's fields and runs it. A field that does
// not decode leaves d.err set, and nothing runs.
func (t *Tx) applyOp(op byte, d *decoder) error {
	ok := func() bool { return d.err == nil }
	var err error
	switch op {
	case opPut:
		if k, v := d.bytes(), d.bytes(); ok() {
			err = t.Put(k, v)
		}
	case opDelete:
		if k := d.bytes(); ok() {
			err = t.Delete(k)
		}
	case opAppend:
		seq, topic, payload, at := d.uint(), d.str(), d.bytes(), d.int()
		if ok() {
			if payload == nil {
				payload = []byte{}
			}
			_, err = t.f.conn.ExecContext(bg, `INSERT INTO log (seq, topic, payload, time) VALUES (?, ?, ?, ?)`, int64(seq), topic, payload, at)
		}
	case opAddEdge:
		id, kind, follower, node, topic, filter, cursor, created := d.int(), d.int(), d.str(), d.str(), d.str(), d.str(), d.uint(), d.int()
		if ok() {
			_, err = t.f.conn.ExecContext(bg, `INSERT INTO edges (id, kind, follower, node, topic, filter, cursor, created)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (kind, follower, topic) DO UPDATE SET node = excluded.node, filter = excluded.filter`,
				id, kind, follower, node, topic, filter, int64(cursor), created)
		}
	case opRemoveEdge:
		if kind, follower, topic := d.int(), d.str(), d.str(); ok() {
			_, err = t.RemoveEdge(abi.FollowerKind(kind), follower, topic)
		}
	case opRemoveEdgeID:
		if id := d.int(); ok() {
			_, err = t.RemoveEdgeID(id)
		}
	case opRemoveFollow:
		if kind, follower := d.int(), d.str(); ok() {
			_, err = t.RemoveFollower(abi.FollowerKind(kind), follower)
		}
	case opConnFloor:
		if seq := d.uint(); ok() {
			err = t.AdvanceConnections(seq)
		}
	case opDueNow:
		if follower := d.str(); ok() {
			_, err = t.DueNow(follower)
		}
	case opAdvanceEdge:
		id, cursor, attempts, unplaced, due, node := d.int(), d.uint(), d.int(), d.int(), d.int(), d.str()
		if ok() {
			var next time.Time
			if due != 0 {
				next = time.Unix(0, due)
			}
			err = t.AdvanceEdge(id, cursor, int(attempts), int(unplaced), next, node)
		}
	case opSetCursor:
		if publisher, topic, seq := d.str(), d.str(), d.uint(); ok() {
			err = t.SetCursor(publisher, topic, seq)
		}
	case opSetAlarm:
		if at, attempts, next := d.int(), d.int(), d.int(); ok() {
			err = t.SetAlarm(Alarm{Time: time.Unix(0, at), Attempts: int(attempts), Next: time.Unix(0, next)})
		}
	case opDeleteAlarm:
		err = t.DeleteAlarm()
	case opRecordCall:
		key, req, reply, at := d.str(), d.bytes(), d.bytes(), d.int()
		if ok() {
			err = t.RecordCall(key, CallRecord{Request: req, Reply: reply, At: time.Unix(0, at)})
		}
	case opPruneCalls:
		if before, keep := d.int(), d.int(); ok() {
			_, err = t.PruneCalls(time.Unix(0, before), int(keep))
		}
	default:
		return fmt.Errorf("%w: unknown operation %d (written by a newer binary?)", ErrBadChanges, op)
	}
	if d.err != nil {
		return d.err
	}
	return err
}

// CaptureAll records change sets without a Shipper (tests and tools that
// read Changes).
func (f *File) CaptureAll(on bool) { f.captureAll = on }

// Digest is a checksum of the file's logical contents (state, log, edges,
// the connection floor, receive cursors, the alarm and the recorded
// calls, in key order): two files with
// the same contents have the same digest whatever their pages look like. A
// restored or caught-up copy is checked against its home's with it.
func (f *File) Digest() (uint64, error) {
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	for _, q := range []string{
		`SELECT key, value FROM state ORDER BY key`,
		`SELECT seq, topic, payload, time FROM log ORDER BY seq`,
		`SELECT id, kind, follower, node, topic, filter, cursor, attempts, unplaced, next_due, created FROM edges ORDER BY id`,
		`SELECT one, cursor FROM conn_floor`,
		`SELECT publisher, topic, seq FROM cursors ORDER BY publisher, topic`,
		`SELECT one, time, attempts, next FROM alarm`,
		`SELECT key, request, reply, at FROM calls ORDER BY key`,
	} {
		rows, err := f.conn.QueryContext(bg, q)
		if err != nil {
			return 0, fmt.Errorf("digest: %w", err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return 0, fmt.Errorf("digest: %w", err)
			}
			for _, v := range vals {
				fmt.Fprintf(h, "%T:%v|", v, v)
			}
			h.Write([]byte{'\n'})
		}
		if err := rows.Close(); err != nil {
			return 0, err
		}
		h.Write([]byte{0})
	}
	return h.Sum64(), nil
}
