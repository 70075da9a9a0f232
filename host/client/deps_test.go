package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDepsLinkNoServerCode: the client, and the benchmark driver that uses
// it, link none of the node's code or its heavy dependencies, so a program
// that only talks to nodes stays small.
func TestDepsLinkNoServerCode(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies with")
	}
	server := []string{"github.com/nats-io/nats-server", "github.com/tetratelabs/wazero", "modernc.org/sqlite"}
	node := []string{"github.com/durable-host/host/host", "github.com/durable-host/host/vm", "github.com/durable-host/host/delivery"}
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{"github.com/durable-host/host/host/client", append(server, node...)},
		{"github.com/durable-host/host/bench", append(server, node...)},
	} {
		out, err := exec.Command(goTool, "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		linked := map[string]string{} // forbidden path → the first package under it
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range c.forbidden {
				// The client itself is under host/; what it must not link
				// is the node package and the packages beside it.
				if dep == f || strings.HasPrefix(dep, f+"/") && !strings.HasPrefix(dep, "github.com/durable-host/host/host/client") {
					if linked[f] == "" {
						linked[f] = dep
						t.Errorf("%s links %s (%s)", c.pkg, f, dep)
					}
				}
			}
		}
	}
}
