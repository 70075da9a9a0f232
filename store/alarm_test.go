package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

func alarmOf(t *testing.T, f *store.File) (store.Alarm, bool) {
	t.Helper()
	a, ok, err := f.Alarm()
	if err != nil {
		t.Fatal(err)
	}
	return a, ok
}

// The alarm is part of the transaction: a rollback, or a rollback to a
// savepoint, sets nothing; a commit sets it, a later one replaces or
// deletes it, and a read-only look at the file sees what was committed.
//
// conformance: A01
func TestAlarmIsTransactional(t *testing.T) {
	f := newFile(t)
	at := time.Unix(1_800_000_000, 0)
	a := store.Alarm{Time: at, Next: at}
	if err := try(f, func(tx *store.Tx) error {
		if err := tx.SetAlarm(a); err != nil {
			return err
		}
		return errors.New("the call fails")
	}); err == nil {
		t.Fatal("the failing transaction committed")
	}
	if got, ok := alarmOf(t, f); ok {
		t.Fatalf("a rolled-back transaction set an alarm: %+v", got)
	}
	commit(t, f, func(tx *store.Tx) error {
		sp, err := tx.Savepoint()
		if err != nil {
			return err
		}
		if err := tx.SetAlarm(a); err != nil {
			return err
		}
		if !tx.AlarmChanged() {
			t.Error("AlarmChanged is false after SetAlarm")
		}
		return sp.RollbackTo()
	})
	if got, ok := alarmOf(t, f); ok {
		t.Fatalf("a call rolled back to its savepoint set an alarm: %+v", got)
	}
	commit(t, f, func(tx *store.Tx) error { return tx.SetAlarm(a) })
	if got, ok := alarmOf(t, f); !ok || !got.Time.Equal(at) || !got.Next.Equal(at) || got.Attempts != 0 {
		t.Fatalf("alarm %+v %v", got, ok)
	}
	retry := store.Alarm{Time: at, Attempts: 2, Next: at.Add(time.Second)}
	commit(t, f, func(tx *store.Tx) error { return tx.SetAlarm(retry) })
	if got, _, err := store.ReadAlarm(context.Background(), f.Path()); err != nil || got.Attempts != 2 || !got.Next.Equal(retry.Next) {
		t.Fatalf("read-only: %+v %v", got, err)
	}
	commit(t, f, func(tx *store.Tx) error { return tx.DeleteAlarm() })
	if got, ok := alarmOf(t, f); ok {
		t.Fatalf("deleted alarm still there: %+v", got)
	}
	if _, ok, err := store.ReadAlarm(context.Background(), f.Path()); ok || err != nil {
		t.Fatalf("read-only after delete: %v %v", ok, err)
	}
	if _, _, err := store.ReadAlarm(context.Background(), filepath.Join(t.TempDir(), "none.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// A copy applying its home's change sets holds the home's alarm: set,
// retried and deleted.
//
// conformance: A05
func TestAlarmReplicates(t *testing.T) {
	home, cp := newFile(t), newFile(t)
	home.CaptureAll(true)
	at := time.Unix(1_800_000_000, 5)
	for i, write := range []func(*store.Tx) error{
		func(tx *store.Tx) error { return tx.SetAlarm(store.Alarm{Time: at, Next: at}) },
		func(tx *store.Tx) error {
			return tx.SetAlarm(store.Alarm{Time: at, Attempts: 3, Next: at.Add(4 * time.Second)})
		},
		func(tx *store.Tx) error { return tx.DeleteAlarm() },
	} {
		tx, err := home.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if err := write(tx); err != nil {
			t.Fatal(err)
		}
		changes := append([]byte(nil), tx.Changes()...)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		commit(t, cp, func(tx *store.Tx) error { return tx.Apply(changes) })
		ha, hok := alarmOf(t, home)
		ca, cok := alarmOf(t, cp)
		if hok != cok || ha.Attempts != ca.Attempts || !ha.Time.Equal(ca.Time) || !ha.Next.Equal(ca.Next) {
			t.Fatalf("step %d: home's alarm %+v %v, the copy's %+v %v", i, ha, hok, ca, cok)
		}
		if digest(t, home) != digest(t, cp) {
			t.Fatalf("step %d: digests differ", i)
		}
	}
}

// The digest covers the alarm: two files that differ only in it differ.
func TestDigestCoversTheAlarm(t *testing.T) {
	a, b := newFile(t), newFile(t)
	at := time.Unix(1_800_000_000, 0)
	commit(t, a, func(tx *store.Tx) error { return tx.SetAlarm(store.Alarm{Time: at, Next: at}) })
	if digest(t, a) == digest(t, b) {
		t.Fatal("a file with an alarm has the digest of one without")
	}
}

// fixtureFile writes the file a fixture's SQL makes and checks it is at
// version.
func fixtureFile(t *testing.T, fixture string, version int) string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "old.db")
	if err := writeSQL(path, string(script)); err != nil {
		t.Fatal(err)
	}
	if v := userVersion(t, path); v != version {
		t.Fatalf("fixture at version %d, want %d", v, version)
	}
	return path
}

// openUpgraded opens the old file at path, which upgrades it, and checks
// it is at Version with a new file's columns; cleanup closes it.
func openUpgraded(t *testing.T, path string) *store.File {
	t.Helper()
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	open(t, fresh).Close()
	f := open(t, path)
	t.Cleanup(func() { f.Close() })
	if v := userVersion(t, path); v != store.Version {
		t.Fatalf("version %d after open, want %d", v, store.Version)
	}
	if got, want := columns(t, path), columns(t, fresh); !equalColumns(got, want) {
		t.Fatalf("upgraded columns %v, a new file's %v", got, want)
	}
	return f
}

// A file made by the last binary before alarms (schema version 2) opens,
// keeps what it held, has no alarm, and takes one.
func TestSchemaUpgradeFromVersion2(t *testing.T) {
	path := fixtureFile(t, "v2-3dd2e68.sql", 2)
	if _, ok, err := store.ReadAlarm(context.Background(), path); ok || err != nil {
		t.Fatalf("read-only alarm of a version 2 file: %v %v", ok, err)
	}
	f := openUpgraded(t, path)
	if p := f.Position(); p.Applied != 4 || p.Seq != 9 || p.Sum != 12345 {
		t.Fatalf("position %+v", p)
	}
	commit(t, f, func(tx *store.Tx) error {
		if v, ok, err := tx.Get([]byte("count")); err != nil || !ok || string(v) != "7" {
			t.Errorf("state %q %v %v", v, ok, err)
		}
		if c, err := tx.Cursor("chat/room1", "t"); err != nil || c != 5 {
			t.Errorf("cursor %d %v", c, err)
		}
		if _, ok, err := tx.Alarm(); ok || err != nil {
			t.Errorf("alarm in an upgraded file: %v %v", ok, err)
		}
		at := time.Unix(1_800_000_000, 0)
		return tx.SetAlarm(store.Alarm{Time: at, Next: at})
	})
	if _, ok := alarmOf(t, f); !ok {
		t.Fatal("the upgraded file did not keep its alarm")
	}
}

// The digest covers the recorded calls: two files that differ only in a
// call's reply differ.
func TestDigestCoversRecordedCalls(t *testing.T) {
	a, b := newFile(t), newFile(t)
	at := time.Unix(1_800_000_000, 0)
	commit(t, a, func(tx *store.Tx) error {
		return tx.RecordCall("k", store.CallRecord{Request: []byte{1}, Reply: []byte("one"), At: at})
	})
	commit(t, b, func(tx *store.Tx) error {
		return tx.RecordCall("k", store.CallRecord{Request: []byte{1}, Reply: []byte("two"), At: at})
	})
	if digest(t, a) == digest(t, b) {
		t.Fatal("files whose recorded calls differ have one digest")
	}
}
