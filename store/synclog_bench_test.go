package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/durable-host/host/store"
)

// BenchmarkSyncLog is one committed write made durable three ways: SQLite
// fsyncing its log in the commit (SyncFull), a SyncNormal commit followed
// by SyncLog (what the host's output gate does, off the object's lock),
// and a SyncNormal commit alone (not durable against power loss: the
// floor).
func BenchmarkSyncLog(b *testing.B) {
	for _, mode := range []string{"full", "normal+synclog", "normal"} {
		b.Run(mode, func(b *testing.B) {
			sync := store.SyncNormal
			if mode == "full" {
				sync = store.SyncFull
			}
			f, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "o.db"), sync)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			for i := range b.N {
				tx, err := f.Begin()
				if err != nil {
					b.Fatal(err)
				}
				// A new key each time: a write that changes nothing
				// commits no page, and nothing is synced.
				if err := tx.Put(fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				if mode == "normal+synclog" {
					if err := f.SyncLog(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
