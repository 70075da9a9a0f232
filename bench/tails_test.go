package bench

import (
	"bytes"
	"testing"
)

// The bare writer's frames are as long as asked (the node's frame length,
// so both sides write the same bytes) and parse like the node's.
func TestBareFrame(t *testing.T) {
	for _, size := range []int{0, 10, 60, 170, 4096} {
		f := bareFrame(12, 1700000000000000000, size)
		if size > 60 && len(f) != size {
			t.Errorf("size %d: frame of %d bytes", size, len(f))
		}
		if !bytes.HasPrefix(f, eventPrefix) {
			t.Errorf("size %d: %s does not start like an event", size, f)
		}
		if seq, _ := number(f, seqKey); seq != 12 {
			t.Errorf("size %d: seq %d", size, seq)
		}
		if tm, _ := number(f, timeKey); tm != 1700000000000000000 {
			t.Errorf("size %d: time %d", size, tm)
		}
	}
}
