package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/durable-host/host/abi"
)

// ErrNoFile is returned by the inspection reads for an object that has no
// file here: it was never used, or its file is on another node.
var ErrNoFile = errors.New("no file for this object")

// ReadState returns up to limit of the state pairs of the object file at
// path whose key starts with prefix and sorts after after (nil: from the
// first), in key order. It reads through a read-only connection of its
// own, in one read transaction: the object's handlers go on writing
// meanwhile (WAL), and the pairs are one committed state. more reports
// whether pairs are left after the last one returned.
func ReadState(ctx context.Context, path string, prefix, after []byte, limit int) (pairs []abi.Pair, more bool, err error) {
	db, err := openReadOnly(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("%w: %s", ErrNoFile, path)
	}
	if err != nil {
		return nil, false, err
	}
	defer db.Close()
	if limit <= 0 {
		limit = 100
	}
	from := prefix
	op := ">="
	if after != nil && string(after) >= string(prefix) {
		from, op = after, ">"
	}
	rows, err := db.QueryContext(ctx, `SELECT key, value FROM state WHERE key `+op+` ? ORDER BY key LIMIT ?`, append([]byte{}, from...), limit+1)
	if err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return nil, false, nil // the object's first call is creating the file
		}
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	defer rows.Close()
	for rows.Next() {
		var p abi.Pair
		if err := rows.Scan(&p.Key, &p.Value); err != nil {
			return nil, false, err
		}
		if !hasPrefix(p.Key, prefix) {
			break
		}
		if len(pairs) == limit {
			more = true
			break
		}
		pairs = append(pairs, p)
	}
	return pairs, more, rows.Err()
}

// ReadHead returns the last seq of the object file at path's log (0: no
// events), read-only.
func ReadHead(ctx context.Context, path string) (uint64, error) {
	db, err := openReadOnly(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%w: %s", ErrNoFile, path)
	}
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var head int64
	err = db.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM log`).Scan(&head)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return 0, nil
	}
	return uint64(head), err
}

func hasPrefix(b, prefix []byte) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == string(prefix)
}
