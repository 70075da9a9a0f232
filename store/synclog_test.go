package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

// SyncLog syncs the log of an open file, each time it is opened (SQLite
// removes the log when the file closes), and a transaction's LastSeq is
// the head it leaves, savepoints rolled back included.
func TestSyncLogAndLastSeq(t *testing.T) {
	path := filepath.Join(t.TempDir(), "o.db")
	ctx := context.Background()
	for round := range 2 {
		f, err := store.Open(ctx, path, store.SyncNormal)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := f.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if tx.LastSeq() != 0 {
			t.Fatalf("LastSeq %d before any append", tx.LastSeq())
		}
		a, err := tx.Append("t", []byte("a"), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sp, err := tx.Savepoint()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Append("t", []byte("b"), time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := sp.RollbackTo(); err != nil {
			t.Fatal(err)
		}
		if tx.LastSeq() != a {
			t.Fatalf("round %d: LastSeq %d after rolling b back, want %d", round, tx.LastSeq(), a)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if head, err := f.Head(); err != nil || head != a {
			t.Fatalf("head %d (%v), want %d", head, err, a)
		}
		for range 2 {
			if err := f.SyncLog(); err != nil {
				t.Fatalf("round %d: SyncLog: %v", round, err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
