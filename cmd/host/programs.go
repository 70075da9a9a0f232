package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/api"
	hclient "github.com/durable-host/host/host/client"
)

// programsCommand is `host programs [NAME]`: GET /v1/programs[/NAME], and
// with a name the version each of its active objects runs.
func programsCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "programs",
		Usage: "list programs (the latest version of each), or every version of one and what its active objects run",
		Description: `With no NAME: the newest version of every program.

With NAME: every version of it (a rollback says which version's module it
runs again), then "active": each active object of the program, its home
and the version it runs. An upload or a rollback moves every object onto
the new version at its next call boundary (the call running finishes on
the old one) and the node moves active objects ahead of calls, so after a
moment every active object shows the newest version.`,
		ArgsUsage:   "[NAME]",
		Flags:       []cli.Flag{serverFlag(), tokenFlag()},
		Subcommands: []*cli.Command{rollbackCommand(stdout)},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fmt.Errorf("host programs takes at most one program name, not %d arguments", c.NArg())
			}
			if c.NArg() == 0 {
				var v json.RawMessage
				if err := client(c).Programs(c.Context, "", &v); err != nil {
					return err
				}
				return printJSON(stdout, v)
			}
			name := c.Args().First()
			cl := client(c)
			var v struct {
				Name     string            `json:"name"`
				Versions []json.RawMessage `json:"versions"`
			}
			if err := cl.Programs(c.Context, name, &v); err != nil {
				return err
			}
			type running struct {
				Object  string `json:"object"`
				Home    string `json:"home"`
				Version int    `json:"version"`
			}
			out := struct {
				Name     string            `json:"name"`
				Versions []json.RawMessage `json:"versions"`
				Active   []running         `json:"active"`
			}{Name: v.Name, Versions: v.Versions, Active: []running{}}
			page := hclient.Page{Limit: host.MaxPage}
			for {
				var p api.ObjectPage
				if err := cl.Objects(c.Context, name, page, &p); err != nil {
					return err
				}
				for _, o := range p.Objects {
					if o.Active && o.Version > 0 {
						out.Active = append(out.Active, running{o.Object, o.Home, o.Version})
					}
				}
				if p.Next == "" {
					break
				}
				page.After = p.Next
			}
			return printJSON(stdout, out)
		},
	}
}

// rollbackCommand is `host programs rollback NAME [--to V]`: POST
// /v1/programs/NAME/rollback.
func rollbackCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "rollback",
		Usage: "make an earlier version of a program current again",
		Description: `Makes the module of version --to (default: the version before the
newest) current again, as a new version whose "rollback_of" names the one
it reuses: the history only grows. Every object of the program moves onto
it at its next call boundary, on every node, as after an upload; sockets
stay open and events shaped from then on use its event export.`,
		ArgsUsage: "NAME",
		Flags: []cli.Flag{serverFlag(), tokenFlag(),
			&cli.IntFlag{Name: "to", Usage: "the `VERSION` to run again (default: the one before the newest)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("host programs rollback takes one program name, e.g. host programs rollback chat --to 1")
			}
			to := c.Int("to")
			if c.IsSet("to") && to < 1 {
				return fmt.Errorf("--to must be a version (1 or more), not %s", strconv.Itoa(to))
			}
			pr, err := client(c).Rollback(c.Context, c.Args().First(), to)
			if err != nil {
				return err
			}
			return printJSON(stdout, pr)
		},
	}
}
