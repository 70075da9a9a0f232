package host_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/store"
)

// BenchmarkGroupCommit measures committed calls (counter inc: a state
// write and a publish; the Rust and the Go build) on one object from 1, 8
// and 64 concurrent clients,
// under --sync normal and full, without copies (one node) and with 2 (three
// nodes). Each configuration runs twice side by side, a commit per call
// (max batch 1, the baseline) and group commit (the default max batch),
// alternating rounds of 512 calls so both see the same machine. It reports
// each side's calls/s, p50 and p99, and the speed-up.
//
//	go test ./host -run '^$' -bench GroupCommit -benchtime 5x
func BenchmarkGroupCommit(b *testing.B) {
	const perRound = 512
	// The same counter built with each SDK: the Go guest's inc costs
	// about 100 µs of VM time, the Rust one's about 8 µs.
	guests := []string{"counter-rust", "counter"}
	for _, sync := range []store.Sync{store.SyncNormal, store.SyncFull} {
		for _, replicas := range []int{0, 2} {
			b.Run(fmt.Sprintf("sync=%s/replicas=%d", sync, replicas), func(b *testing.B) {
				type side struct {
					name string
					node *host.Node
				}
				var sides []side
				for _, batch := range []int{1, host.DefaultMaxBatch} {
					conf := func(c *host.Config) {
						c.Sync, c.MaxBatch, c.Replicas = sync, batch, replicas
						c.LeaseTTL, c.Heartbeat = host.DefaultLeaseTTL, host.DefaultHeartbeat
					}
					var n *host.Node
					o := hosttest.Options{Programs: guests, Configure: conf}
					if replicas == 0 {
						n, _ = hosttest.Start(b, o)
					} else {
						nodes, _ := hosttest.Cluster(b, 3, o)
						n = nodes[0]
					}
					sides = append(sides, side{fmt.Sprintf("batch=%d", batch), n})
				}
				ctx := context.Background()
				for _, guest := range guests {
					id := host.ObjectID{Program: guest, ID: "group"}
					for _, s := range sides {
						for range 50 { // activate on node 0 (its home) and warm the copies
							if _, err := s.node.Call(ctx, id, "inc", nil); err != nil {
								b.Fatal(err)
							}
						}
					}
				}
				for _, guest := range guests {
					id := host.ObjectID{Program: guest, ID: "group"}
					for _, clients := range []int{1, 8, 64} {
						b.Run(fmt.Sprintf("guest=%s/clients=%d", guest, clients), func(b *testing.B) {
							grouped := &hclient.Client{Base: sides[1].node.URL()}
							commits0 := metric(b, grouped, "host_commit_calls_count")
							calls0 := metric(b, grouped, "host_commit_calls_sum")
							lat := make([][]time.Duration, len(sides))
							wall := make([]time.Duration, len(sides))
							b.ResetTimer()
							for range b.N {
								for i, s := range sides {
									start := time.Now()
									lat[i] = append(lat[i], callRound(b, s.node, id, clients, perRound)...)
									wall[i] += time.Since(start)
								}
							}
							b.StopTimer()
							rate := make([]float64, len(sides))
							for i, s := range sides {
								rate[i] = float64(len(lat[i])) / wall[i].Seconds()
								b.ReportMetric(rate[i], s.name+"-calls/s")
								b.ReportMetric(pctl(lat[i], 0.50), s.name+"-p50-µs")
								b.ReportMetric(pctl(lat[i], 0.99), s.name+"-p99-µs")
							}
							b.ReportMetric(rate[1]/rate[0], "speedup")
							if commits := metric(b, grouped, "host_commit_calls_count") - commits0; commits > 0 {
								b.ReportMetric((metric(b, grouped, "host_commit_calls_sum")-calls0)/commits, "calls/commit")
							}
							b.ReportMetric(0, "ns/op")
						})
					}
				}
			})
		}
	}
}

// callRound makes total inc calls on id from clients goroutines and
// returns each call's latency.
func callRound(b *testing.B, n *host.Node, id host.ObjectID, clients, total int) []time.Duration {
	var left atomic.Int64
	left.Store(int64(total))
	var (
		mu  sync.Mutex
		out = make([]time.Duration, 0, total)
		wg  sync.WaitGroup
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for left.Add(-1) >= 0 {
				start := time.Now()
				if _, err := n.Call(context.Background(), id, "inc", nil); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			out = append(out, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// pctl is the p-th quantile of l in microseconds.
func pctl(l []time.Duration, p float64) float64 {
	l = slices.Clone(l)
	slices.Sort(l)
	if len(l) == 0 {
		return 0
	}
	return float64(l[min(len(l)-1, int(float64(len(l))*p))].Microseconds())
}

// BenchmarkGroupCommitOnly is the group commit side alone, under --sync
// full: one object, 64 goroutines, 512 inc calls a round, for a profile
// or a comparison of builds without the commit-per-call side's time.
func BenchmarkGroupCommitOnly(b *testing.B) {
	for _, guest := range []string{"counter-rust", "counter"} {
		b.Run("guest="+guest, func(b *testing.B) {
			n, _ := hosttest.Start(b, hosttest.Options{Programs: []string{guest}, Configure: func(c *host.Config) { c.Sync = store.SyncFull }})
			id := host.ObjectID{Program: guest, ID: "group"}
			for range 50 {
				if _, err := n.Call(context.Background(), id, "inc", nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				callRound(b, n, id, 64, 512)
			}
			b.ReportMetric(float64(512*b.N)/time.Since(start).Seconds(), "calls/s")
		})
	}
}
