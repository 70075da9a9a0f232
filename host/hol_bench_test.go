package host_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/durable-host/host/host/hosttest"
)

// BenchmarkHOLSocketLatency measures publish → socket latency for a
// publisher's watchers, in two phases of one run on one node: first while
// the publisher's durable follower receives at once, then while its
// receive runs 9 s per event (re-armed so it stays busy). Latency runs from
// before the publish call to each watcher's read of the frame; each
// publish is waited for before the next. Run it as
//
//	go test ./host/ -run '^$' -bench HOLSocketLatency -benchtime 200x
func BenchmarkHOLSocketLatency(b *testing.B) {
	_, c := hosttest.Start(b, hosttest.Options{Programs: []string{"chat", "hostile"}})
	ctx := context.Background()
	call := func(object, method, payload string) {
		if _, err := c.Call(ctx, object, method, []byte(payload)); err != nil {
			b.Fatalf("%s %s: %v", object, method, err)
		}
	}
	const watchers = 10
	var ws []*latencyWatcher
	for range watchers {
		ws = append(ws, watchLatency(b, c.Base, "chat/w", "hostile/pub", "t"))
	}
	call("hostile/slow", "follow", `{"publisher":"hostile/pub","topic":"t"}`)
	var seq uint64
	publish := func(payload string) uint64 {
		call("hostile/pub", "publish", payload)
		seq++
		return seq
	}
	wait := func(what string, cond func() bool) {
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	measure := func(n int, before func()) []time.Duration {
		lat := make([]time.Duration, 0, n*watchers)
		for i := range n {
			before()
			t0 := time.Now()
			s := publish(strconv.Itoa(i))
			wait("the sockets", func() bool {
				for _, w := range ws {
					if !w.has(s) {
						return false
					}
				}
				return true
			})
			for _, w := range ws {
				lat = append(lat, w.arrived(s).Sub(t0))
			}
		}
		return lat
	}
	warm := publish(`"warm"`)
	wait("the warm-up", func() bool { return ws[0].has(warm) && len(received(b, c, "hostile/slow")) == 1 })

	b.ReportAllocs()
	b.ResetTimer()
	quick := measure(b.N, func() {})
	var spunAt time.Time
	slow := measure(b.N, func() {
		if time.Since(spunAt) > 8*time.Second {
			publish(fmt.Sprintf(`"sleep:%d"`, (9 * time.Second).Milliseconds()))
			spunAt = time.Now()
		}
	})
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	p50 := func(l []time.Duration) time.Duration { return percentile(l, 50) }
	b.ReportMetric(ms(p50(quick)), "p50-ms-quick")
	b.ReportMetric(ms(p99(quick)), "p99-ms-quick")
	b.ReportMetric(ms(p50(slow)), "p50-ms-9s-follower")
	b.ReportMetric(ms(p99(slow)), "p99-ms-9s-follower")
}
