package main

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/urfave/cli/v2"
)

// edgesCommand is `host edges`: GET /v1/objects/PROGRAM/ID/edges.
func edgesCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "edges",
		Usage:     "list an object's edges: its approved followers, their nodes, topics and cursors",
		ArgsUsage: "PROGRAM/ID",
		Flags:     []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host edges PROGRAM/ID")
			}
			var v json.RawMessage
			if err := client(c).Edges(c.Context, c.Args().First(), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}

// unfollowCommand is `host unfollow`: DELETE one edge, by the id host edges shows.
func unfollowCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "unfollow",
		Usage:     "remove one of an object's edges by id (see host edges)",
		ArgsUsage: "PROGRAM/ID EDGE",
		Flags:     []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return errors.New("usage: host unfollow PROGRAM/ID EDGE")
			}
			var v json.RawMessage
			if err := client(c).Unfollow(c.Context, c.Args().First(), c.Args().Get(1), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}
