package store

import (
	"context"
	"path/filepath"
	"testing"
)

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
