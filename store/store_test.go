package store_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

func open(t *testing.T, path string) *store.File {
	t.Helper()
	f, err := store.Open(context.Background(), path, store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// writeSQL runs script on the file at path, as an earlier binary would
// have made it.
func writeSQL(path, script string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(script)
	return err
}

func newFile(t *testing.T) *store.File {
	return open(t, filepath.Join(t.TempDir(), "o.db"))
}

// commit runs fn in one transaction and commits it.
func commit(t *testing.T, f *store.File, fn func(tx *store.Tx) error) {
	t.Helper()
	if err := try(f, fn); err != nil {
		t.Fatal(err)
	}
}

// try runs fn in one transaction: committed if fn succeeds, else rolled
// back with fn's error.
func try(f *store.File, fn func(tx *store.Tx) error) error {
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func publish(t *testing.T, f *store.File, topic string, payloads ...string) {
	t.Helper()
	commit(t, f, func(tx *store.Tx) error {
		for _, p := range payloads {
			if _, err := tx.Append(topic, []byte(p), time.Unix(0, 1)); err != nil {
				return err
			}
		}
		return nil
	})
}

func edges(t *testing.T, f *store.File, cached bool) []store.Edge {
	t.Helper()
	var es []store.Edge
	commit(t, f, func(tx *store.Tx) error {
		var err error
		if cached {
			es, err = tx.CachedEdges()
			es = append([]store.Edge(nil), es...)
		} else {
			es, err = tx.Edges()
		}
		return err
	})
	return es
}

func seqs(evs []abi.Event) []uint64 {
	out := []uint64{}
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

func TestStateAndCursors(t *testing.T) {
	f := newFile(t)
	commit(t, f, func(tx *store.Tx) error {
		for _, k := range []string{"a/1", "a/2", "b/1"} {
			if err := tx.Put([]byte(k), []byte("v"+k)); err != nil {
				return err
			}
		}
		if err := tx.Put([]byte("empty"), nil); err != nil {
			return err
		}
		return tx.SetCursor("chat/room1", "t", 9)
	})
	commit(t, f, func(tx *store.Tx) error {
		if v, ok, err := tx.Get([]byte("a/2")); err != nil || !ok || string(v) != "va/2" {
			t.Errorf("get a/2: %q %v %v", v, ok, err)
		}
		if v, ok, err := tx.Get([]byte("empty")); err != nil || !ok || v == nil || len(v) != 0 {
			t.Errorf("an empty value reads as present and empty: %q %v %v", v, ok, err)
		}
		if _, ok, err := tx.Get([]byte("none")); err != nil || ok {
			t.Errorf("get none: %v %v", ok, err)
		}
		ps, err := tx.Scan([]byte("a/"), 10)
		if err != nil || len(ps) != 2 || string(ps[0].Key) != "a/1" || string(ps[1].Key) != "a/2" {
			t.Errorf("scan a/: %+v %v", ps, err)
		}
		if err := tx.Delete([]byte("a/1")); err != nil {
			return err
		}
		if c, err := tx.Cursor("chat/room1", "t"); err != nil || c != 9 {
			t.Errorf("cursor %d %v", c, err)
		}
		if c, err := tx.Cursor("chat/room1", "other"); err != nil || c != 0 {
			t.Errorf("unset cursor %d %v", c, err)
		}
		return nil
	})
	// A rolled back transaction leaves nothing.
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	tx.Put([]byte("a/9"), []byte("x"))
	tx.Append("t", []byte("x"), time.Now())
	tx.Rollback()
	commit(t, f, func(tx *store.Tx) error {
		if _, ok, _ := tx.Get([]byte("a/9")); ok {
			t.Error("a rolled back put is there")
		}
		if _, ok, _ := tx.Get([]byte("a/1")); ok {
			t.Error("a deleted key is there")
		}
		if h, _ := tx.Head(); h != 0 {
			t.Errorf("a rolled back append is in the log: head %d", h)
		}
		return nil
	})
}

// One query type serves every reader, in a transaction and through a
// read-only connection alike.
func TestQuery(t *testing.T) {
	f := newFile(t)
	publish(t, f, "t", `{"u":"ann"}`, `{"u":"bob"}`) // 1 2
	publish(t, f, "o", `xxxxxxxxxx`)                 // 3
	publish(t, f, "t", `{"u":"ann"}`, `{"u":"cy"}`)  // 4 5
	publish(t, f, "o", `yyyyyyyyyy`, `zzzzzzzzzz`)   // 6 7
	ann := func(p []byte) bool { return bytes.Contains(p, []byte(`"ann"`)) }
	none := func([]byte) bool { return false }
	capAt := func(c uint64) func() (uint64, bool) { return func() (uint64, bool) { return c, true } }
	noCap := func() (uint64, bool) { return 0, false }
	cases := []struct {
		name string
		q    store.Query
		want []uint64
		err  error
	}{
		{"all", store.Query{}, []uint64{1, 2, 3, 4, 5, 6, 7}, nil},
		{"after", store.Query{After: 4}, []uint64{5, 6, 7}, nil},
		{"through", store.Query{After: 1, Through: 4}, []uint64{2, 3, 4}, nil},
		{"through the head", store.Query{After: 5, Through: 7}, []uint64{6, 7}, nil},
		{"through past the head", store.Query{After: 5, Through: 8}, nil, store.ErrNoLog},
		{"topic", store.Query{Topic: "t"}, []uint64{1, 2, 4, 5}, nil},
		{"match", store.Query{Match: ann}, []uint64{1, 4}, nil},
		{"match nothing", store.Query{Match: none}, []uint64{}, nil},
		{"limit", store.Query{After: 1, Limit: 2}, []uint64{2, 3}, nil},
		{"limit counts matches", store.Query{Topic: "t", Match: ann, Limit: 1, After: 1}, []uint64{4}, nil},
		{"bytes stop after the event that reaches them", store.Query{After: 2, MaxBytes: 15}, []uint64{3, 4}, nil},
		{"at least one event", store.Query{After: 2, MaxBytes: 1}, []uint64{3}, nil},
		{"latest", store.Query{Latest: true}, []uint64{7}, nil},
		{"latest of topic", store.Query{Latest: true, Topic: "t"}, []uint64{5}, nil},
		{"latest match", store.Query{Latest: true, Match: ann}, []uint64{4}, nil},
		{"latest in range", store.Query{Latest: true, Through: 3}, []uint64{3}, nil},
		{"capped", store.Query{After: 5, Capped: true, Cap: 6}, []uint64{6}, nil},
		{"capped past the head", store.Query{After: 5, Capped: true, Cap: 9}, []uint64{6, 7}, nil},
		{"latest under the cap", store.Query{Latest: true, Capped: true, Cap: 4}, []uint64{4}, nil},
		// Nothing shipped yet: a cap of 0 shows nothing (it once meant
		// no cap, and a stream read an event not yet shipped).
		{"capped at nothing", store.Query{Capped: true, Cap: 0}, []uint64{}, nil},
		{"latest after the last", store.Query{Latest: true, After: 7}, []uint64{}, nil},
		// The output gate's cap, asked after the snapshot is taken.
		{"cap after", store.Query{After: 2, CapAfter: capAt(5)}, []uint64{3, 4, 5}, nil},
		{"no cap after", store.Query{After: 5, CapAfter: noCap}, []uint64{6, 7}, nil},
		{"latest not durable yet", store.Query{Latest: true, CapAfter: capAt(5)}, []uint64{5}, nil},
		{"latest under both caps", store.Query{Latest: true, Capped: true, Cap: 3, CapAfter: capAt(5)}, []uint64{3}, nil},
		{"latest of topic under the cap", store.Query{Latest: true, Topic: "t", CapAfter: capAt(3)}, []uint64{2}, nil},
	}
	for _, c := range cases {
		var inTx []abi.Event
		var txErr error
		commit(t, f, func(tx *store.Tx) error {
			inTx, txErr = tx.Read(c.q)
			return nil
		})
		ro, roErr := store.Read(context.Background(), f.Path(), c.q)
		for _, r := range []struct {
			how string
			evs []abi.Event
			err error
		}{{"tx", inTx, txErr}, {"read-only", ro, roErr}} {
			if c.err != nil {
				if !errors.Is(r.err, c.err) {
					t.Errorf("%s (%s): err %v, want %v", c.name, r.how, r.err, c.err)
				}
				continue
			}
			if r.err != nil || !equal(seqs(r.evs), c.want) {
				t.Errorf("%s (%s): %v %v, want %v", c.name, r.how, seqs(r.evs), r.err, c.want)
			}
		}
	}
	evs, _ := store.Read(context.Background(), f.Path(), store.Query{After: 3, Through: 4})
	if len(evs) != 1 || evs[0].Topic != "t" || string(evs[0].Payload) != `{"u":"ann"}` || evs[0].Time != 1 {
		t.Fatalf("event read as %+v", evs)
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A subscription's first read can meet the object's file while its first
// call is still creating it: no schema yet reads as no events, not as an
// error that would end the stream; a ranged read finds no copy of the
// range there.
func TestReadOfAFileBeingCreated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.db")
	f, err := store.Open(context.Background(), path, store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A file with no tables yet: one whose first open has not created
	// its schema.
	empty := filepath.Join(dir, "empty.db")
	if err := writeSQL(empty, `PRAGMA journal_mode=WAL; CREATE TABLE other (x)`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, p := range []string{path, empty} {
		if evs, err := store.Read(ctx, p, store.Query{Limit: 10}); err != nil || len(evs) != 0 {
			t.Fatalf("%s: %v %v", p, evs, err)
		}
		if evs, err := store.Read(ctx, p, store.Query{Latest: true}); err != nil || len(evs) != 0 {
			t.Fatalf("%s latest: %v %v", p, evs, err)
		}
	}
	if _, err := store.Read(ctx, empty, store.Query{Through: 1}); !errors.Is(err, store.ErrNoLog) {
		t.Fatalf("a range of a file with no log: %v", err)
	}
	none := filepath.Join(dir, "none.db")
	if evs, err := store.Read(ctx, none, store.Query{}); err != nil || evs != nil {
		t.Fatalf("a file that does not exist: %v %v", evs, err)
	}
	if _, err := store.Read(ctx, none, store.Query{Through: 1}); !errors.Is(err, store.ErrNoLog) {
		t.Fatalf("a range of a file that does not exist: %v", err)
	}
}

// The edge cache follows commits and is dropped by rollbacks and by
// changes it cannot follow; its values are always the rows' (with the
// connection floor).
func TestEdgeCache(t *testing.T) {
	f := newFile(t)
	if !f.MayHaveEdges() {
		t.Fatal("an unloaded cache may have edges")
	}
	if es := edges(t, f, true); len(es) != 0 {
		t.Fatalf("edges %+v", es)
	}
	if f.MayHaveEdges() {
		t.Fatal("a loaded empty cache has none")
	}
	// A rolled back change drops the cache rather than trust it.
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.AddEdge(abi.FollowerObject, "gone/1", "A", "t", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	if !f.MayHaveEdges() {
		t.Fatal("a rollback keeps the cache")
	}
	if es := edges(t, f, true); len(es) != 0 {
		t.Fatalf("a rolled back edge is there: %+v", es)
	}
	publish(t, f, "t", "a", "b", "c")
	var obj, conn store.Edge
	commit(t, f, func(tx *store.Tx) error {
		var err error
		if obj, err = tx.AddEdge(abi.FollowerObject, "tally/1", "A", "t", "", time.Unix(5, 0)); err != nil {
			return err
		}
		conn, err = tx.AddEdge(abi.FollowerConnection, "A.1", "A", "t", "", time.Unix(5, 0))
		return err
	})
	if obj.Cursor != 3 || conn.Cursor != 3 || obj.State != store.EdgeOK || obj.KindName != "object" {
		t.Fatalf("new edges start at the head: %+v %+v", obj, conn)
	}
	if !f.MayHaveEdges() {
		t.Fatal("AddEdge drops the cache")
	}
	publish(t, f, "t", "d", "e")
	edges(t, f, true) // load
	due := time.Unix(0, 77)
	commit(t, f, func(tx *store.Tx) error {
		if err := tx.AdvanceEdge(obj.ID, 4, 1, 0, due, "B"); err != nil {
			return err
		}
		return tx.AdvanceConnections(5)
	})
	check := func(stage string, es []store.Edge, objCursor uint64, attempts int, node string, connCursor uint64) {
		t.Helper()
		for _, e := range es {
			switch e.ID {
			case obj.ID:
				if e.Cursor != objCursor || e.Attempts != attempts || e.Node != node {
					t.Fatalf("%s: object edge %+v", stage, e)
				}
			case conn.ID:
				if e.Cursor != connCursor {
					t.Fatalf("%s: connection edge %+v", stage, e)
				}
			}
		}
		if len(es) != 2 {
			t.Fatalf("%s: %d edges", stage, len(es))
		}
	}
	check("cache after commit", edges(t, f, true), 4, 1, "B", 5)
	check("rows after commit", edges(t, f, false), 4, 1, "B", 5)
	if es := edges(t, f, false); es[0].State != store.EdgeRetrying || es[0].NextDue != 77 {
		t.Fatalf("described as %+v", es[0])
	}
	// The cursor only moves forward.
	commit(t, f, func(tx *store.Tx) error { return tx.AdvanceEdge(obj.ID, 2, 0, 0, time.Time{}, "") })
	check("cursor kept", edges(t, f, true), 4, 0, "B", 5)

	// A rollback drops the patches and the cache: both read the rows.
	edges(t, f, true)
	tx, err = f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.AdvanceEdge(obj.ID, 5, 3, 0, time.Time{}, "C"); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	check("cache after rollback", edges(t, f, true), 4, 0, "B", 5)

	// Removing a follower drops the cache; re-following keeps the cursor,
	// which for a connection is the floor's.
	commit(t, f, func(tx *store.Tx) error {
		e, err := tx.AddEdge(abi.FollowerConnection, "A.1", "A", "t", "", time.Now())
		if err == nil && e.Cursor != 5 {
			t.Errorf("re-follow cursor %d, want the floor 5", e.Cursor)
		}
		return err
	})
	commit(t, f, func(tx *store.Tx) error {
		n, err := tx.RemoveFollower(abi.FollowerConnection, "A.1")
		if n != 1 {
			t.Errorf("removed %d", n)
		}
		return err
	})
	if es := edges(t, f, true); len(es) != 1 || es[0].ID != obj.ID {
		t.Fatalf("after removing A.1: %+v", es)
	}
	commit(t, f, func(tx *store.Tx) error {
		ok, err := tx.RemoveEdgeID(obj.ID)
		if !ok {
			t.Error("RemoveEdgeID found nothing")
		}
		return err
	})
	if es := edges(t, f, true); len(es) != 0 {
		t.Fatalf("after removing all: %+v", es)
	}
}

// A file capped by Limit refuses growth with an error IsFull names, and
// the transaction rolls back with nothing lost.
func TestLimit(t *testing.T) {
	f := newFile(t)
	commit(t, f, func(tx *store.Tx) error { return tx.Put([]byte("k"), []byte("v")) })
	size, err := f.Size()
	if err != nil || size <= 0 {
		t.Fatalf("size %d %v", size, err)
	}
	if err := f.Limit(size + 8<<10); err != nil {
		t.Fatal(err)
	}
	err = try(f, func(tx *store.Tx) error { return tx.Put([]byte("big"), bytes.Repeat([]byte("x"), 64<<10)) })
	if !store.IsFull(err) {
		t.Fatalf("a write past the cap: %v", err)
	}
	commit(t, f, func(tx *store.Tx) error {
		if v, ok, _ := tx.Get([]byte("k")); !ok || string(v) != "v" {
			t.Error("a full file lost a value")
		}
		return tx.Put([]byte("k"), []byte("w")) // in place still works
	})
	if err := f.Limit(0); err != nil {
		t.Fatal(err)
	}
	commit(t, f, func(tx *store.Tx) error { return tx.Put([]byte("big"), bytes.Repeat([]byte("x"), 64<<10)) })
	if store.IsFull(errors.New("database or disk is full")) {
		t.Fatal("IsFull matches by code, not text")
	}
}
