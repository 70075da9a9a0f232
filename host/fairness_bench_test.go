package host_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

// BenchmarkTenantFairness measures a well-behaved tenant's calls (HTTP,
// counter inc, committed) while another tenant runs the hostile suite on
// the same node: loops to the budget, memory bombs, traps, oversized
// replies and publish-then-fail, from 8 clients at once. Cases:
//
//   - idle: nobody else on the node (the baseline, same run);
//   - hostile: the hostile tenant with the default concurrency limit (half
//     the cores, at least 1);
//   - hostile-unlimited: the same tenant allowed 64 handlers at once, to
//     show what the limit buys.
//
// It reports p50 and p99 of the calm tenant's calls in µs.
//
//	go test -run '^$' -bench TenantFairness -benchtime 2000x ./host
func BenchmarkTenantFairness(b *testing.B) {
	n, _ := hosttest.Start(b, hosttest.Options{Configure: func(c *host.Config) {
		c.Auth = true
		c.VM.Budget = time.Second // many overruns per second
		c.VM.MemoryLimitPages = 512
	}})
	dir := n.DataDir()
	tokb, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		b.Fatal(err)
	}
	op := strings.TrimSpace(string(tokb))
	calm := mkTenant(b, n, op, "calm", "")
	evil := mkTenant(b, n, op, "evil", "")
	unlimited := mkTenant(b, n, op, "evil2", `{"concurrency":64}`)
	wantStatus(b, tenantUpload(b, n, calm, "counter", "counter"), http.StatusCreated, "calm uploads")
	for _, tok := range []string{evil, unlimited} {
		wantStatus(b, tenantUpload(b, n, tok, "hostile", "hostile"), http.StatusCreated, "evil uploads")
	}
	wantStatus(b, as(b, n, calm, http.MethodPost, "/v1/objects/counter/c/inc", nil), http.StatusOK, "warm")

	for _, c := range []struct{ name, evil string }{{"idle", ""}, {"hostile", evil}, {"hostile-unlimited", unlimited}} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			if c.evil != "" {
				methods := []string{"loop", "bomb", "trap", "big_reply", "publish_then_fail", "loop", "bomb", "loop"}
				for i, m := range methods {
					wg.Add(1)
					go func() {
						defer wg.Done()
						hc := &http.Client{}
						for ctx.Err() == nil {
							req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/objects/hostile/e%d/%s", n.URL(), i, m), nil)
							req.Header.Set("Authorization", "Bearer "+c.evil)
							if resp, err := hc.Do(req); err == nil {
								resp.Body.Close()
							}
						}
					}()
				}
				time.Sleep(500 * time.Millisecond) // the storm is on
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				r := as(b, n, calm, http.MethodPost, "/v1/objects/counter/c/inc", nil)
				lat = append(lat, time.Since(start))
				if r.status != http.StatusOK {
					b.Fatalf("calm call: HTTP %d %s", r.status, r.body)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
		})
	}
}
