package main

import (
	"io"
	"strings"
	"testing"
)

func TestPermute(t *testing.T) {
	app := newApp(strings.NewReader(""), io.Discard, io.Discard)
	for _, c := range []struct{ in, want string }{
		// Flags after positional arguments move in front of them.
		{"host upload app.wasm --name app", "host upload --name app -- app.wasm"},
		{"host call counter/c1 add {} --server U", "host call --server U -- counter/c1 add {}"},
		{"host call counter/c1 add -", "host call -- counter/c1 add -"},
		{"host subscribe counter/c1 --after -3", "host subscribe --after -3 -- counter/c1"},
		// bench's flags sit on bench, before or after the subcommand.
		{"host bench fanout --fanout all --messages 50", "host bench --fanout all --messages 50 fanout"},
		{"host bench --nodes 4 --watchers 500 fanout --json", "host bench --nodes 4 --watchers 500 --json fanout"},
		{"host bench --nodes 4 followers --messages=5", "host bench --nodes 4 --messages=5 followers"},
		// A subcommand's own flags stay on it.
		{"host tenant create bob --limits {}", "host tenant create --limits {} -- bob"},
		// --help and unknown flags go to the last command named.
		{"host bench fanout --help", "host bench fanout --help"},
		{"host bench fanout --no-such 1", "host bench fanout --no-such -- 1"},
		// No command: left to urfave/cli.
		{"host --help", "host --help"},
		{"host help call", "host help call"},
		{"host call -- a --b", "host call -- a --b"},
	} {
		got := strings.Join(permute(app, strings.Fields(c.in)), " ")
		if got != c.want {
			t.Errorf("permute(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

// TestBenchFlagsEitherSide: both orders of bench's flags parse, and give
// the subcommand the same values (checked through a bad --fanout, which
// fails before any node starts).
func TestBenchFlagsEitherSide(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "fanout", "--fanout", "nope", "--messages", "5"},
		{"bench", "--fanout", "nope", "fanout", "--messages", "5"},
		{"bench", "--messages", "5", "--fanout", "nope", "fanout"},
	} {
		code, out, errOut := runCLI("", args...)
		if code != 1 || !strings.Contains(errOut, `--fanout "nope": want node, socket, subject or all`) {
			t.Errorf("host %s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, errOut)
		}
	}
}
