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
