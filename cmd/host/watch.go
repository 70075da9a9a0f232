package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	hclient "github.com/durable-host/host/host/client"
)

// watchCommand is `host watch`: a WebSocket connection, one frame a line, until --count frames or Ctrl-C.
func watchCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "watch",
		Usage:     "follow an object's topic over a WebSocket connection and print each event, one JSON line each",
		ArgsUsage: "PROGRAM/ID",
		Description: `Opens a connection (GET /v1/objects/PROGRAM/ID/connect), asks to follow
the object's topic (its follow hook decides) and prints every frame: the
forward envelope {"type":"event","publisher","topic","seq","time","payload"}
unless the connection's program shapes events with an event export.
Delivery to connections is at-most-once: a watcher that falls 256 events
behind is dropped and told so.
Example: host watch chat/room1 --topic messages`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to follow (default: every topic)"},
			&cli.StringFlag{Name: "filter", Usage: "only events whose JSON payload matches `FIELD=VALUE[&...]`"},
			&cli.StringFlag{Name: "params", Usage: "what to present to the publisher's follow hook (a room key ...)"},
			&cli.StringFlag{Name: "via", Usage: "attach the connection to `PROGRAM/ID` whose event export shapes the frames"},
			&cli.IntFlag{Name: "count", Usage: "exit after `N` frames (0: run until interrupted)"},
			serverFlag(), tokenFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host watch PROGRAM/ID [--topic T]")
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			left := c.Int("count")
			return client(c).Watch(ctx, c.Args().First(), hclient.WatchOptions{
				Topic: c.String("topic"), Filter: c.String("filter"), Params: c.String("params"), Via: c.String("via"),
			}, func(frame []byte) bool {
				stdout.Write(frame)
				fmt.Fprintln(stdout)
				left--
				return left != 0
			})
		},
	}
}
