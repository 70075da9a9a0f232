package main

import (
	"encoding/json"
	"io"

	"github.com/urfave/cli/v2"
)

// programsCommand is `host programs [NAME]`: GET /v1/programs[/NAME].
func programsCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "programs",
		Usage:     "list programs (the latest version of each), or every version of one",
		ArgsUsage: "[NAME]",
		Flags:     []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			name := ""
			if c.NArg() == 1 {
				name = c.Args().First()
			}
			var v json.RawMessage
			if err := client(c).Programs(c.Context, name, &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}
