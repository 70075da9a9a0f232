package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/bench"
)

// tailsCommand is `host bench tails`: publish → socket on one node against
// a bare WebSocket writer, alternated in one run. Its flags are its own.
func tailsCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "tails",
		Usage: "publish → socket latency and CPU on one node against a bare WebSocket writer, same socket count, alternated",
		Description: `Starts one "host serve" process with the chat example and one bare
WebSocket writer process ("host bench bare": it accepts sockets and writes
one pre-encoded frame of the node's length to all of them, one goroutine
per CPU, nothing else). Then, in alternating blocks (node, bare, bare,
node, ...: --blocks per side), dials --sockets WebSocket clients in this
process to one of them, follows chat/room1's messages, warms up, publishes
--messages messages one at a time (closed loop), and closes the sockets.

Prints, per side: publish → socket latency over every delivery (p50, p99,
p999; from the server's clock as it takes the event), publish → the last
socket (p50, p99), server CPU per message, deliveries per second; and the
node's figures over the bare writer's.

Needs ulimit -n of at least --sockets + 1024.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "sockets", Value: 5000, Usage: "WebSocket clients on the server of each block"},
			&cli.IntFlag{Name: "messages", Value: 50, Usage: "measured messages per block (after 10 warm-up ones)"},
			&cli.IntFlag{Name: "blocks", Value: 2, Usage: "blocks per side"},
			&cli.DurationFlag{Name: "timeout", Value: 60 * time.Second, Usage: "longest wait for one message to reach every socket"},
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "the node's --log-level (node-0.log in the run directory)"},
			&cli.StringFlag{Name: "dir", Usage: "keep the node's data and logs under `DIR` (default: a temporary directory, removed)"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress line on stderr"},
		},
		Action: func(c *cli.Context) error {
			run, err := benchBase(c, stderr)
			if err != nil {
				return err
			}
			defer run.done()
			r, err := bench.RunTails(run.ctx, bench.TailsConfig{
				Exe: run.exe, Sockets: c.Int("sockets"), Messages: c.Int("messages"), Blocks: c.Int("blocks"),
				Timeout: c.Duration("timeout"), LogLevel: c.String("log-level"), Dir: c.String("dir"),
				Progress: run.progress,
			})
			run.done()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(stdout, r)
			}
			r.WriteTable(stdout)
			return nil
		},
	}
}

// bareCommand is `host bench bare`, the baseline process `host bench tails`
// starts. Hidden: it is a measuring tool, not part of the product.
func bareCommand() *cli.Command {
	return &cli.Command{
		Name:   "bare",
		Hidden: true,
		Usage:  "serve the bare WebSocket writer (the baseline of host bench tails)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "address to serve on"},
		},
		Action: func(c *cli.Context) error {
			l, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "bare writer on %s\n", l.Addr())
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return bench.ServeBare(ctx, l)
		},
	}
}
