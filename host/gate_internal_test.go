package host

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSyncGate checks the output gate's rules with a hand-driven fsync:
// nothing waits on a clean gate; a release waits for an fsync that began
// after the commits before it, including one that commits nothing but came
// while an fsync was under way; releases run in order; a failed fsync is
// every waiter's error and the next one is tried again; and readers are
// capped at what is durable.
func TestSyncGate(t *testing.T) {
	g := &syncGate{}
	syncs := make(chan chan error) // each fsync hands the test its outcome
	g.reset(func() error {
		res := make(chan error)
		syncs <- res
		return <-res
	}, 10)
	var (
		mu  sync.Mutex
		got []string
	)
	record := func(name string) func(error) {
		return func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				name += " failed"
			}
			got = append(got, name)
		}
	}
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	start := func(released func(error)) {
		if g.after(released) {
			go g.run()
		}
	}
	nextSync := func() chan error {
		t.Helper()
		select {
		case res := <-syncs:
			return res
		case <-time.After(10 * time.Second):
			t.Fatal("no fsync began")
			return nil
		}
	}
	waitFor := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(seen(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("released %v, want %v", seen(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// Clean: released at once, no fsync.
	start(record("clean"))
	waitFor("clean")
	if _, ok := g.cap(); ok {
		t.Fatal("a clean gate caps readers")
	}

	// A commit: its release waits for an fsync; so does a read-only
	// call that came while that fsync runs, and it needs no other.
	g.beginCommit()
	if c, ok := g.cap(); !ok || c != 10 {
		t.Fatalf("cap while committing: %d %v, want 10", c, ok)
	}
	g.endCommit(true, 12, false)
	start(record("a"))
	first := nextSync()
	start(record("read-only"))
	if c, ok := g.cap(); !ok || c != 10 {
		t.Fatalf("cap with 11..12 not durable: %d %v, want 10", c, ok)
	}
	time.Sleep(20 * time.Millisecond)
	if len(seen()) != 1 {
		t.Fatalf("released %v before the fsync returned", seen())
	}
	first <- nil
	waitFor("clean", "a", "read-only")
	if _, ok := g.cap(); ok {
		t.Fatal("cap once everything is durable")
	}

	// A failed fsync: its waiters fail, and the next waiter gets a new
	// fsync even with no commit since.
	g.beginCommit()
	g.endCommit(true, 13, false)
	start(record("b"))
	nextSync() <- errors.New("disk gone")
	waitFor("clean", "a", "read-only", "b failed")
	if c, ok := g.cap(); !ok || c != 12 {
		t.Fatalf("cap after a failed fsync: %d %v, want 12", c, ok)
	}
	start(record("c"))
	nextSync() <- nil
	waitFor("clean", "a", "read-only", "b failed", "c")

	// A commit durable in itself (SQLite fsynced it) needs no fsync of
	// the gate's and raises what readers see.
	g.beginCommit()
	g.endCommit(true, 20, true)
	if _, ok := g.cap(); ok {
		t.Fatal("cap after a commit that was durable in itself")
	}
	start(record("d"))
	waitFor("clean", "a", "read-only", "b failed", "c", "d")

	// flush waits like any release.
	g.beginCommit()
	g.endCommit(true, 21, false)
	flushed := make(chan error)
	go func() { flushed <- g.flush() }()
	res := nextSync()
	select {
	case <-flushed:
		t.Fatal("flush returned before its fsync")
	case <-time.After(20 * time.Millisecond):
	}
	res <- nil
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if !g.idle() {
		t.Fatal("gate not idle once flushed")
	}
}
