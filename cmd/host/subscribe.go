package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/urfave/cli/v2"

	hclient "github.com/durable-host/host/host/client"
)

// subscribeCommand is `host subscribe`: the SSE stream, one event a line, until --count events or Ctrl-C.
func subscribeCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "subscribe",
		Usage:     "read an object's event stream from storage (catch-up, at-least-once) and print each event, one JSON line each",
		ArgsUsage: "PROGRAM/ID",
		Description: `Opens GET /v1/objects/PROGRAM/ID/stream (server-sent events). Every event
is read from the object's log; the node sends it when the object commits
(an empty NATS hint wakes the reader) or, if a hint was lost, within the
idle threshold (--stream-idle on the node, 10 s by default).

--after N resumes after your checkpoint N (exclusive): events N+1, N+2, ...
in order. Without --after: the latest stored event once, then newer ones.
Delivery is at-least-once: keep the seq of the last event you processed
and pass it as --after when you come back; deduplicate by seq.
Example: host subscribe chat/room1 --topic messages --after 0`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "topic", Usage: "only events of `TOPIC` (default: every topic)"},
			&cli.StringFlag{Name: "filter", Usage: "only events whose JSON payload matches `FIELD=VALUE[&...]`"},
			&cli.StringFlag{Name: "after", Usage: "resume after event `SEQ` (exclusive); omit for the latest event, then newer"},
			&cli.IntFlag{Name: "count", Usage: "exit after `N` events (0: run until interrupted)"},
			serverFlag(), tokenFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host subscribe PROGRAM/ID [--after SEQ] [--topic T]")
			}
			o := hclient.SubscribeOptions{Topic: c.String("topic"), Filter: c.String("filter")}
			if s := c.String("after"); s != "" {
				v, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return fmt.Errorf("--after must be an event seq (a non-negative integer), not %q", s)
				}
				o.After = &v
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			left := c.Int("count")
			return client(c).Subscribe(ctx, c.Args().First(), o, func(data []byte) bool {
				stdout.Write(data)
				fmt.Fprintln(stdout)
				left--
				return left != 0
			})
		},
	}
}
