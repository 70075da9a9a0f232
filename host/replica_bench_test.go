package host_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/host"
)

// benchCluster starts k clustered nodes in process with copies as given.
func benchCluster(b *testing.B, k, replicas int) []*host.Node {
	b.Helper()
	routes := make([]string, k)
	for i := range routes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		routes[i] = ln.Addr().String()
		ln.Close()
	}
	name := fmt.Sprintf("rbench%d-%d", os.Getpid(), replicas)
	nodes := make([]*host.Node, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range nodes {
		var peers []string
		for j, r := range routes {
			if j != i {
				peers = append(peers, "nats://"+r)
			}
		}
		cfg := nodeConfig(b.TempDir(), func(c *host.Config) {
			c.NATS.Cluster, c.NATS.ClusterName, c.NATS.Routes = routes[i], name, peers
			c.Replicas = replicas
		})
		wg.Go(func() { nodes[i], errs[i] = host.New(context.Background(), cfg) })
	}
	wg.Wait()
	for i, n := range nodes {
		if n != nil {
			b.Cleanup(func() { n.Shutdown(context.Background()) })
		}
		if errs[i] != nil {
			b.Fatal(errs[i])
		}
		if err := n.Start(); err != nil {
			b.Fatal(err)
		}
	}
	return nodes
}

// BenchmarkReplicatedCall measures a committed call (counter inc) on its
// home in a 3-node cluster without copies and with 2 synchronous copies,
// alternating one call of each per iteration so both see the same
// machine. It reports each one's p50 and p99, the p50 added by the output
// gate, and the bytes shipped per call against the raw change set.
func BenchmarkReplicatedCall(b *testing.B) {
	ctx := context.Background()
	type side struct {
		name  string
		nodes []*host.Node
		lat   []time.Duration
	}
	sides := []*side{{name: "replicas=0"}, {name: "replicas=2"}}
	for i, s := range sides {
		s.nodes = benchCluster(b, 3, 2*i)
		upload(b, s.nodes[0], "counter", "counter")
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
	if calls := after.Shipped - before.Shipped; calls > 0 {
		b.ReportMetric(float64(after.RawBytes-before.RawBytes)/float64(calls), "raw-B/call")
		b.ReportMetric(float64(after.ShippedBytes-before.ShippedBytes)/float64(calls), "shipped-B/call")
	}
	b.ReportMetric(0, "ns/op")
}
