package host_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

// BenchmarkReplicatedCall measures a committed call (counter inc) on its
// home in a 3-node cluster without copies, with 2 synchronous copies and
// with 2 copies acknowledged asynchronously, alternating one call of each
// per iteration so all see the same machine. It reports each one's p50
// and p99, the p50 added by the sync output gate and by async shipping,
// and the bytes shipped per call against the raw change set.
func BenchmarkReplicatedCall(b *testing.B) {
	ctx := context.Background()
	type side struct {
		name  string
		nodes []*host.Node
		lat   []time.Duration
	}
	sides := []*side{{name: "replicas=0"}, {name: "replicas=2"}, {name: "replicas=2-async"}}
	for i, s := range sides {
		// The product's lease timing, not the cluster tests' shorter one.
		s.nodes, _ = hosttest.Cluster(b, 3, hosttest.Options{Programs: []string{"counter"}, Configure: func(c *host.Config) {
			c.LeaseTTL, c.Heartbeat = host.DefaultLeaseTTL, host.DefaultHeartbeat
			c.Replicas = 2 * min(i, 1)
			if i == 2 {
				c.ReplicaAck = host.ReplicaAsync
			}
		}})
	}
	id := host.ObjectID{Program: "counter", ID: "bench"}
	for _, s := range sides {
		for range 50 { // the home is node 0; warm it and its copies
			if _, err := s.nodes[0].Call(ctx, id, "inc", nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	before := sides[1].nodes[0].ReplicaStats()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, s := range sides {
			start := time.Now()
			if _, err := s.nodes[0].Call(ctx, id, "inc", nil); err != nil {
				b.Fatal(err)
			}
			s.lat = append(s.lat, time.Since(start))
		}
	}
	b.StopTimer()
	after := sides[1].nodes[0].ReplicaStats()
	pct := func(l []time.Duration, p float64) float64 {
		l = slices.Clone(l)
		slices.Sort(l)
		return float64(l[min(len(l)-1, int(float64(len(l))*p))].Microseconds())
	}
	for _, s := range sides {
		b.ReportMetric(pct(s.lat, 0.50), s.name+"-p50-µs")
		b.ReportMetric(pct(s.lat, 0.99), s.name+"-p99-µs")
	}
	b.ReportMetric(pct(sides[1].lat, 0.5)-pct(sides[0].lat, 0.5), "gate-p50-µs")
	b.ReportMetric(pct(sides[2].lat, 0.5)-pct(sides[0].lat, 0.5), "async-p50-µs")
	if calls := after.Shipped - before.Shipped; calls > 0 {
		b.ReportMetric(float64(after.RawBytes-before.RawBytes)/float64(calls), "raw-B/call")
		b.ReportMetric(float64(after.ShippedBytes-before.ShippedBytes)/float64(calls), "shipped-B/call")
	}
	b.ReportMetric(0, "ns/op")
}
