package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	examples "github.com/durable-host/host/examples/wasm"
)

// examplesCommand is `host examples`: it builds into the checkout's
// examples/wasm/out (make examples), where host dev builds into the user's
// cache.
func examplesCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "examples",
		Usage: "build the example programs into examples/wasm/out (Go; Rust when Debian's rustc with the wasm32 target is installed)",
		Action: func(c *cli.Context) error {
			out := filepath.Join(examples.SourceDir(), "out")
			_, rerr := examples.Rustc()
			built, err := examples.Build(c.Context, out, examples.Options{SkipRust: rerr != nil})
			for _, b := range built {
				if fi, serr := os.Stat(b.Path); serr == nil {
					fmt.Fprintf(stdout, "%-16s %8d bytes  %s\n", b.Name, fi.Size(), b.Path)
				}
			}
			if rerr != nil {
				fmt.Fprintf(stdout, "(Rust examples skipped: %v)\n", rerr)
			}
			return err
		},
	}
}
