package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A rejoin that fails is tried again, 500 ms doubling to 32 s apart, until
// it succeeds: a node whose rejoin met a cluster without JetStream (a
// chaos soak's pause of another node) ended its process instead.
func TestRejoinIsTriedAgainWithBackoff(t *testing.T) {
	var waits []time.Duration
	sleep := func(_ context.Context, d time.Duration) bool { waits = append(waits, d); return true }
	calls := 0
	start := func() (int, error) {
		calls++
		if calls <= 9 {
			return 0, errors.New("change stream consumer: context deadline exceeded")
		}
		return 42, nil
	}
	var out bytes.Buffer
	v, err := retryStart(context.Background(), start, sleep, &out)
	if err != nil || v != 42 {
		t.Fatalf("retryStart = %v, %v; want 42 after the failures", v, err)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 32 * time.Second, 32 * time.Second}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if n := strings.Count(out.String(), "rejoin failed: change stream consumer"); n != 9 {
		t.Fatalf("%d failures said, want 9:\n%s", n, out.String())
	}
}

// A stop (SIGTERM) while a rejoin waits ends the retries at once.
func TestRejoinStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	start := func() (int, error) { calls++; return 0, errors.New("no JetStream") }
	sleep := func(ctx context.Context, d time.Duration) bool { cancel(); return sleepCtx(ctx, d) }
	_, err := retryStart(ctx, start, sleep, &bytes.Buffer{})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("retryStart after a stop: %v after %d calls, want context.Canceled after 1", err, calls)
	}
}
