package host_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// benchNode is a node with the counter uploaded and counter/b warm.
func benchNode(b *testing.B, mod func(*host.Config)) *host.Node {
	b.Helper()
	n, _ := hosttest.Start(b, hosttest.Options{Configure: mod})
	upload(b, n, "counter", "counter")
	if _, err := n.Call(context.Background(), host.ObjectID{Program: "counter", ID: "b"}, "get", nil); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkNodeCall is a warm method call in process: the object's lock, the
// VM round trip with the budget, and its SQLite transaction (BEGIN
// IMMEDIATE ... COMMIT). "inc" writes the state value and appends one event
// to the log; "get" reads and commits an empty transaction.
func BenchmarkNodeCall(b *testing.B) {
	for _, method := range []string{"get", "inc"} {
		b.Run(method, func(b *testing.B) {
			n := benchNode(b, nil)
			id := host.ObjectID{Program: "counter", ID: "b"}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := n.Call(ctx, id, method, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSQLiteTx is the baseline for a committed call: a bare transaction
// on an object file (same schema, same synchronous setting as the node's
// default) doing the counter's writes without the VM. "put" is the one state
// write; "put+append" adds the log append that inc's publish makes.
func BenchmarkSQLiteTx(b *testing.B) {
	for _, c := range []struct {
		name   string
		append bool
	}{{"put", false}, {"put+append", true}} {
		b.Run(c.name, func(b *testing.B) {
			f, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "o.db"), host.DefaultConfig().Sync)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			key := []byte("value")
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				tx, err := f.Begin()
				if err != nil {
					b.Fatal(err)
				}
				v := strconv.AppendInt(nil, int64(i), 10)
				if err := tx.Put(key, v); err != nil {
					b.Fatal(err)
				}
				if c.append {
					if _, err := tx.Append("changes", fmt.Appendf(nil, `{"value":%d}`, i), time.Now()); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkActivation is a cold activation with a warm compilation cache:
// each op calls "get" on a new object id, which creates its file, makes an
// instance and runs the call (and, past MaxActiveObjects, deactivates the
// least recently used object). It alternates two nodes, one without
// instances made ahead (pool=0, the baseline) and one with the default
// pool; "back-to-back" activates as fast as it can (the pool refills
// behind), "spaced" lets the pool refill between activations, as first
// calls spread over time find it. Each reports its mean and p50 in µs.
func BenchmarkActivation(b *testing.B) {
	for _, spaced := range []bool{false, true} {
		name := "back-to-back"
		if spaced {
			name = "spaced"
		}
		b.Run(name, func(b *testing.B) {
			sides := []struct {
				name string
				n    *host.Node
				lat  []time.Duration
			}{{name: "pool=0"}, {name: fmt.Sprintf("pool=%d", vm.DefaultPoolSize)}}
			for i := range sides {
				size := i * vm.DefaultPoolSize
				sides[i].n = benchNode(b, func(c *host.Config) { c.MaxActiveObjects, c.VM.PoolSize = 64, size })
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				for j := range sides {
					s := &sides[j]
					if spaced && j == 1 {
						b.StopTimer()
						for host.PooledInstances(s.n) == 0 {
							time.Sleep(time.Millisecond)
						}
						b.StartTimer()
					}
					start := time.Now()
					if _, err := s.n.Call(ctx, host.ObjectID{Program: "counter", ID: "a" + strconv.Itoa(i)}, "get", nil); err != nil {
						b.Fatal(err)
					}
					s.lat = append(s.lat, time.Since(start))
				}
			}
			b.StopTimer()
			for _, s := range sides {
				var sum time.Duration
				for _, d := range s.lat {
					sum += d
				}
				b.ReportMetric(float64(sum.Microseconds())/float64(len(s.lat)), s.name+"-mean-µs")
				b.ReportMetric(pctl(s.lat, 0.5), s.name+"-p50-µs")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkHTTPCall is the HTTP round trip on loopback through client.Client
// (keep-alive connections), for a warm object.
func BenchmarkHTTPCall(b *testing.B) {
	for _, method := range []string{"get", "inc"} {
		b.Run(method, func(b *testing.B) {
			n := benchNode(b, nil)
			c := client(n)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Call(ctx, "counter/b", method, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
