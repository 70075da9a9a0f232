package host_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

// BenchmarkAlarmDelay measures how late alarms start past their time with
// 10,000 pending on one node: 10,000 chat-rust rooms each set one reminder
// (the room's alarm; the Rust guest, whose instances are small: 512 Go
// guests active hold about 3.5 GB),
// due over 40 s starting 60 s after the first is set (250 a second), most
// of them deactivated meanwhile (512 stay active), so a run includes the
// object's activation. Reported: p50, p99 and max of the delay of each
// alarm's first run, from the node's own record of it.
//
//	go test ./host -run '^$' -bench AlarmDelay -benchtime 1x
func BenchmarkAlarmDelay(b *testing.B) {
	const alarms = 10000
	const spread = 40 * time.Second
	n, c := hosttest.Start(b, hosttest.Options{Programs: []string{"chat-rust"}})
	ctx := context.Background()
	var mu sync.Mutex
	var delays []time.Duration
	host.RecordAlarmDelays(n, func(d time.Duration) {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
	})
	for round := 0; b.Loop(); round++ {
		mu.Lock()
		delays = delays[:0]
		mu.Unlock()
		// Each object's alarm is set for its slot in the window, which
		// starts once setting all of them is surely done.
		setting := time.Now()
		first := setting.Add(60 * time.Second)
		var wg sync.WaitGroup
		ids := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range ids {
					in := time.Until(first.Add(time.Duration(i) * spread / alarms))
					body := fmt.Sprintf(`{"in_ms":%d,"text":"r"}`, in.Milliseconds())
					if _, err := c.Call(ctx, fmt.Sprintf("chat-rust/r%d-%05d", round, i), "remind", []byte(body)); err != nil {
						b.Error(err)
					}
				}
			})
		}
		for i := range alarms {
			ids <- i
		}
		close(ids)
		wg.Wait()
		b.Logf("%d alarms set in %v", alarms, time.Since(setting))
		if time.Now().After(first) {
			b.Fatal("setting the alarms took longer than the 60 s before the first is due")
		}
		if got := metric(b, c, "host_alarms_pending"); got != alarms {
			b.Fatalf("%v alarms pending, want %d", got, alarms)
		}
		deadline := first.Add(spread + time.Minute)
		for {
			mu.Lock()
			got := len(delays)
			mu.Unlock()
			if got == alarms {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d alarms ran: %v ok, %v retried, %v dropped, %v pending", got, alarms,
					metric(b, c, `host_alarms_total{result="ok"}`), metric(b, c, `host_alarms_total{result="retry"}`),
					metric(b, c, `host_alarms_total{result="dropped"}`), metric(b, c, "host_alarms_pending"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(delays)
	q := func(p float64) float64 { return float64(delays[int(p*float64(len(delays)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "delay-p50-ms")
	b.ReportMetric(q(0.99), "delay-p99-ms")
	b.ReportMetric(q(1), "delay-max-ms")
}
