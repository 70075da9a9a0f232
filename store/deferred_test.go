package store_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

// A transaction that defers its writes (Defer) is the same transaction as
// one writing through, seen from every side: each read inside it answers
// the same, each event gets the same seq, the change set it records for
// copies is the same byte for byte, and the file it commits holds the
// same state and log. Random calls, each in a savepoint released or
// rolled back to, with writes to a few keys, deletes, appends, scans and
// log reads mixed in, run on two files side by side, one deferring.
func TestDeferredTxIsTheSameTransaction(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			dir := t.TempDir()
			through, err := store.Open(ctx, filepath.Join(dir, "through.db"), store.SyncNormal)
			if err != nil {
				t.Fatal(err)
			}
			defer through.Close()
			deferred, err := store.Open(ctx, filepath.Join(dir, "deferred.db"), store.SyncNormal)
			if err != nil {
				t.Fatal(err)
			}
			defer deferred.Close()
			through.CaptureAll(true)
			deferred.CaptureAll(true)
			r := rand.New(rand.NewPCG(seed, 99))
			// Half the seeds run no statement that makes the held writes
			// go to SQLite before the commit (scans, log reads), so the
			// commit has many events to write at once.
			kinds := 8
			if seed%2 == 0 {
				kinds = 6
			}
			at := time.Unix(1_700_000_000, 0)
			for txn := 0; txn < 4; txn++ {
				a, err := through.Begin()
				if err != nil {
					t.Fatal(err)
				}
				b, err := deferred.Begin()
				if err != nil {
					t.Fatal(err)
				}
				b.Defer()
				for call := 0; call < 24; call++ {
					sa, err := a.Savepoint()
					if err != nil {
						t.Fatal(err)
					}
					sb, err := b.Savepoint()
					if err != nil {
						t.Fatal(err)
					}
					for op := r.IntN(8); op > 0; op-- {
						step(t, r, a, b, at, kinds)
					}
					if r.IntN(3) == 0 {
						err, errB := sa.RollbackTo(), sb.RollbackTo()
						if err != nil || errB != nil {
							t.Fatal(err, errB)
						}
					} else {
						err, errB := sa.Release(), sb.Release()
						if err != nil || errB != nil {
							t.Fatal(err, errB)
						}
					}
					same(t, "change set", a.Changes(), b.Changes())
					same(t, "last seq", a.LastSeq(), b.LastSeq())
					same(t, "published", a.Published(), b.Published())
				}
				if r.IntN(4) == 0 {
					a.Rollback()
					b.Rollback()
				} else {
					err, errB := a.Commit(), b.Commit()
					if err != nil || errB != nil {
						t.Fatal(err, errB)
					}
				}
				sameFiles(t, through, deferred)
			}
		})
	}
}

// step runs one random operation on both transactions and checks they
// answer alike.
func step(t *testing.T, r *rand.Rand, a, b *store.Tx, at time.Time, kinds int) {
	t.Helper()
	key := []byte{'k', byte('0' + r.IntN(5))}
	switch r.IntN(kinds) {
	case 0, 1:
		v := fmt.Appendf(nil, "v%d", r.IntN(1000))
		switch r.IntN(10) {
		case 0:
			v = nil
		case 1: // over what a transaction keeps once SQLite has it
			v = append(v, bytes.Repeat([]byte{'x'}, 5000)...)
		}
		same(t, "put", a.Put(key, v), b.Put(key, v))
	case 2:
		same(t, "delete", a.Delete(key), b.Delete(key))
	case 3:
		va, oka, erra := a.Get(key)
		vb, okb, errb := b.Get(key)
		same(t, "get", fmt.Sprint(string(va), oka, erra), fmt.Sprint(string(vb), okb, errb))
	case 4, 5:
		topic := []string{"t1", "t2"}[r.IntN(2)]
		p := fmt.Appendf(nil, "e%d", r.IntN(1000))
		sa, erra := a.Append(topic, p, at)
		sb, errb := b.Append(topic, p, at)
		same(t, "append", fmt.Sprint(sa, erra), fmt.Sprint(sb, errb))
	case 6:
		pa, erra := a.Scan([]byte("k"), 10)
		pb, errb := b.Scan([]byte("k"), 10)
		same(t, "scan", fmt.Sprint(pa, erra), fmt.Sprint(pb, errb))
	case 7:
		ha, erra := a.Head()
		hb, errb := b.Head()
		same(t, "head", fmt.Sprint(ha, erra), fmt.Sprint(hb, errb))
		ea, erra := a.Read(store.Query{Topic: "t1"})
		eb, errb := b.Read(store.Query{Topic: "t1"})
		same(t, "read", fmt.Sprint(ea, erra), fmt.Sprint(eb, errb))
	}
}

func same[T any](t *testing.T, what string, a, b T) {
	t.Helper()
	if !reflect.DeepEqual(a, b) {
		if x, ok := any(a).([]byte); ok && bytes.Equal(x, any(b).([]byte)) {
			return
		}
		t.Fatalf("%s: writing through %v, deferred %v", what, a, b)
	}
}

// sameFiles checks two files hold the same state and log.
func sameFiles(t *testing.T, a, b *store.File) {
	t.Helper()
	ta, err := a.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Rollback()
	tb, err := b.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Rollback()
	sa, erra := ta.Scan(nil, 1000)
	sb, errb := tb.Scan(nil, 1000)
	same(t, "state", fmt.Sprint(sa, erra), fmt.Sprint(sb, errb))
	la, erra := ta.Read(store.Query{})
	lb, errb := tb.Read(store.Query{})
	same(t, "log", fmt.Sprint(la, erra), fmt.Sprint(lb, errb))
}
