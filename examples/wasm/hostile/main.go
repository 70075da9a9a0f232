//go:build wasip1

// Command hostile is a test-only program that misbehaves on purpose, one way
// per method, so the host's defences can be tested against a real guest.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	sdk "github.com/durable-host/host/sdk/go"
)

//go:wasmimport host state_get
func rawStateGet(kp uint32, kn int32) int32

//go:wasmimport host publish
func rawPublish(tp uint32, tn int32, pp uint32, pn int32) int32

var sink [][]byte

func init() {
	sdk.Method("ok", func(p []byte) ([]byte, error) { return []byte("ok"), nil })
	// loop never returns: the budget must stop it.
	sdk.Method("loop", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		for i := 0; ; i++ {
			if i < 0 {
				return nil, nil
			}
		}
	})
	// bomb allocates until the page limit stops it.
	sdk.Method("bomb", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		for {
			sink = append(sink, make([]byte, 8<<20))
		}
	})
	// trap executes unreachable through a nil dereference the SDK cannot
	// recover from: a runtime fatal error.
	sdk.Method("trap", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		var p *[1 << 30]byte
		p = (*[1 << 30]byte)(unsafe.Pointer(uintptr(0xfffffff0)))
		return p[:16], nil
	})
	// panic is recovered by the SDK and becomes an error reply.
	sdk.Method("panic", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		panic("on purpose")
	})
	// oob passes a pointer far outside memory to a host function.
	sdk.Method("oob", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		rawStateGet(0xFFFFFF00, 1024)
		return []byte("unreachable"), nil
	})
	// oob_len passes an in-bounds pointer with a length that overflows.
	sdk.Method("oob_len", func([]byte) ([]byte, error) {
		rawPublish(16, -1, 16, 0x7fffffff)
		return []byte("unreachable"), nil
	})
	// publish_then_fail writes and publishes, then returns an error.
	sdk.Method("publish_then_fail", func([]byte) ([]byte, error) {
		sdk.Put("touched", []byte("yes"))
		if err := sdk.Publish("t", []byte("must not be seen")); err != nil {
			return nil, err
		}
		return nil, errors.New("failed after publishing")
	})
	// big_reply replies with more than the host accepts.
	sdk.Method("big_reply", func([]byte) ([]byte, error) {
		return make([]byte, 8<<20), nil
	})
	// Delivery test hooks.
	sdk.OnFollow(func(r sdk.FollowRequest) error {
		sdk.PutInt("hook_runs", sdk.GetInt("hook_runs")+1)
		if string(r.Params) == "deny" {
			return sdk.Refuse("denied on purpose")
		}
		return nil
	})
	sdk.Method("hook_runs", func([]byte) ([]byte, error) { return sdk.Itoa(sdk.GetInt("hook_runs")), nil })
	// publish publishes the payload on topic "t" (or the topic given as
	// {"topic": ..., "payload": ..., "size": N} JSON when it parses).
	sdk.Method("publish", func(p []byte) ([]byte, error) {
		var in struct {
			Topic   string          `json:"topic"`
			Payload json.RawMessage `json:"payload"`
			Size    int             `json:"size"`
		}
		topic, body := "t", p
		if json.Unmarshal(p, &in) == nil && in.Topic != "" {
			topic, body = in.Topic, in.Payload
			if in.Size > 0 {
				body = []byte(`"` + strings.Repeat("x", in.Size) + `"`)
			}
		}
		return nil, sdk.Publish(topic, body)
	})
	sdk.JSONMethod("follow", func(in struct {
		Publisher string `json:"publisher"`
		Topic     string `json:"topic"`
		Filter    string `json:"filter"`
		Params    string `json:"params"`
	}) (bool, error) {
		return true, sdk.Follow(in.Publisher, in.Topic, sdk.FollowOptions{Filter: in.Filter, Params: []byte(in.Params)})
	})
	// receive fails on "fail", loops on "loop", else records the event.
	sdk.OnReceive(func(e sdk.Event) error {
		switch string(e.Payload) {
		case `"fail"`:
			return errors.New("receive failed on purpose")
		case `"loop"`:
			for i := 0; ; i++ {
				if i < 0 {
					return nil
				}
			}
		}
		n := sdk.GetInt("received") + 1
		sdk.PutInt("received", n)
		sdk.Put(fmt.Sprintf("got/%06d", n), []byte(fmt.Sprintf("%s %s %d %s", e.Publisher, e.Topic, e.Seq, e.Payload)))
		return nil
	})
	sdk.Method("received", func([]byte) ([]byte, error) {
		var out []string
		for _, kv := range sdk.Scan("got/", 100000) {
			out = append(out, string(kv.Value))
		}
		return json.Marshal(out)
	})
	// event shapes connection frames: "EVENT:" + payload, or nothing when
	// the payload mentions skip.
	sdk.OnEvent(func(e sdk.Event) ([]byte, error) {
		if strings.Contains(string(e.Payload), "skip") {
			return nil, sdk.ErrSkip
		}
		return append([]byte("EVENT:"), e.Payload...), nil
	})
	sdk.Method("get", func([]byte) ([]byte, error) {
		v, _ := sdk.Get("touched")
		return v, nil
	})
}

func main() {}
