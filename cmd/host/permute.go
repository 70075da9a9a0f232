package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// permute puts every flag right after the command that defines it, so
// flags may come before or after positional arguments ("host upload app.wasm
// --name app") and before or after a subcommand's name ("host bench --nodes
// 4 fanout", "host bench fanout --nodes 4"): urfave/cli stops parsing flags
// at the first argument, and a command parses only its own flags (its
// subcommands read them through their parent). A flag that no command on
// the path defines goes to the last one, which reports it.
func permute(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	var (
		path []*cli.Command // the command and subcommands named in args
		seen [][]string     // each flag, with its value if it takes one
		pos  []string
		cmds = app.Commands
		rest = args[1:]
	)
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if len(a) > 1 && a[0] == '-' {
			name, _, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
			words := []string{a}
			if !inline && takesValue(path, cmds, name) && i+1 < len(rest) {
				words = append(words, rest[i+1])
				i++
			}
			seen = append(seen, words)
			continue
		}
		if c := findCommand(cmds, a); c != nil && len(pos) == 0 {
			path = append(path, c)
			cmds = c.Subcommands
			continue
		}
		pos = append(pos, a)
	}
	if len(path) == 0 {
		return args // no command: --help, or urfave/cli's own answer to a typo
	}
	// flags[0] go after the app's name, flags[i] after path[i-1].
	flags := make([][]string, len(path)+1)
	for _, words := range seen {
		name, _, _ := strings.Cut(strings.TrimLeft(words[0], "-"), "=")
		at := len(path)
		for i := len(path) - 1; i >= 0; i-- {
			if flagNamed(path[i], name) != nil {
				at = i + 1
				break
			}
		}
		flags[at] = append(flags[at], words...)
	}
	out := append([]string{args[0]}, flags[0]...)
	for i, c := range path {
		out = append(out, c.Name)
		out = append(out, flags[i+1]...)
	}
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func flagNamed(c *cli.Command, name string) cli.Flag {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// takesValue reports whether flag name takes a value: as the nearest
// command of path defines it, else as a subcommand that may still be named
// (below) does.
func takesValue(path, below []*cli.Command, name string) bool {
	for i := len(path) - 1; i >= 0; i-- {
		if f := flagNamed(path[i], name); f != nil {
			_, isBool := f.(*cli.BoolFlag)
			return !isBool
		}
	}
	for _, c := range below {
		if f := flagNamed(c, name); f != nil {
			_, isBool := f.(*cli.BoolFlag)
			return !isBool
		}
		if takesValue(nil, c.Subcommands, name) {
			return true
		}
	}
	return false
}
