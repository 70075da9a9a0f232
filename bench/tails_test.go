package bench

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestTailsTiny runs `host bench tails` end to end at a tiny size: a node
// process and the bare writer process, two blocks each, every socket gets
// every message in order on both sides, and the bare writer's frames are
// as long as the node's (the comparison is of the same bytes).
func TestTailsTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node process and the bare writer")
	}
	dir := t.TempDir()
	exe := buildHost(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := RunTails(ctx, TailsConfig{Exe: exe, Sockets: 20, Messages: 4, Blocks: 1, Dir: filepath.Join(dir, "run")})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []TailsSide{r.Node, r.Bare} {
		if s.Delivered != 80 || s.Expected != 80 || s.Missed != 0 || s.OutOfOrder != 0 {
			t.Errorf("%s: delivered %d of %d, %d messages missed, %d out of order", s.Name, s.Delivered, s.Expected, s.Missed, s.OutOfOrder)
		}
		if s.P50Ms <= 0 || s.AllP50Ms <= 0 || s.FirstP50Ms <= 0 || s.FirstP50Ms > s.AllP50Ms+1 {
			t.Errorf("%s: p50 %v ms, first %v ms, all %v ms", s.Name, s.P50Ms, s.FirstP50Ms, s.AllP50Ms)
		}
	}
	if r.Node.FrameBytes < 100 || r.Bare.FrameBytes != r.Node.FrameBytes {
		t.Errorf("frames: node %d bytes, bare %d", r.Node.FrameBytes, r.Bare.FrameBytes)
	}
	if len(r.Each) != 2 || r.Each[0].Side != "node" || r.Each[1].Side != "bare" {
		t.Errorf("blocks %+v, want node then bare", r.Each)
	}
}
