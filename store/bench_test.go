package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

// BenchmarkGroupTx is one call's writes (a state put and a log append,
// what counter inc does) inside a transaction of 64 such calls, with and
// without a savepoint around each (the savepoint's own cost in a group
// commit, against the same transaction without it), and with savepoints
// in a transaction that defers its writes to its commit (Defer), as a
// batch of calls does.
func BenchmarkGroupTx(b *testing.B) {
	for _, c := range []struct{ savepoints, deferred bool }{{false, false}, {true, false}, {true, true}} {
		savepoints := c.savepoints
		b.Run(fmt.Sprintf("savepoints=%v/deferred=%v", savepoints, c.deferred), func(b *testing.B) {
			f, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "o.db"), store.SyncNormal)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			key := []byte("value")
			b.ReportAllocs()
			b.ResetTimer()
			var tx *store.Tx
			for i := range b.N {
				if i%64 == 0 {
					if tx != nil {
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					}
					if tx, err = f.Begin(); err != nil {
						b.Fatal(err)
					}
					if c.deferred {
						tx.Defer()
					}
				}
				var sp store.Savepoint
				if savepoints {
					if sp, err = tx.Savepoint(); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Put(key, strconv.AppendInt(nil, int64(i), 10)); err != nil {
					b.Fatal(err)
				}
				if _, err := tx.Append("changes", fmt.Appendf(nil, `{"value":%d}`, i), time.Now()); err != nil {
					b.Fatal(err)
				}
				if savepoints {
					if err := sp.Release(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if tx != nil {
				tx.Commit()
			}
		})
	}
}

// BenchmarkCallRecord is one keyed call's writes (a state put, what
// ledger add does, plus its record: a 32-byte request hash, the reply and
// the time under a 40-byte key), committed one per transaction, against
// the same call without the record, alternating in one run. It reports
// each side's µs per call and the file's bytes per record.
//
//	go test ./store -run '^$' -bench CallRecord -benchtime 20000x
func BenchmarkCallRecord(b *testing.B) {
	ctx := context.Background()
	open := func(name string) *store.File {
		f, err := store.Open(ctx, filepath.Join(b.TempDir(), name), store.SyncNormal)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		return f
	}
	plain, keyed := open("plain.db"), open("keyed.db")
	hash := make([]byte, 32)
	var took [2]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for side, f := range []*store.File{plain, keyed} {
			start := time.Now()
			tx, err := f.Begin()
			if err != nil {
				b.Fatal(err)
			}
			reply := strconv.AppendInt(nil, int64(i), 10)
			if err := tx.Put(fmt.Appendf(nil, "entry/%08d", i), reply); err != nil {
				b.Fatal(err)
			}
			if side == 1 {
				key := fmt.Sprintf("call:ledger/a:receive:ledger/p:jobs:%d:0", i)
				if err := tx.RecordCall(key, store.CallRecord{Request: hash, Reply: reply, At: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			took[side] += time.Since(start)
		}
	}
	b.StopTimer()
	ps, _ := plain.Size()
	ks, _ := keyed.Size()
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Microseconds())/n, "µs/plain-call")
	b.ReportMetric(float64(took[1].Microseconds())/n, "µs/keyed-call")
	b.ReportMetric(float64(ks-ps)/n, "bytes/record")
}
