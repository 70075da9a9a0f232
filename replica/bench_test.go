package replica_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkShip is one committed write (a state put and an event) shipped
// to a single-server stream before its commit: the output gate's cost
// without JetStream's replication.
func BenchmarkShip(b *testing.B) {
	l, _ := runLog(b)
	f := openFile(b, filepath.Join(b.TempDir(), "home.db"))
	f.SetShipper(l.Shipper(subj, "node-a", 5*time.Second))
	b.ReportAllocs()
	for i := range b.N {
		if err := write(f, fmt.Sprint("k", i%100), fmt.Sprint(i)); err != nil {
			b.Fatal(err)
		}
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
