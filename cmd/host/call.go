package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
)

// callCommand is `host call`; a payload of "-" is read from stdin.
func callCommand(stdin io.Reader, stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "call",
		Usage:     "call a method of an object and print its reply",
		ArgsUsage: "PROGRAM/ID METHOD [PAYLOAD|-]",
		Description: `PAYLOAD is sent as the request body; "-" reads it from standard input.
Example: host call counter/c1 add '{"amount": 5}'
With --idempotency-key K the call happens once in effect: the same key,
method and payload again (a retry after a lost reply) prints the first
call's reply without running the method; the same key with another
method or payload is refused (HTTP 422).`,
		Flags: []cli.Flag{serverFlag(), tokenFlag(),
			&cli.StringFlag{Name: "idempotency-key", Usage: "run the call once in effect per `KEY` (sent as the Idempotency-Key header)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 || c.NArg() > 3 {
				return errors.New("usage: host call PROGRAM/ID METHOD [PAYLOAD|-]")
			}
			var payload []byte
			if c.NArg() == 3 {
				payload = []byte(c.Args().Get(2))
				if c.Args().Get(2) == "-" {
					var err error
					if payload, err = io.ReadAll(stdin); err != nil {
						return err
					}
				}
			}
			out, err := client(c).CallWithKey(c.Context, c.Args().Get(0), c.Args().Get(1), payload, c.String("idempotency-key"))
			if err != nil {
				return err
			}
			stdout.Write(out)
			if len(out) == 0 || out[len(out)-1] != '\n' {
				fmt.Fprintln(stdout)
			}
			return nil
		},
	}
}
