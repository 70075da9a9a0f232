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
// without a savepoint around each: the savepoint's own cost in a group
// commit, against the same transaction without it.
func BenchmarkGroupTx(b *testing.B) {
	for _, savepoints := range []bool{false, true} {
		b.Run(fmt.Sprintf("savepoints=%v", savepoints), func(b *testing.B) {
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
