package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkIdleConnections measures what a warm, idle WebSocket connection
// (following a room, one event received) costs the node process holding
// it, at 4,000 and 8,000 connections: resident set, Go heap and goroutine
// stacks per connection, and goroutines per connection. It runs once
// whatever b.N is: `go test ./bench -run '^$' -bench IdleConnections`.
func BenchmarkIdleConnections(b *testing.B) {
	dir := b.TempDir()
	exe, err := BuildHost(context.Background(), dir)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	steps, err := RunConns(ctx, ConnsConfig{Exe: exe, Counts: []int{4000, 8000}, Dir: filepath.Join(dir, "run")})
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
	}
	for _, s := range steps {
		b.Logf("%+v", s)
		b.ReportMetric(s.RSSKBPerConn, fmt.Sprintf("rss-KB/conn@%d", s.Conns))
		b.ReportMetric(s.HeapKBPerConn, fmt.Sprintf("heap-KB/conn@%d", s.Conns))
		b.ReportMetric(s.StackKBPerConn, fmt.Sprintf("stack-KB/conn@%d", s.Conns))
		b.ReportMetric(s.GoroutinesPerConn, fmt.Sprintf("goroutines/conn@%d", s.Conns))
	}
	b.ReportMetric(0, "ns/op")
}
