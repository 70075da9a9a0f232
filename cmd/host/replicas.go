package main

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/urfave/cli/v2"
)

// replicasCommand is `host replicas`: GET /v1/objects/PROGRAM/ID/replicas.
func replicasCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "replicas",
		Usage: "show an object's home and the copies of its file: node, position on its change stream, checksum and lag",
		Description: `Every committed change of an object is shipped, zstd-compressed, to its change
stream in JetStream before the call is answered (with --replica-ack async,
right after: the home's "unshipped" says how many wait); --replicas N nodes
besides the home apply it to their own copy. A copy whose checksum equals the
home's at the same applied count holds the same contents. Lag is how many
change sets a copy is behind the stream's end.`,
		ArgsUsage: "PROGRAM/ID",
		Flags:     []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host replicas PROGRAM/ID")
			}
			var v json.RawMessage
			if err := client(c).Replicas(c.Context, c.Args().First(), &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}
