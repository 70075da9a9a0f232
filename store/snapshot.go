package store

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// SnapshotTo writes a consistent copy of the object file at src to dst (a
// new file: VACUUM INTO, through a read-only connection of its own, so the
// file's handlers keep running meanwhile) and returns the position the
// copy is at. dst must not exist.
func SnapshotTo(ctx context.Context, src, dst string) (Position, error) {
	db, err := openReadOnly(src)
	if err != nil {
		return Position{}, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, dst); err != nil {
		os.Remove(dst)
		return Position{}, fmt.Errorf("snapshot of %s: %w", src, err)
	}
	p, err := ReadPosition(ctx, dst)
	if err != nil {
		os.Remove(dst)
		return Position{}, err
	}
	return p, nil
}

// WritePosition records p as the position of the object file at path,
// which nothing else has open (a snapshot's copy).
func WritePosition(ctx context.Context, path string, p Position) error {
	f, err := Open(ctx, path, SyncNormal)
	if err != nil {
		return err
	}
	defer f.Close()
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	if err := tx.SetPosition(p); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// RemoveFile removes an SQLite file and its WAL and shared memory, the
// parts that exist.
func RemoveFile(path string) error {
	var errs []error
	for _, ext := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
