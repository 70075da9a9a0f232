package delivery

import (
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/durable-host/host/abi"
)

// Item.Shape runs the shaping once per key however many inboxes ask at
// once, and every caller of a key gets the same frame or the same error.
func TestItemShapesOncePerKey(t *testing.T) {
	it := NewItem(abi.Event{Publisher: "p/1", Seq: 1, Payload: []byte(`"x"`)})
	var runs [2]atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	frames := make([][]byte, 64)
	errs := make([]error, 64)
	for i := range frames {
		k := i % 2
		wg.Go(func() {
			frames[i], errs[i] = it.Shape([]string{"v1 a", "v2 a"}[k], func() ([]byte, error) {
				runs[k].Add(1)
				<-release
				if k == 1 {
					return nil, errors.New("shaping failed")
				}
				return []byte("frame"), nil
			})
		})
	}
	close(release)
	wg.Wait()
	if runs[0].Load() != 1 || runs[1].Load() != 1 {
		t.Fatalf("shaped %d and %d times for two keys, want once each", runs[0].Load(), runs[1].Load())
	}
	for i := range frames {
		if i%2 == 0 && (string(frames[i]) != "frame" || errs[i] != nil) {
			t.Fatalf("caller %d: %q %v", i, frames[i], errs[i])
		}
		if i%2 == 1 && (frames[i] != nil || errs[i] == nil) {
			t.Fatalf("caller %d of the failing key: %q %v", i, frames[i], errs[i])
		}
	}
}

// A forward envelope is always valid UTF-8, so a socket writes it as a
// text frame without checking it: a payload that is JSON but holds bytes
// that are not UTF-8 travels as base64.
func TestEnvelopeIsAlwaysUTF8(t *testing.T) {
	for _, p := range [][]byte{
		[]byte("{\"text\":\"caf\xe9\"}"), // valid JSON to encoding/json, not UTF-8
		[]byte("\xff\xfe"),
		[]byte(`{"text":"café"}`),
		[]byte("plain text"),
		nil,
	} {
		env := AppendEnvelope(nil, &abi.Event{Publisher: "p/1", Topic: "t", Seq: 1, Payload: p})
		if !utf8.Valid(env) {
			t.Fatalf("envelope of %q is not UTF-8: %q", p, env)
		}
		if !json.Valid(env) {
			t.Fatalf("envelope of %q is not JSON: %q", p, env)
		}
	}
}
