package replica_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// writeAll puts a key, appends an event, adds an edge and moves a receive
// cursor in one transaction: every part of the file a snapshot must carry.
func writeAll(f *store.File, i int) error {
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.Put([]byte(fmt.Sprint("k", i%5)), []byte(fmt.Sprint(i))); err != nil {
		return err
	}
	if _, err := tx.Append("t", []byte(fmt.Sprint("event ", i)), time.Unix(int64(i), 0)); err != nil {
		return err
	}
	if i%10 == 0 {
		if _, err := tx.AddEdge(abi.FollowerObject, fmt.Sprint("tally/t", i), "node-a", "", "", time.Unix(int64(i), 0)); err != nil {
			return err
		}
	}
	if err := tx.SetCursor("chat/room1", "messages", uint64(i)); err != nil {
		return err
	}
	return tx.Commit()
}

// A snapshot plus the change sets after it equals the original file's
// logical contents (state, log, edges, cursors); the stream no longer
// holds the change sets before it, so a copy further behind is told to
// restore (ErrBehindSnapshot) and, restored and caught up, equals its home.
func TestRestoreOfSnapshotPlusChangesEqualsTheOriginal(t *testing.T) {
	l, _ := runLog(t)
	ctx := t.Context()
	dir := t.TempDir()
	homePath := filepath.Join(dir, "home.db")
	home := openFile(t, homePath)
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	// A copy that follows the first few change sets, then falls behind.
	behind := openFile(t, filepath.Join(dir, "behind.db"))
	for i := range 40 {
		if err := writeAll(home, i); err != nil {
			t.Fatal(err)
		}
		if i == 9 {
			if _, _, err := l.CatchUp(ctx, subj, behind); err != nil {
				t.Fatal(err)
			}
		}
	}
	at, size, err := l.Snapshot(ctx, subj, homePath, 0)
	if err != nil {
		t.Fatal(err)
	}
	if at != home.Position() || size <= 0 {
		t.Fatalf("snapshot at %+v (%d bytes), want the home's %+v", at, size, home.Position())
	}
	first, err := l.First(ctx, subj)
	if err != nil || first.Seq != at.Seq {
		t.Fatalf("first change set after the snapshot's purge: %+v %v, want stream sequence %d", first, err, at.Seq)
	}
	for i := 40; i < 60; i++ {
		if err := writeAll(home, i); err != nil {
			t.Fatal(err)
		}
	}

	// The copy further behind cannot catch up from the stream alone.
	if _, _, err := l.CatchUp(ctx, subj, behind); !errors.Is(err, replica.ErrBehindSnapshot) {
		t.Fatalf("catch up of a copy behind the snapshot: %v, want ErrBehindSnapshot", err)
	}
	// A new file restores, then catches up.
	restored := filepath.Join(dir, "restored.db")
	rat, ok, err := l.Restore(ctx, subj, restored)
	if err != nil || !ok || rat != at {
		t.Fatalf("restore: %+v %v %v, want the snapshot's %+v", rat, ok, err, at)
	}
	cp := openFile(t, restored)
	if _, n, err := l.CatchUp(ctx, subj, cp); err != nil || n != 20 {
		t.Fatalf("catch up after the restore: %d change sets, %v; want 20", n, err)
	}
	if cp.Position() != home.Position() || digest(t, cp) != digest(t, home) {
		t.Fatal("snapshot plus change sets differs from the original")
	}

	// A later snapshot replaces the first, which is deleted.
	at2, _, err := l.Snapshot(ctx, subj, homePath, at.Applied)
	if err != nil || at2 != home.Position() {
		t.Fatalf("second snapshot: %+v %v", at2, err)
	}
	again := filepath.Join(dir, "again.db")
	if rat, ok, err := l.Restore(ctx, subj, again); err != nil || !ok || rat != at2 {
		t.Fatalf("restore of the second snapshot: %+v %v %v", rat, ok, err)
	}
	cp2 := openFile(t, again)
	if digest(t, cp2) != digest(t, home) {
		t.Fatal("the second snapshot differs from the original")
	}
	// The home goes on shipping: the purge kept its last change set, so
	// the next publish's expected last sequence still holds.
	if err := writeAll(home, 60); err != nil {
		t.Fatalf("the home's write after the purge: %v", err)
	}
}

// A corrupted snapshot is refused, not restored.
func TestCorruptSnapshotIsRefused(t *testing.T) {
	l, js := runLog(t)
	ctx := t.Context()
	dir := t.TempDir()
	homePath := filepath.Join(dir, "home.db")
	home := openFile(t, homePath)
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	for i := range 5 {
		if err := writeAll(home, i); err != nil {
			t.Fatal(err)
		}
	}
	at, _, err := l.Snapshot(ctx, subj, homePath, 0)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, replica.SnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Replace the snapshot's bytes with something else under its name.
	if _, err := obs.PutBytes(ctx, fmt.Sprintf("%s@%d", subj, at.Applied), []byte("not a zstd stream")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "restored.db")
	if _, _, err := l.Restore(ctx, subj, dst); !errors.Is(err, replica.ErrDiverged) {
		t.Fatalf("restore of a corrupted snapshot: %v, want ErrDiverged", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused snapshot left a file: %v", err)
	}
}
