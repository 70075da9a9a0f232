//go:build wasip1

// Command hostile is a test-only program that misbehaves on purpose, one way
// per method, so the host's defences can be tested against a real guest.
package main

import (
	"errors"
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
			sink = append(sink, make([]byte, 1<<20))
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
	sdk.Method("get", func([]byte) ([]byte, error) {
		v, _ := sdk.Get("touched")
		return v, nil
	})
}

func main() {}
