package store_test

import (
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// randomTx makes one transaction of random writes of every kind a home
// makes: state puts and deletes, appends, edges added, advanced, removed,
// the connection floor, receive cursors, the alarm set and deleted, calls
// recorded and pruned.
func randomTx(r *rand.Rand, tx *store.Tx) error {
	now := time.Unix(1_700_000_000, int64(r.Intn(1e9)))
	for range 1 + r.Intn(6) {
		key := []byte(fmt.Sprintf("k%d", r.Intn(20)))
		follower := fmt.Sprintf("p/f%d", r.Intn(4))
		topic := fmt.Sprintf("t%d", r.Intn(3))
		var err error
		switch r.Intn(15) {
		case 0, 1:
			err = tx.Put(key, []byte(fmt.Sprint(r.Int())))
		case 2:
			err = tx.Delete(key)
		case 3, 4:
			_, err = tx.Append(topic, []byte(fmt.Sprint("e", r.Int())), now)
		case 5:
			kind := abi.FollowerObject
			if r.Intn(2) == 0 {
				kind = abi.FollowerConnection
				follower = fmt.Sprintf("c%d", r.Intn(4))
			}
			_, err = tx.AddEdge(kind, follower, fmt.Sprint("n", r.Intn(3)), topic, "", now)
		case 6:
			var es []store.Edge
			if es, err = tx.Edges(); err == nil && len(es) > 0 {
				e := es[r.Intn(len(es))]
				node := ""
				if r.Intn(2) == 0 {
					node = "moved"
				}
				err = tx.AdvanceEdge(e.ID, e.Cursor+uint64(r.Intn(3)), r.Intn(3), r.Intn(2), now.Add(time.Second), node)
			}
		case 7:
			_, err = tx.RemoveEdge(abi.FollowerObject, follower, topic)
		case 8:
			if r.Intn(3) == 0 {
				_, err = tx.RemoveFollower(abi.FollowerObject, follower)
			} else {
				_, err = tx.DueNow(follower)
			}
		case 9:
			var h uint64
			if h, err = tx.Head(); err == nil {
				err = tx.AdvanceConnections(h)
			}
		case 10:
			err = tx.SetCursor(follower, topic, uint64(r.Intn(100)))
		case 11:
			at := now.Add(time.Duration(r.Intn(1000)) * time.Second)
			err = tx.SetAlarm(store.Alarm{Time: at, Attempts: r.Intn(3), Next: at.Add(time.Duration(r.Intn(5)) * time.Second)})
		case 12:
			err = tx.DeleteAlarm()
		case 13:
			err = tx.RecordCall(fmt.Sprint("key", r.Intn(30)), store.CallRecord{Request: []byte{byte(r.Intn(3))}, Reply: []byte(fmt.Sprint(r.Int())), At: now})
		case 14:
			_, err = tx.PruneCalls(now.Add(-time.Duration(r.Intn(2))*time.Second), r.Intn(10))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func digest(t *testing.T, f *store.File) uint64 {
	t.Helper()
	d, err := f.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A copy that applies each change set of its home has the home's logical
// contents after every one: state, log, edges, floor, cursors, alarm and
// recorded calls.
func TestApplyReproducesTheHome(t *testing.T) {
	home, cp := newFile(t), newFile(t)
	home.CaptureAll(true)
	r := rand.New(rand.NewSource(1))
	for i := range 300 {
		tx, err := home.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if err := randomTx(r, tx); err != nil {
			t.Fatal(err)
		}
		changes := append([]byte(nil), tx.Changes()...)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		commit(t, cp, func(tx *store.Tx) error { return tx.Apply(changes) })
		if a, b := digest(t, home), digest(t, cp); a != b {
			t.Fatalf("after transaction %d the copy differs from its home (%x, %x)", i, a, b)
		}
	}
	if h, _ := home.Head(); h == 0 {
		t.Fatal("the random transactions appended nothing: the test tests nothing")
	}
}

// A read-only transaction has no change set; capture off records nothing.
func TestNoChangesNoChangeSet(t *testing.T) {
	f := newFile(t)
	commit(t, f, func(tx *store.Tx) error {
		if err := tx.Put([]byte("k"), []byte("v")); err != nil {
			return err
		}
		if c := tx.Changes(); c != nil {
			t.Errorf("capture off recorded %d bytes", len(c))
		}
		return nil
	})
	f.CaptureAll(true)
	commit(t, f, func(tx *store.Tx) error {
		_, _, err := tx.Get([]byte("k"))
		if c := tx.Changes(); len(c) != 0 {
			t.Errorf("a read recorded %d bytes", len(c))
		}
		return err
	})
}

// A change set cut short or with an unknown operation is refused with
// ErrBadChanges, and the copy is left as it was.
func TestApplyRefusesBadChangeSets(t *testing.T) {
	home, cp := newFile(t), newFile(t)
	home.CaptureAll(true)
	var changes []byte
	commit(t, home, func(tx *store.Tx) error {
		tx.Put([]byte("key"), []byte("value"))
		tx.Append("t", []byte("payload"), time.Now())
		changes = append([]byte(nil), tx.Changes()...)
		return nil
	})
	before := digest(t, cp)
	for name, bad := range map[string][]byte{
		"truncated":  changes[:len(changes)-3],
		"unknown op": append([]byte{200}, changes...),
	} {
		err := try(cp, func(tx *store.Tx) error { return tx.Apply(bad) })
		if !errors.Is(err, store.ErrBadChanges) {
			t.Errorf("%s: %v, want ErrBadChanges", name, err)
		}
		if digest(t, cp) != before {
			t.Errorf("%s: the refused change set changed the copy", name)
		}
	}
}

// With a shipper, a commit ships its change set first and records the
// position it returns; a shipper's error rolls the transaction back, and
// the position survives a reopen.
func TestShipBeforeCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "o.db")
	f, err := store.Open(t.Context(), path, store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	var shipped [][]byte
	fail := error(nil)
	f.SetShipper(func(changes []byte, at store.Position) (store.Position, error) {
		if fail != nil {
			return at, fail
		}
		shipped = append(shipped, append([]byte(nil), changes...))
		return store.Position{Applied: at.Applied + 1, Seq: at.Seq + 10, Sum: at.Sum + uint64(len(changes))}, nil
	})
	commit(t, f, func(tx *store.Tx) error { return tx.Put([]byte("a"), []byte("1")) })
	commit(t, f, func(tx *store.Tx) error { _, _, err := tx.Get([]byte("a")); return err })
	if len(shipped) != 1 {
		t.Fatalf("shipped %d change sets, want 1 (a read ships nothing)", len(shipped))
	}
	fail = fmt.Errorf("%w: test", store.ErrFenced)
	err = try(f, func(tx *store.Tx) error { return tx.Put([]byte("a"), []byte("2")) })
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("commit with a fenced shipper: %v", err)
	}
	commit(t, f, func(tx *store.Tx) error {
		v, _, err := tx.Get([]byte("a"))
		if string(v) != "1" {
			t.Errorf("a write whose shipping failed committed: a = %q", v)
		}
		return err
	})
	want := f.Position()
	if want.Applied != 1 || want.Seq != 10 {
		t.Fatalf("position %+v after one shipped change set", want)
	}
	f.Close()
	g := open(t, path)
	if got := g.Position(); got != want {
		t.Fatalf("position after reopen %+v, want %+v", got, want)
	}
}

// Transactions made of several calls, each in its own savepoint and some
// rolled back to it (group commit), ship a change set that reproduces the
// home on a copy: a call rolled back leaves nothing in it. The home's edge
// cache stays what its file holds.
func TestSavepointsRolledBackLeaveNoChanges(t *testing.T) {
	home, cp := newFile(t), newFile(t)
	home.CaptureAll(true)
	r := rand.New(rand.NewSource(2))
	rolledBack := 0
	for i := range 200 {
		tx, err := home.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for range 1 + r.Intn(4) {
			sp, err := tx.Savepoint()
			if err != nil {
				t.Fatal(err)
			}
			if err := randomTx(r, tx); err != nil {
				t.Fatal(err)
			}
			if r.Intn(3) == 0 {
				rolledBack++
				err = sp.RollbackTo()
			} else {
				err = sp.Release()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		changes := append([]byte(nil), tx.Changes()...)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		commit(t, cp, func(tx *store.Tx) error { return tx.Apply(changes) })
		if a, b := digest(t, home), digest(t, cp); a != b {
			t.Fatalf("after transaction %d the copy differs from its home (%x, %x)", i, a, b)
		}
		var cached, stored []store.Edge
		commit(t, home, func(tx *store.Tx) (err error) {
			cached, err = tx.CachedEdges()
			cached = slices.Clone(cached)
			return err
		})
		commit(t, home, func(tx *store.Tx) (err error) { stored, err = tx.Edges(); return err })
		for _, es := range [][]store.Edge{cached, stored} {
			for i := range es {
				es[i].State, es[i].NextAttempt = "", "" // for operators, derived by Edges only
			}
		}
		if fmt.Sprint(cached) != fmt.Sprint(stored) {
			t.Fatalf("after transaction %d the home's cached edges %v, its file's %v", i, cached, stored)
		}
	}
	if rolledBack == 0 {
		t.Fatal("no call was rolled back: the test tests nothing")
	}
}
