package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	examples "github.com/durable-host/host/examples/wasm"
	"github.com/durable-host/host/host"
)

// devCommand is `host dev`: `host serve` with the examples built and uploaded first.
func devCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "dev",
		Usage: "run a node with the example programs built and uploaded: the one-command start",
		Description: `Builds every example in --examples (Go; Rust too when Debian's rustc with
the wasm32 target is installed) into the user's cache directory
($XDG_CACHE_HOME/host/examples, by default ~/.cache/host/examples), starts a
node like "host serve" and uploads them, then prints what to try.
The sources are only read: by default those this binary was built from (a
checkout, or the module cache for "go install"). Needs the go command.`,
		Flags: append(nodeFlags(),
			&cli.StringFlag{Name: "examples", Value: examples.SourceDir(), Usage: "`DIR` of the example sources: a subdirectory per program, with main.go (Go) or lib.rs (Rust)"},
		),
		Action: func(c *cli.Context) error {
			cfg, err := nodeConfig(c, stderr)
			if err != nil {
				return err
			}
			cfg.Demo = true
			src := c.String("examples")
			return serve(c.Context, cfg, func(ctx context.Context, n *host.Node) error {
				return devSetup(ctx, n, src, stdout)
			}, stdout)
		},
	}
}

// devOutDir is where host dev builds the examples: the user's cache, so an
// installed binary never writes into its sources (the module cache is
// read-only, and a checkout's examples/wasm/out belongs to make examples).
func devOutDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory to build the examples in (set XDG_CACHE_HOME or HOME): %w", err)
	}
	return filepath.Join(dir, "host", "examples"), nil
}

func devSetup(ctx context.Context, n *host.Node, src string, stdout io.Writer) error {
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return fmt.Errorf("no example sources at %s (this binary was built elsewhere, or with -trimpath): pass --examples DIR, the examples/wasm directory of a checkout", src)
	}
	out, err := devOutDir()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "building examples from %s into %s ...\n", src, out)
	built, err := examples.Build(ctx, out, examples.Options{Source: src, SkipRust: true})
	if err != nil {
		return fmt.Errorf("build examples: %w", err)
	}
	// Rust examples are a bonus here: without the toolchain, or if one
	// fails to build, the Go ones still make a working demo.
	var rust []string
	entries, _ := os.ReadDir(src)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "-rust") {
			rust = append(rust, e.Name())
		}
	}
	if _, rerr := examples.Rustc(); rerr != nil {
		fmt.Fprintf(stdout, "  (Rust examples skipped: %v)\n", rerr)
	} else if len(rust) > 0 {
		rb, rerr := examples.Build(ctx, out, examples.Options{Source: src, Only: rust})
		if rerr != nil {
			fmt.Fprintf(stdout, "  (Rust examples skipped: %v)\n", firstLine(rerr.Error()))
		} else {
			built = append(built, rb...)
		}
	}
	for _, b := range built {
		wasm, err := os.ReadFile(b.Path)
		if err != nil {
			return err
		}
		p, _, err := n.Upload(ctx, b.Name, wasm)
		if err != nil {
			return fmt.Errorf("upload %s: %w", b.Name, err)
		}
		fmt.Fprintf(stdout, "  uploaded %-14s version %d  %d KB\n", p.Name, p.Version, p.Size/1024)
	}
	fmt.Fprintf(stdout, `
node %s is up at %s

open %s/?room=room1 in two browser tabs to chat, or try:
  host call counter/c1 inc
  host call counter/c1 add '{"amount": 5}'
  host call chat/room1 post '{"author": "ann", "text": "hi"}'
  host call chat/room1 history
  curl -X POST %s/v1/objects/counter/c1/get

Ctrl-C stops the node; state survives under its data directory.
`, n.ID(), n.URL(), n.URL(), n.URL())
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
