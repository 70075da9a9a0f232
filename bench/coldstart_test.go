package bench

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestColdStartProcess restarts a node process with chat stored and connects
// 300 sockets at once, each following the room: every one is answered, the
// module is compiled once, and the node's peak RSS stays within 1 GB (each
// connect used to compile the module again: 1,000 took a node to 17 GB).
func TestColdStartProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node process")
	}
	dir := t.TempDir()
	exe := buildHost(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := RunColdStart(ctx, ColdStartConfig{Exe: exe, Connects: 300, Dir: filepath.Join(dir, "run")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *r)
	if r.Failed > 0 {
		t.Fatalf("%d of %d cold connects failed: %v", r.Failed, r.Connects, r.Errors)
	}
	if r.Compiles != 1 {
		t.Fatalf("%v module compiles for 300 cold connects to one room, want 1", r.Compiles)
	}
	if r.PeakRSSMB > 1024 {
		t.Fatalf("peak RSS %.0f MB for 300 cold connects, want at most 1 GB", r.PeakRSSMB)
	}
}
