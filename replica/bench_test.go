package replica_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

// BenchmarkShip is one committed write (a state put and an event), with
// no shipper (the baseline) and shipped to a single-server stream before
// its commit: the output gate's cost without JetStream's replication.
func BenchmarkShip(b *testing.B) {
	l, _ := runLog(b)
	runs := 0
	for _, ship := range []bool{false, true} {
		b.Run(fmt.Sprintf("shipped=%v", ship), func(b *testing.B) {
			f := openFile(b, filepath.Join(b.TempDir(), "home.db"))
			if ship {
				// A subject of its own per run: a new file starts a new stream.
				runs++
				f.SetShipper(l.Shipper(fmt.Sprint(subj, runs), "node-a", 5*time.Second))
			}
			b.ReportAllocs()
			for i := range b.N {
				if err := write(f, fmt.Sprint("k", i%100), fmt.Sprint(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCatchUp applies a stream of change sets to a fresh copy: the
// catch-up rate of a takeover or a new copy, in change sets per second.
func BenchmarkCatchUp(b *testing.B) {
	l, _ := runLog(b)
	home := openFile(b, filepath.Join(b.TempDir(), "home.db"))
	home.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	const n = 2000
	for i := range n {
		if err := write(home, fmt.Sprint("k", i%100), fmt.Sprint(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var took time.Duration
	for i := range b.N {
		cp := openFile(b, filepath.Join(b.TempDir(), fmt.Sprint("copy", i, ".db")))
		start := time.Now()
		if _, k, err := l.CatchUp(b.Context(), subj, cp); err != nil || k != n {
			b.Fatalf("caught up %d of %d: %v", k, n, err)
		}
		took += time.Since(start)
		cp.Close()
	}
	b.ReportMetric(float64(n*b.N)/took.Seconds(), "changes/s")
}

// BenchmarkSnapshot stores a snapshot of a 10 MB and a 100 MB object file
// (state values of 512 bytes, half random, so they compress about 2:1) and
// restores it into a new file: the time of each and the size stored.
func BenchmarkSnapshot(b *testing.B) {
	for _, mb := range []int{10, 100} {
		b.Run(fmt.Sprintf("file=%dMB", mb), func(b *testing.B) {
			l, _ := runLog(b)
			dir := b.TempDir()
			path := filepath.Join(dir, "home.db")
			home := openFile(b, path)
			subject := fmt.Sprint(subj, mb)
			home.SetShipper(l.Shipper(subject, "node-a", 30*time.Second))
			rng := rand.New(rand.NewPCG(1, 2))
			value := make([]byte, 512)
			for t := range mb * 20 { // 100 values of 512 bytes per transaction
				tx, err := home.Begin()
				if err != nil {
					b.Fatal(err)
				}
				for k := range 100 {
					for i := range value {
						if i%2 == 0 {
							value[i] = byte(rng.Uint32())
						} else {
							value[i] = 'x'
						}
					}
					if err := tx.Put(fmt.Appendf(nil, "k%d-%d", t, k), value); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			ctx := b.Context()
			var size int64
			var snap, restore time.Duration
			var stored int64
			var prev uint64
			b.ResetTimer()
			for i := range b.N {
				// Each round one more change set, so it is a new snapshot.
				if err := write(home, "round", fmt.Sprint(i)); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				at, n, err := l.Snapshot(ctx, subject, path, prev)
				if err != nil {
					b.Fatal(err)
				}
				snap += time.Since(start)
				prev, stored = at.Applied, n
				dst := filepath.Join(dir, fmt.Sprint("restored", i, ".db"))
				start = time.Now()
				if _, ok, err := l.Restore(ctx, subject, dst); err != nil || !ok {
					b.Fatalf("restore: %v %v", ok, err)
				}
				restore += time.Since(start)
				st, err := os.Stat(dst) // the snapshot's file: the home's, vacuumed
				if err != nil {
					b.Fatal(err)
				}
				size = st.Size()
				store.RemoveFile(dst)
			}
			b.ReportMetric(float64(size)/(1<<20), "snapshot-file-MB")
			b.ReportMetric(float64(stored)/(1<<20), "stored-MB")
			b.ReportMetric(snap.Seconds()*1000/float64(b.N), "snapshot-ms")
			b.ReportMetric(restore.Seconds()*1000/float64(b.N), "restore-ms")
		})
	}
}
