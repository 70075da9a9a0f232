package cluster

import (
	"context"
	"log/slog"
	"time"
)

// RetryJS retries f while JetStream is not ready yet: a fresh cluster needs
// a moment to elect its meta leader and to learn its peers. It says so in
// the log every few seconds, so a node waiting for peers that never come
// (a wrong route, another --nats-cluster-name) does not look hung. It gives
// up after a minute, or when ctx ends, with f's last error.
func RetryJS(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	lastLog := start
	// Until the cluster has a meta leader its API does not answer at all,
	// so a short first timeout finds it ready sooner; a busy but working
	// cluster gets more time on each attempt.
	timeout := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		timeout = min(2*timeout, 10*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			log.Warn("waiting for the NATS cluster's JetStream", "for", what, "waited", time.Since(start).Round(time.Second), "error", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
