package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// BenchmarkObjectCall measures, on a 2-node cluster and with each SDK's
// ledger, a client's HTTP call of add on an object (the baseline) against
// an HTTP call of an object whose handler calls add on another object on
// its own node, and on the other node; and the baseline's add with an
// Idempotency-Key (a new key each call: the method runs and is
// recorded). The cases alternate call by call, so each sees the same
// machine. It reports each case's mean and p50 in µs per client call,
// and the object call's own cost: a case's mean less the baseline's
// (what the caller's handler, its commit and the inner call add).
//
//	go test ./host -run '^$' -bench ObjectCall -benchtime 2000x
func BenchmarkObjectCall(b *testing.B) {
	nodes, _ := hosttest.Cluster(b, 2, hosttest.Options{Programs: ledgers})
	c0, c1 := &hclient.Client{Base: nodes[0].URL()}, &hclient.Client{Base: nodes[1].URL()}
	ctx := context.Background()
	for _, prog := range ledgers {
		b.Run("guest="+prog, func(b *testing.B) {
			l := func(id string) string { return prog + "/" + id }
			// Homes: a and near on node 0, far on node 1.
			for _, h := range []struct {
				c  *hclient.Client
				id string
			}{{c0, "a"}, {c0, "near"}, {c1, "far"}} {
				if _, err := h.c.Call(ctx, l(h.id), "total", nil); err != nil {
					b.Fatal(err)
				}
			}
			cases := []struct {
				name string
				call func(i int) error
			}{
				{"http", func(int) error {
					_, err := c0.Call(ctx, l("near"), "add", []byte("x"))
					return err
				}},
				{"same-node", func(int) error {
					_, err := c0.Call(ctx, l("a"), "call", []byte(callPayload(l("near"), "add", "", "", "x")))
					return err
				}},
				{"across-nodes", func(int) error {
					_, err := c0.Call(ctx, l("a"), "call", []byte(callPayload(l("far"), "add", "", "", "x")))
					return err
				}},
				{"http-keyed", func(i int) error {
					_, err := c0.CallWithKey(ctx, l("near"), "add", []byte("x"), fmt.Sprintf("bench-%d-%d", b.N, i))
					return err
				}},
			}
			for i := range 50 { // warm every path
				for _, c := range cases {
					if err := c.call(-1 - i); err != nil {
						b.Fatal(err)
					}
				}
			}
			lat := make([][]time.Duration, len(cases))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				for k, c := range cases {
					start := time.Now()
					if err := c.call(i); err != nil {
						b.Fatal(err)
					}
					lat[k] = append(lat[k], time.Since(start))
				}
			}
			b.StopTimer()
			mean := func(l []time.Duration) float64 {
				var s time.Duration
				for _, d := range l {
					s += d
				}
				return float64(s.Microseconds()) / float64(len(l))
			}
			base := mean(lat[0])
			for k, c := range cases {
				b.ReportMetric(mean(lat[k]), "µs/"+c.name)
				b.ReportMetric(pctl(lat[k], 0.5), "p50µs/"+c.name)
				if k > 0 {
					b.ReportMetric(mean(lat[k])-base, "µs-over-http/"+c.name)
				}
			}
		})
	}
}
