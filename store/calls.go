package store

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// A recorded call is what makes a repeated call happen once in effect: an
// idempotency key, a hash of the request it came with (method and
// payload) and the reply the method gave, written in the transaction
// that ran the method. A call with a recorded key is answered from the
// record instead of running again. Records live in the object's file, so
// they commit and roll back with the method's effects, count toward the
// file's size and reach the copies with the rest of the file.

// CallRecord is one recorded call.
type CallRecord struct {
	Request []byte    // the hash of the method and payload
	Reply   []byte    // the method's reply
	At      time.Time // when the method ran
}

// RecordedCall returns the record of key, as this transaction sees it.
func (t *Tx) RecordedCall(key string) (CallRecord, bool, error) {
	if err := t.direct(); err != nil {
		return CallRecord{}, false, err
	}
	var r CallRecord
	var at int64
	err := t.f.conn.QueryRowContext(bg, `SELECT request, reply, at FROM calls WHERE key = ?`, key).Scan(&r.Request, &r.Reply, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return CallRecord{}, false, nil
	}
	if err != nil {
		return CallRecord{}, false, fmt.Errorf("recorded call: %w", err)
	}
	r.At = time.Unix(0, at)
	return r, true, nil
}

// RecordCall records key with its request hash and reply, replacing an
// older record of the key (one pruned by age but not yet deleted).
func (t *Tx) RecordCall(key string, r CallRecord) error {
	if err := t.direct(); err != nil {
		return err
	}
	if r.Reply == nil {
		r.Reply = []byte{}
	}
	_, err := t.f.conn.ExecContext(bg, `INSERT INTO calls (key, request, reply, at) VALUES (?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET request = excluded.request, reply = excluded.reply, at = excluded.at`,
		key, r.Request, r.Reply, r.At.UnixNano())
	t.rec(opRecordCall, key, r.Request, r.Reply, r.At.UnixNano())
	if err != nil {
		return fmt.Errorf("record call: %w", err)
	}
	return nil
}

// PruneCalls deletes the records made before before, and then those no
// newer than the newest past the keep newest (ties at one time go
// together), and returns how many it deleted. Both walk the index by
// time. The same rows give the same result, so a copy applies it as the
// home ran it.
func (t *Tx) PruneCalls(before time.Time, keep int) (int64, error) {
	if err := t.direct(); err != nil {
		return 0, err
	}
	t.rec(opPruneCalls, before.UnixNano(), keep)
	res, err := t.f.conn.ExecContext(bg, `DELETE FROM calls WHERE at < ?`, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("prune calls: %w", err)
	}
	old, _ := res.RowsAffected()
	res, err = t.f.conn.ExecContext(bg, `DELETE FROM calls WHERE at <= (SELECT at FROM calls ORDER BY at DESC LIMIT 1 OFFSET ?)`, keep)
	if err != nil {
		return 0, fmt.Errorf("prune calls: %w", err)
	}
	over, _ := res.RowsAffected()
	return old + over, nil
}

// SameRequest reports whether a recorded call's request hash is h.
func (r CallRecord) SameRequest(h []byte) bool { return bytes.Equal(r.Request, h) }
