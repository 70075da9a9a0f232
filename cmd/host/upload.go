package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
)

// uploadCommand is `host upload`.
func uploadCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:      "upload",
		Usage:     "upload a program (a .wasm module) under a name; each upload of new bytes is a new version",
		ArgsUsage: "FILE.wasm",
		Description: `The node checks the module before storing it, and refuses it with the
reason (HTTP 400) when it is not a module the SDKs build: it must import
only the host module and WASI, export host_abi_version and call, fit in
--max-module-bytes, and initialize within the budget. Modules whose
structure would take the node gigabytes to load or minutes to compile
are refused too. The node compiles the handler budget into the module:
a call past it is stopped with HTTP 504.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "program `NAME` (default: the file name without .wasm)"},
			serverFlag(), tokenFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return errors.New("usage: host upload FILE.wasm [--name NAME]")
			}
			path := c.Args().First()
			wasm, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			name := c.String("name")
			if name == "" {
				name = strings.TrimSuffix(filepath.Base(path), ".wasm")
			}
			p, err := client(c).Upload(c.Context, name, wasm)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "program  %s\nversion  %d\ndigest   sha256:%s\nsize     %d bytes\nexports  %s\nhandlers %s\n",
				p.Name, p.Version, p.Digest, p.Size, strings.Join(p.Exports, ", "), strings.Join(p.Handlers, ", "))
			return nil
		},
	}
}
