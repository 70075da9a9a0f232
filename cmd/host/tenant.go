package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
)

// tenantCommand is `host tenant ...`: the operator's tenant management.
func tenantCommand(stdout io.Writer) *cli.Command {
	flags := func(extra ...cli.Flag) []cli.Flag { return append([]cli.Flag{serverFlag(), tokenFlag()}, extra...) }
	limitsFlag := &cli.StringFlag{Name: "limits", Usage: "this tenant's limits as `JSON` over the node's defaults, e.g. '{\"programs\":20}'"}
	return &cli.Command{
		Name:  "tenant",
		Usage: "manage tenants on a node started with --auth (needs the operator token)",
		Description: `With --auth a node hosts many tenants who do not trust each other. The
first start writes the operator token to DATA/admin.token (mode 0600);
pass it with --token or HOST_TOKEN:

  export HOST_TOKEN="$(cat data/admin.token)"
  host tenant create acme          # prints acme's token, once
  HOST_TOKEN=ht_acme_... host upload counter.wasm
  HOST_TOKEN=ht_acme_... host call counter/c1 inc

A tenant's programs and objects are its own: other tenants get 404 for
them. Another tenant's object can only be followed (TENANT.PROGRAM/ID),
and only if its program's follow hook admits the follower's tenant.

Limits (JSON field: default; see GET /v1/tenants for the node's):
  module_bytes 16 MiB, programs 100, memory_pages 1024 (64 MiB),
  object_bytes 256 MiB, tenant_bytes 4 GiB per node, objects 100000 per
  node, connections 10000 per node, publish_rate 1000/s with
  publish_burst 2000 per node, concurrency (handlers at once) half the
  node's cores, at least 1.
Going over answers 413 (sizes) or 429 (counts, rates) naming the limit;
nothing already stored is lost.`,
		Subcommands: []*cli.Command{
			{
				Name: "create", Usage: "create a tenant and print its token (shown once)", ArgsUsage: "NAME",
				Flags: flags(limitsFlag),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: host tenant create NAME [--limits JSON]")
					}
					var limits json.RawMessage
					if l := c.String("limits"); l != "" {
						var err error
						if limits, err = limitsJSON(l); err != nil {
							return err
						}
					}
					return printReply(stdout, func(v any) error { return client(c).CreateTenant(c.Context, c.Args().First(), limits, v) })
				},
			},
			{
				Name: "list", Usage: "list tenants and the default limits", Flags: flags(),
				Action: func(c *cli.Context) error {
					return printReply(stdout, func(v any) error { return client(c).Tenants(c.Context, v) })
				},
			},
			{
				Name: "show", Usage: "a tenant, its limits and its use on this node", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					return printReply(stdout, func(v any) error { return client(c).Tenant(c.Context, c.Args().First(), v) })
				},
			},
			{
				Name: "rotate", Usage: "issue a new token; the old one stops working", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 {
						return errors.New("usage: host tenant rotate NAME")
					}
					return printReply(stdout, func(v any) error { return client(c).RotateTenant(c.Context, c.Args().First(), v) })
				},
			},
			{
				Name: "revoke", Usage: "disable the tenant's token (its programs and objects stay; rotate issues a new one)", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 {
						return errors.New("usage: host tenant revoke NAME")
					}
					return printReply(stdout, func(v any) error { return client(c).RevokeTenant(c.Context, c.Args().First(), v) })
				},
			},
			{
				Name: "limits", Usage: "set a tenant's limits (JSON over the node's defaults; {} resets)", ArgsUsage: "NAME JSON", Flags: flags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return errors.New(`usage: host tenant limits NAME '{"programs":20}'`)
					}
					limits, err := limitsJSON(c.Args().Get(1))
					if err != nil {
						return err
					}
					return printReply(stdout, func(v any) error { return client(c).SetTenantLimits(c.Context, c.Args().First(), limits, v) })
				},
			},
		},
	}
}

// whoamiCommand is `host whoami`.
func whoamiCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name: "whoami", Usage: "which tenant the token is, with its limits and use on the node",
		Flags: []cli.Flag{serverFlag(), tokenFlag()},
		Action: func(c *cli.Context) error {
			var v any
			if err := client(c).Whoami(c.Context, &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}

// limitsJSON checks a --limits or limits argument before anything is sent.
func limitsJSON(s string) (json.RawMessage, error) {
	b, err := json.Marshal(json.RawMessage(s))
	if err != nil {
		return nil, fmt.Errorf("--limits: %w", err)
	}
	return b, nil
}

// printReply prints the reply call decodes, re-encoded through any (keys
// sorted), as the tenant commands always have.
func printReply(stdout io.Writer, call func(v any) error) error {
	var v any
	if err := call(&v); err != nil {
		return err
	}
	return printJSON(stdout, v)
}
