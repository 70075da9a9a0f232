package store_test

import (
	"testing"

	"github.com/durable-host/host/store"
)

// A transaction reads back what it wrote without asking SQLite, and the
// answers are SQLite's: the value as written (not the caller's slice,
// which it may reuse), a deleted key absent, and after a savepoint rolled
// back what SQLite holds again.
func TestTxReadsItsOwnWrites(t *testing.T) {
	f := newFile(t)
	get := func(tx *store.Tx, key string) string {
		t.Helper()
		v, ok, err := tx.Get([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return "(absent)"
		}
		return string(v)
	}
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte("one")
	if err := tx.Put([]byte("a"), buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXX") // the guest's memory, reused
	if got := get(tx, "a"); got != "one" {
		t.Fatalf("a = %q after put, want one", got)
	}
	if err := tx.Put([]byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := tx.Get([]byte("empty")); !ok || v == nil || len(v) != 0 {
		t.Fatalf("empty = %q %v, want a present empty value", v, ok)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	tx, err = f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.Delete([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if got := get(tx, "a"); got != "(absent)" {
		t.Fatalf("a = %q after delete", got)
	}
	sp, err := tx.Savepoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put([]byte("a"), []byte("two")); err != nil {
		t.Fatal(err)
	}
	if got := get(tx, "a"); got != "two" {
		t.Fatalf("a = %q, want two", got)
	}
	if err := sp.RollbackTo(); err != nil {
		t.Fatal(err)
	}
	if got := get(tx, "a"); got != "(absent)" {
		t.Fatalf("a = %q after rolling back to the savepoint, want it deleted again", got)
	}
	sp, err = tx.Savepoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put([]byte("b"), []byte("three")); err != nil {
		t.Fatal(err)
	}
	if err := sp.RollbackTo(); err != nil {
		t.Fatal(err)
	}
	if got := get(tx, "b"); got != "(absent)" {
		t.Fatalf("b = %q after its put was rolled back", got)
	}
}
