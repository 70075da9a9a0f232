package replica_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// runLog starts an in-process NATS server with JetStream and opens the
// change stream on it.
func runLog(t testing.TB) (*replica.Log, jetstream.JetStream) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		ServerName: "replica-test", JetStream: true, StoreDir: t.TempDir(),
		DontListen: true, NoSigs: true, NoLog: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l, err := replica.Open(context.Background(), replica.Config{JetStream: js})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, js
}

func openFile(t testing.TB, path string) *store.File {
	t.Helper()
	f, err := store.Open(context.Background(), path, store.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func write(f *store.File, key, value string) error {
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	if err := tx.Put([]byte(key), []byte(value)); err != nil {
		tx.Rollback()
		return err
	}
	if _, err := tx.Append("t", []byte(key+"="+value), time.Unix(1, 0)); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func read(t *testing.T, f *store.File, key string) string {
	t.Helper()
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	v, _, err := tx.Get([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

func digest(t *testing.T, f *store.File) uint64 {
	t.Helper()
	d, err := f.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

const subj = "host.changes.counter.6b31"

// A home ships each commit before it commits; a copy catching up from the
// stream reaches the home's contents and position, and a home reopened
// from its file goes on shipping where it was.
func TestShipAndCatchUp(t *testing.T) {
	l, _ := runLog(t)
	dir := t.TempDir()
	home := openFile(t, filepath.Join(dir, "home.db"))
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	for i := range 50 {
		if err := write(home, fmt.Sprint("k", i%7), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	cp := openFile(t, filepath.Join(dir, "copy.db"))
	at, n, err := l.CatchUp(t.Context(), subj, cp)
	if err != nil {
		t.Fatal(err)
	}
	hp := home.Position()
	if n != 50 || at != hp {
		t.Fatalf("caught up %d change sets to %+v, want 50 to the home's %+v", n, at, hp)
	}
	if digest(t, cp) != digest(t, home) {
		t.Fatal("the caught-up copy differs from its home")
	}
	// Reopened, the home continues the stream.
	home.Close()
	home = openFile(t, filepath.Join(dir, "home.db"))
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	if err := write(home, "after", "reopen"); err != nil {
		t.Fatalf("a reopened home's write: %v", err)
	}
	if _, n, err = l.CatchUp(t.Context(), subj, cp); err != nil || n != 1 {
		t.Fatalf("catch up after the reopen: %d, %v", n, err)
	}
	if read(t, cp, "after") != "reopen" || digest(t, cp) != digest(t, home) {
		t.Fatal("the copy missed the reopened home's write")
	}
}

// A node that takes the object over catches up and marks the stream: the
// old home's next write is refused (fenced) and rolled back, so it is in
// no copy and not in the old home's own file either.
func TestTakeoverFencesTheOldHome(t *testing.T) {
	l, _ := runLog(t)
	dir := t.TempDir()
	old := openFile(t, filepath.Join(dir, "old.db"))
	old.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	if err := write(old, "a", "1"); err != nil {
		t.Fatal(err)
	}
	next := openFile(t, filepath.Join(dir, "next.db"))
	if _, _, err := l.CatchUp(t.Context(), subj, next); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Mark(t.Context(), subj, "node-b", next); err != nil {
		t.Fatal(err)
	}
	next.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	err := write(old, "a", "stale")
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the old home's write after the takeover: %v, want fenced", err)
	}
	if v := read(t, old, "a"); v != "1" {
		t.Fatalf("the fenced write committed on the old home: a = %q", v)
	}
	if err := write(next, "a", "2"); err != nil {
		t.Fatalf("the new home's write: %v", err)
	}
	cp := openFile(t, filepath.Join(dir, "copy.db"))
	if _, _, err := l.CatchUp(t.Context(), subj, cp); err != nil {
		t.Fatal(err)
	}
	if v := read(t, cp, "a"); v != "2" {
		t.Fatalf("copy has a = %q, want the new home's 2", v)
	}
	// A takeover racing a write of the old home loses and catches up again.
	if _, err := l.Mark(t.Context(), subj, "node-c", cp); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Mark(t.Context(), subj, "node-b", next); !errors.Is(err, replica.ErrFenced) {
		t.Fatalf("a mark from behind the stream's end: %v, want fenced", err)
	}
}

// A stored change set with a flipped byte, or one missing, is detected and
// refused: the copy stays at the last good change and reports ErrDiverged.
func TestCorruptOrMissingChangesAreRefused(t *testing.T) {
	// 5 change sets are read one by one, 40 in a batch.
	for _, total := range []int{5, 40} {
		for _, tc := range []string{"flipped byte", "gap"} {
			t.Run(fmt.Sprintf("%s of %d", tc, total), func(t *testing.T) { corruptOrMissing(t, tc, total) })
		}
	}
}

func corruptOrMissing(t *testing.T, tc string, total int) {
	{
		{
			l, js := runLog(t)
			dir := t.TempDir()
			home := openFile(t, filepath.Join(dir, "home.db"))
			home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
			for i := range total {
				if err := write(home, "k", fmt.Sprint(i)); err != nil {
					t.Fatal(err)
				}
			}
			st, err := js.Stream(t.Context(), replica.Stream)
			if err != nil {
				t.Fatal(err)
			}
			// Change c is stream sequence c: take it out, and for the flip
			// put back a copy with one byte changed.
			c := uint64(3)
			if total > 20 {
				c = 30 // read in batches
			}
			m, err := st.GetMsg(t.Context(), c)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.DeleteMsg(t.Context(), c); err != nil {
				t.Fatal(err)
			}
			if tc == "flipped byte" {
				bad := nats.NewMsg(subj)
				for _, h := range []string{"Host-Applied", "Host-Sum", "Host-Enc"} {
					if v := m.Header.Get(h); v != "" {
						bad.Header.Set(h, v)
					}
				}
				bad.Data = append([]byte(nil), m.Data...)
				// The event's time, the last field: still a valid change set,
				// so only the checksum can tell.
				bad.Data[len(bad.Data)-1] ^= 0x02
				// Next after change c-1 in the subject's order.
				for seq := c + 1; seq <= uint64(total); seq++ {
					if err := st.DeleteMsg(t.Context(), seq); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := js.PublishMsg(t.Context(), bad); err != nil {
					t.Fatal(err)
				}
			}
			cp := openFile(t, filepath.Join(dir, "copy.db"))
			at, n, err := l.CatchUp(t.Context(), subj, cp)
			t.Logf("catch up: %v", err)
			if !errors.Is(err, replica.ErrDiverged) {
				t.Fatalf("catch up over a %s: %v, want ErrDiverged", tc, err)
			}
			if want := c - 1; uint64(n) != want || at.Applied != want || read(t, cp, "k") != fmt.Sprint(want-1) {
				t.Fatalf("copy at %+v after %d changes, k = %q; want the %d good changes only", at, n, read(t, cp, "k"), want)
			}
		}
	}
}

// A catch-up in batches reads through a consumer of its own and deletes
// it after: a stream takes at most 1,000 consumers, and in a chaos soak
// the catch-ups of a few hundred objects' copies after a few faults left
// more than that behind (the library keeps an idle one 5 minutes), so
// every later catch-up was refused and copies stayed short.
func TestBatchCatchUpsLeaveNoConsumers(t *testing.T) {
	l, js := runLog(t)
	dir := t.TempDir()
	home := openFile(t, filepath.Join(dir, "home.db"))
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	for i := range 40 { // more than batchFrom: read in batches
		if err := write(home, fmt.Sprint("k", i), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		cp := openFile(t, filepath.Join(dir, fmt.Sprintf("copy%d.db", i)))
		if _, n, err := l.CatchUp(t.Context(), subj, cp); err != nil || n != 40 {
			t.Fatalf("catch-up %d: %d change sets, %v", i, n, err)
		}
		cp.Close()
	}
	st, err := js.Stream(t.Context(), replica.Stream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Consumers == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers left on the change stream 10 s after 5 catch-ups in batches, want none", info.State.Consumers)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
