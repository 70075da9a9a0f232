package main

import (
	"context"
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
// one, under a new id, on the same data directory.
func serve(parent context.Context, cfg host.Config, setup func(context.Context, *host.Node) error, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	for {
		n, err := host.New(ctx, cfg)
		if err != nil {
			return err
		}
		// Setup (host dev's uploads) runs before the node serves, so nobody
		// calls a program that is not there yet.
		if setup != nil {
			if err := setup(ctx, n); err != nil {
				n.Shutdown(context.Background())
				return err
			}
			setup = nil
		}
		if err := n.Start(); err != nil {
			n.Shutdown(context.Background())
			return err
		}
		select {
		case <-n.LeaseLost():
			fmt.Fprintf(stdout, "node %s lost its lease; rejoining under a new id\n", n.ID())
			continue
		case <-ctx.Done():
		}
		fmt.Fprintln(stdout, "shutting down: finishing running calls")
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return n.Shutdown(sctx)
	}
}
