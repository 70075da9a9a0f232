package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

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
					body := map[string]any{"name": c.Args().First()}
					if l := c.String("limits"); l != "" {
						body["limits"] = json.RawMessage(l)
					}
					return tenantCall(c, stdout, http.MethodPost, "/v1/tenants", body)
				},
			},
			{
				Name: "list", Usage: "list tenants and the default limits", Flags: flags(),
				Action: func(c *cli.Context) error { return tenantCall(c, stdout, http.MethodGet, "/v1/tenants", nil) },
			},
			{
				Name: "show", Usage: "a tenant, its limits and its use on this node", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					return tenantCall(c, stdout, http.MethodGet, "/v1/tenants/"+url.PathEscape(c.Args().First()), nil)
				},
			},
			{
				Name: "rotate", Usage: "issue a new token; the old one stops working", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					return tenantCall(c, stdout, http.MethodPost, "/v1/tenants/"+url.PathEscape(c.Args().First())+"/rotate", nil)
				},
			},
			{
				Name: "revoke", Usage: "disable the tenant's token (its programs and objects stay; rotate issues a new one)", ArgsUsage: "NAME", Flags: flags(),
				Action: func(c *cli.Context) error {
					return tenantCall(c, stdout, http.MethodPost, "/v1/tenants/"+url.PathEscape(c.Args().First())+"/revoke", nil)
				},
			},
			{
				Name: "limits", Usage: "set a tenant's limits (JSON over the node's defaults; {} resets)", ArgsUsage: "NAME JSON", Flags: flags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return errors.New(`usage: host tenant limits NAME '{"programs":20}'`)
					}
					return tenantCall(c, stdout, http.MethodPut, "/v1/tenants/"+url.PathEscape(c.Args().First())+"/limits", json.RawMessage(c.Args().Get(1)))
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
			if err := client(c).Get(c.Context, "/v1/whoami", &v); err != nil {
				return err
			}
			return printJSON(stdout, v)
		},
	}
}

func tenantCall(c *cli.Context, stdout io.Writer, method, path string, body any) error {
	if c.NArg() < 1 && method != http.MethodGet {
		return fmt.Errorf("usage: host tenant %s NAME", c.Command.Name)
	}
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return fmt.Errorf("--limits: %w", err)
		}
	}
	out, err := client(c).Do(c.Context, method, path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		return err
	}
	return printJSON(stdout, v)
}
