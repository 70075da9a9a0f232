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
Example: host call counter/c1 add '{"amount": 5}'`,
		Flags: []cli.Flag{serverFlag(), tokenFlag()},
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
			out, err := client(c).Call(c.Context, c.Args().Get(0), c.Args().Get(1), payload)
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
