package store_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

func userVersion(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// columns lists each table's columns, sorted.
func columns(t *testing.T, path string) map[string][]string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT m.name, p.name FROM sqlite_schema m, pragma_table_info(m.name) p WHERE m.type = 'table'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var table, col string
		if err := rows.Scan(&table, &col); err != nil {
			t.Fatal(err)
		}
		out[table] = append(out[table], col)
	}
	for _, cs := range out {
		slices.Sort(cs)
	}
	return out
}

// Files written before the schema had a version (user_version 0), by each
// binary that changed the schema, open in this one and are upgraded to
// Version with their state, log, edges, connection floor and cursors as
// they were; the fixtures hold each binary's CREATE statements verbatim.
func TestSchemaUpgradeFromVersion0(t *testing.T) {
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	open(t, fresh).Close()
	if v := userVersion(t, fresh); v != store.Version {
		t.Fatalf("a new file is at version %d, want %d", v, store.Version)
	}
	want := columns(t, fresh)
	for _, fixture := range []string{"v0-9407d0c.sql", "v0-70e51ef.sql", "v0-cfc0932.sql"} {
		t.Run(fixture, func(t *testing.T) {
			script, err := os.ReadFile(filepath.Join("testdata", fixture))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "old.db")
			if err := writeSQL(path, string(script)); err != nil {
				t.Fatal(err)
			}
			if v := userVersion(t, path); v != 0 {
				t.Fatalf("fixture at version %d", v)
			}
			for round := range 2 { // upgraded, then opened as it is
				f, err := store.Open(context.Background(), path, store.SyncNormal)
				if err != nil {
					t.Fatal(err)
				}
				checkVersion0Data(t, f, round)
				f.Close()
				if v := userVersion(t, path); v != store.Version {
					t.Fatalf("round %d: version %d, want %d", round, v, store.Version)
				}
				if got := columns(t, path); !equalColumns(got, want) {
					t.Fatalf("round %d: upgraded columns %v, a new file's %v", round, got, want)
				}
			}
		})
	}
}

func equalColumns(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// checkVersion0Data checks what the fixtures hold, then that the file takes
// the writes the current schema needs (round 0 makes them, round 1 sees
// them).
func checkVersion0Data(t *testing.T, f *store.File, round int) {
	t.Helper()
	commit(t, f, func(tx *store.Tx) error {
		for k, v := range map[string]string{"count": "7", "name": "ann"} {
			if got, ok, err := tx.Get([]byte(k)); err != nil || !ok || string(got) != v {
				t.Errorf("state %s = %q %v %v", k, got, ok, err)
			}
		}
		if c, err := tx.Cursor("chat/room1", "t"); err != nil || c != 5 {
			t.Errorf("cursor %d %v", c, err)
		}
		evs, err := tx.Read(store.Query{Topic: "t", Through: 3})
		if err != nil || !equal(seqs(evs), []uint64{1, 3}) || string(evs[1].Payload) != `{"u":"bob"}` || evs[1].Time != 300 {
			t.Errorf("log %+v %v", evs, err)
		}
		es, err := tx.Edges()
		if err != nil || len(es) != 2 {
			t.Fatalf("edges %+v %v", es, err)
		}
		conn, obj := es[0], es[1]
		wantUnplaced, wantFloor := 0, uint64(3)
		if round == 1 {
			wantUnplaced, wantFloor = 4, 4
		}
		if conn.Kind != abi.FollowerConnection || conn.Follower != "A.1" || conn.Cursor != wantFloor {
			t.Errorf("connection edge %+v", conn)
		}
		if obj.Kind != abi.FollowerObject || obj.Follower != "tally/1" || obj.Filter != "u=ann" || obj.Cursor != 1 ||
			obj.Attempts != 2 || obj.NextDue != 99 || obj.Unplaced != wantUnplaced || obj.Created != 11 {
			t.Errorf("object edge %+v", obj)
		}
		if round == 0 {
			return tx.AdvanceEdge(obj.ID, 1, 2, 4, time.Unix(0, 99), "")
		}
		return nil
	})
	if round == 0 {
		publish(t, f, "t", "new")
		commit(t, f, func(tx *store.Tx) error { return tx.AdvanceConnections(4) })
	}
	if evs, err := store.Read(context.Background(), f.Path(), store.Query{After: 3}); err != nil || !equal(seqs(evs), []uint64{4}) {
		t.Errorf("appended after the upgrade: %+v %v", evs, err)
	}
	if es := edges(t, f, true); es[0].Cursor != 4 {
		t.Errorf("connection floor after the upgrade: %+v", es[0])
	}
}

// A file from a newer binary is refused, not read with a schema this one
// does not know, and left as it was.
func TestSchemaNewerIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	open(t, path).Close()
	if err := writeSQL(path, `PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(context.Background(), path, store.SyncNormal); !errors.Is(err, store.ErrSchemaTooNew) {
		t.Fatalf("open: %v, want ErrSchemaTooNew", err)
	}
	if v := userVersion(t, path); v != 99 {
		t.Fatalf("version now %d", v)
	}
}
