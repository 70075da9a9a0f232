package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/host"
)

// serveCommand is `host serve`: a node until SIGINT/SIGTERM.
func serveCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run a node",
		Description: `Runs a node: the HTTP API, the objects it holds and an embedded NATS server.
With no flags: data under ./data, HTTP on 127.0.0.1:7070, NATS in process.
Every flag also reads its HOST_... environment variable.
Ctrl-C or SIGTERM shuts down gracefully: running calls finish first.
A node that loses its cluster lease starts again under a new id on the same
data; if that fails (the cluster's JetStream without a leader, say) it tries
again, 500 ms doubling to 32 s apart, until it starts or is stopped.

A cluster on one machine, three terminals (each node its own data and port):
  host serve --data d1 --listen 127.0.0.1:7071 --nats-cluster 127.0.0.1:6221 \
    --nats-routes nats://127.0.0.1:6222,nats://127.0.0.1:6223
  host serve --data d2 --listen 127.0.0.1:7072 --nats-cluster 127.0.0.1:6222 \
    --nats-routes nats://127.0.0.1:6221,nats://127.0.0.1:6223
  host serve --data d3 --listen 127.0.0.1:7073 --nats-cluster 127.0.0.1:6223 \
    --nats-routes nats://127.0.0.1:6221,nats://127.0.0.1:6222
Or point every node at an existing NATS cluster (JetStream on) with --nats-url.
A call or a watch against any node reaches the object's home node.`,
		Flags: nodeFlags(),
		Action: func(c *cli.Context) error {
			cfg, err := nodeConfig(c, stderr)
			if err != nil {
				return err
			}
			return serve(c.Context, cfg, nil, stdout)
		},
	}
}

// serve runs a node until SIGINT/SIGTERM, calling setup once it listens.
// A node that loses its cluster lease is gone for good: serve starts a new
// one, under a new id, on the same data directory. A first start that
// fails ends serve (a bad flag or a busy port is the operator's to fix); a
// rejoin that fails is tried again with backoff, since what failed it is
// most often the cluster itself (JetStream without a leader while a node
// is down), and a node that gave up would stay down until restarted.
func serve(parent context.Context, cfg host.Config, setup func(context.Context, *host.Node) error, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := func() (*host.Node, error) {
		n, err := host.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		// Setup (host dev's uploads) runs before the node serves, so
		// nobody calls a program that is not there yet.
		if setup != nil {
			if err := setup(ctx, n); err != nil {
				n.Shutdown(context.Background())
				return nil, err
			}
			setup = nil
		}
		if err := n.Start(); err != nil {
			n.Shutdown(context.Background())
			return nil, err
		}
		return n, nil
	}
	n, err := start()
	for err == nil {
		select {
		case <-n.LeaseLost():
			fmt.Fprintf(stdout, "node %s lost its lease; rejoining under a new id\n", n.ID())
			n, err = retryStart(ctx, start, sleepCtx, stdout)
			continue
		case <-ctx.Done():
		}
		fmt.Fprintln(stdout, "shutting down: finishing running calls")
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return n.Shutdown(sctx)
	}
	if ctx.Err() != nil && n == nil && errors.Is(err, ctx.Err()) {
		return nil // stopped while rejoining
	}
	return err
}

// Rejoin backoff: the first retry after rejoinFirstWait, doubling up to
// rejoinMaxWait (the product's follower backoff, for the same reason: a
// cluster back within seconds is met soon, one down for long is not
// hammered).
const (
	rejoinFirstWait = 500 * time.Millisecond
	rejoinMaxWait   = 32 * time.Second
)

// retryStart calls start until it succeeds or ctx ends, sleeping between
// attempts (500 ms doubling to 32 s) and saying each failure on out. It
// returns ctx's error once ctx ends.
func retryStart[T any](ctx context.Context, start func() (T, error), sleep func(context.Context, time.Duration) bool, out io.Writer) (T, error) {
	wait := rejoinFirstWait
	for {
		v, err := start()
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			var zero T
			return zero, ctx.Err()
		}
		fmt.Fprintf(out, "rejoin failed: %v; trying again in %v\n", err, wait)
		if !sleep(ctx, wait) {
			var zero T
			return zero, ctx.Err()
		}
		wait = min(2*wait, rejoinMaxWait)
	}
}

// sleepCtx sleeps for d, or until ctx ends (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
