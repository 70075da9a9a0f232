//go:build wasip1

// Command counter is the smallest useful program: an integer per object.
//
// Methods: inc (adds 1), add ({"amount": N}), get. Each replies with the
// value after the call. Every change publishes {"value": N} on topic
// "changes".
package main

import (
	"errors"

	sdk "github.com/durable-host/host/sdk/go"
)

func init() {
	sdk.Method("inc", func([]byte) ([]byte, error) {
		v, err := add(1)
		return sdk.Itoa(v), err
	})
	sdk.JSONMethod("add", func(in struct {
		Amount *int64 `json:"amount"`
	}) (int64, error) {
		if in.Amount == nil {
			return 0, errors.New(`add needs {"amount": N}`)
		}
		return add(*in.Amount)
	})
	sdk.Method("get", func([]byte) ([]byte, error) { return sdk.Itoa(sdk.GetInt("value")), nil })
}

// change is the event each change publishes. A struct, not a map: in
// WebAssembly, encoding/json writes a map several times slower (it sorts
// its keys through reflection), and inc is the hot path.
type change struct {
	Value int64 `json:"value"`
}

func add(n int64) (int64, error) {
	v := sdk.GetInt("value") + n
	sdk.PutInt("value", v)
	return v, sdk.PublishJSON("changes", change{Value: v})
}

func main() {}
