package main

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/urfave/cli/v2"

	hclient "github.com/durable-host/host/host/client"
)

// The inspection commands read objects without calling them: `host
// objects`, `host state` and `host log`. Each prints one page as JSON;
// its "next" is the --after of the next page.

func pageFlags(after string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "after", Usage: after},
		&cli.IntFlag{Name: "limit", Usage: "at most this many per page (default 100, at most 1000)"},
	}
}

func pageOf(c *cli.Context) hclient.Page {
	return hclient.Page{After: c.String("after"), Limit: c.Int("limit")}
}

// objectsCommand is `host objects`: GET /v1/objects?program=.
func objectsCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "objects",
		Usage: "list objects cluster-wide: home node, size, last change, active or not",
		Description: `Lists the objects of PROGRAM, or of every program yours when none is named,
in name order, one page at a time. Each live node lists the objects whose file
it holds as their home; "unreachable" names the nodes that did not answer. An
object is listed once a call has used it. Listing activates nothing.`,
		ArgsUsage: "[PROGRAM]",
		Flags:     append([]cli.Flag{serverFlag(), tokenFlag()}, pageFlags("start after this PROGRAM/ID (the next of the page before)")...),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return errors.New("usage: host objects [PROGRAM]")
			}
			var v json.RawMessage
			if err := client(c).Objects(c.Context, c.Args().First(), pageOf(c), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}

// stateCommand is `host state`: GET /v1/objects/PROGRAM/ID/state.
func stateCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "state",
		Usage: "print an object's keys and values, read-only, and its pending alarm",
		Description: `Reads the object's state on its home through a read-only connection, in one
read transaction beside its handlers: it neither waits for nor holds up a call,
and does not activate the object. A value is shown as "value" when it is JSON,
"text" when it is other text, else "base64"; a key that is not text as
"key_base64".`,
		ArgsUsage: "PROGRAM/ID",
		Flags: append([]cli.Flag{serverFlag(), tokenFlag(),
			&cli.StringFlag{Name: "prefix", Usage: "only the keys that start with this"},
		}, pageFlags("start after this key (the next of the page before, base64)")...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host state PROGRAM/ID [--prefix P]")
			}
			var v json.RawMessage
			if err := client(c).State(c.Context, c.Args().First(), c.String("prefix"), pageOf(c), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}

// logCommand is `host log`: GET /v1/objects/PROGRAM/ID/log.
func logCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "log",
		Usage: "print an object's events: seq, topic, time and payload",
		Description: `Reads the object's log on its home, read-only, ascending from --after (a seq,
exclusive). "head" is the log's last seq. A payload is shown as "value" when it
is JSON, "text" when it is other text, else "base64".`,
		ArgsUsage: "PROGRAM/ID",
		Flags: append([]cli.Flag{serverFlag(), tokenFlag(),
			&cli.StringFlag{Name: "topic", Usage: "only the events of this topic"},
		}, pageFlags("start after this seq (the next of the page before)")...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host log PROGRAM/ID [--after N] [--limit K] [--topic T]")
			}
			var v json.RawMessage
			if err := client(c).Log(c.Context, c.Args().First(), c.String("topic"), pageOf(c), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}
