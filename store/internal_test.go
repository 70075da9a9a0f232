package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// tempFile opens a new file for the test, closed when it ends.
func tempFile(t *testing.T) *File {
	t.Helper()
	f, err := Open(context.Background(), filepath.Join(t.TempDir(), "o.db"), SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Each version has its step: Version is raised with a migration.
func TestMigrationsReachVersion(t *testing.T) {
	if len(migrations) != Version {
		t.Fatalf("%d migrations for version %d", len(migrations), Version)
	}
}

// The read-only opener cannot write: a stream or a ranged read never
// changes the file it reads.
func TestReadOnlyOpenerCannotWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "o.db")
	f, err := Open(context.Background(), path, SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	db, err := openReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO log (topic, payload, time) VALUES ('t', x'', 0)`); err == nil {
		t.Fatal("a write through the read-only opener succeeded")
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM log`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("read: %d %v", n, err)
	}
}

// What a transaction keeps in memory of its writes stays bounded however
// large and many they are: held writes are handed to SQLite past
// maxDeferredBytes, and a large value is not kept once SQLite has it. A
// hostile call writing 1 MB values under many keys (or a batch of such
// calls) does not hold hundreds of megabytes until its commit.
func TestTxKeepsBoundedMemory(t *testing.T) {
	f := tempFile(t)
	for _, deferred := range []bool{false, true} {
		tx, err := f.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if deferred {
			tx.Defer()
		}
		value := make([]byte, 64<<10)
		most := 0
		for i := range 300 {
			if err := tx.Put([]byte{byte(i >> 8), byte(i)}, value); err != nil {
				t.Fatal(err)
			}
			kept := 0
			for _, e := range tx.written {
				kept += len(e.value)
			}
			most = max(most, kept)
		}
		if limit := maxDeferredBytes + len(value) + maxWritten*maxCachedValue; most > limit {
			t.Errorf("deferred=%v: kept %d bytes of values at most, want at most %d", deferred, most, limit)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// The same for events: a deferring transaction lets go of the events
// SQLite has once no savepoint needs them, so a batch of calls each
// publishing megabytes does not hold them all until its commit.
func TestDeferredTxLetsGoOfWrittenEvents(t *testing.T) {
	f := tempFile(t)
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	tx.Defer()
	payload := make([]byte, 256<<10)
	most := 0
	for range 40 { // 40 calls of 4 events of 256 KB: 40 MB in all
		sp, err := tx.Savepoint()
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if _, err := tx.Append("t", payload, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if err := sp.Release(); err != nil {
			t.Fatal(err)
		}
		kept := 0
		for _, a := range tx.appends {
			kept += len(a.payload)
		}
		most = max(most, kept)
	}
	if limit := maxDeferredBytes + 4*len(payload); most > limit {
		t.Errorf("kept %d bytes of events at most, want at most %d", most, limit)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if head, err := f.Head(); err != nil || head != 160 {
		t.Fatalf("head %d (%v) after 160 events", head, err)
	}
}
