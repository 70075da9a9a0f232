package host_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// BenchmarkHotUpdate measures the time from an upload's start to every one
// of 1,000 active objects running the new version, with nobody calling
// them (the node's background pass moves them), on one node. Each
// iteration uploads the other of two versions of the hostile example.
// Reported: the upload's own time and the time until the last object
// moved (p50, max).
//
//	go test ./host -run '^$' -bench HotUpdate -benchtime 10x
func BenchmarkHotUpdate(b *testing.B) {
	const objects = 1000
	n, c := hosttest.Start(b, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) {
		c.MaxActiveObjects = 2 * objects
	}})
	ctx := context.Background()
	var wg sync.WaitGroup
	ids := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range ids {
				if _, err := c.Call(ctx, fmt.Sprintf("hostile/o%04d", i), "ok", nil); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range objects {
		ids <- i
	}
	close(ids)
	wg.Wait()
	if got := host.RunningVersions(n, "hostile")[1]; got != objects {
		b.Fatalf("%d objects active on version 1, want %d", got, objects)
	}
	mods := [][]byte{hostileV2(b), vmtest.Wasm(b, "hostile")}
	var uploads, moved []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		pr, err := (&hclient.Client{Base: c.Base}).Upload(ctx, "hostile", mods[i%2])
		if err != nil {
			b.Fatal(err)
		}
		uploads = append(uploads, time.Since(start))
		for host.RunningVersions(n, "hostile")[pr.Version] != objects {
			if time.Since(start) > time.Minute {
				b.Fatalf("after a minute %v", host.RunningVersions(n, "hostile"))
			}
			time.Sleep(time.Millisecond)
		}
		moved = append(moved, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(uploads)
	slices.Sort(moved)
	b.ReportMetric(float64(uploads[len(uploads)/2].Milliseconds()), "upload-p50-ms")
	b.ReportMetric(float64(moved[len(moved)/2].Milliseconds()), "all-moved-p50-ms")
	b.ReportMetric(float64(moved[len(moved)-1].Milliseconds()), "all-moved-max-ms")
}
