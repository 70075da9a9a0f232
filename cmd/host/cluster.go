package main

import (
	"encoding/json"
	"io"

	"github.com/urfave/cli/v2"
)

// clusterCommand is `host cluster`: GET /v1/cluster.
func clusterCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "cluster",
		Usage: "list the live nodes of the cluster: ids, addresses, objects and connections held",
		Flags: []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			var v json.RawMessage
			if err := client(c).Cluster(c.Context, &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}
