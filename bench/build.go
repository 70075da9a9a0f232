package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// BuildHost builds this checkout's host binary into dir and returns its
// path; tests start their nodes from it. It is built without the race
// detector: the nodes are the system under test, the clients run in the
// test's process.
func BuildHost(ctx context.Context, dir string) (string, error) {
	exe := filepath.Join(dir, "host")
	_, file, _, _ := runtime.Caller(0)
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, "./cmd/host")
	build.Dir = filepath.Dir(filepath.Dir(file))
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return exe, nil
}
