//go:build wasip1

// Command ledger shows objects calling objects. A ledger object keeps
// entries; other ledger objects (or any program's) add to it with
// sdk.Call, and a ledger that follows another's "jobs" topic adds the
// entry each event names, once in effect however often the event comes.
//
// Payloads are text, fields one per line, so the Rust twin reads them the
// same way:
//   - add ENTRY: records ENTRY and counts it; replies with the count. An
//     entry starting with "fail" is refused (the method's own error).
//   - total, entries: the count; the entries, one per line, in order.
//   - call TARGET\nMETHOD\nKEY\nFLAGS\nPAYLOAD: counts a call of its own,
//     calls METHOD on TARGET (with KEY if not empty) and replies
//     "ok REPLY" or "error STATUS MESSAGE"; FLAGS "fail" fails this
//     handler after the call, which rolls back this object's count and
//     leaves the callee's effect; FLAGS a number spins that many
//     milliseconds before the call.
//   - spin MS: busy for MS milliseconds (0: until the budget ends).
//   - publish PAYLOAD: publishes PAYLOAD on "jobs".
//   - follow PUBLISHER: follows PUBLISHER's "jobs".
//   - once: "first" the first time, "again" after.
//
// Its receive handler reads TARGET\nENTRY\nGATE\nSPIN from each event: it
// adds ENTRY to TARGET, then, with a GATE, calls the gate's once (with a
// key of its own, so it is not answered from a record) and fails if that
// says "first": the handler fails after its call has committed, and the
// event comes again. The add's key, derived from the event, makes the
// second delivery's add answer from the record instead of adding twice.
// With a SPIN it is then busy that many milliseconds before it commits (a
// window to kill the node in).
package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	sdk "github.com/durable-host/host/sdk/go"
)

func init() {
	sdk.Method("add", func(entry []byte) ([]byte, error) {
		if strings.HasPrefix(string(entry), "fail") {
			return nil, errors.New("refused: " + string(entry))
		}
		n := sdk.GetInt("total") + 1
		sdk.PutInt("total", n)
		sdk.Put(fmt.Sprintf("entry/%08d", n), entry)
		return sdk.Itoa(n), nil
	})
	sdk.Method("total", func([]byte) ([]byte, error) { return sdk.Itoa(sdk.GetInt("total")), nil })
	sdk.Method("entries", func([]byte) ([]byte, error) {
		var b []byte
		for _, kv := range sdk.Scan("entry/", 0) {
			b = append(append(b, kv.Value...), '\n')
		}
		return b, nil
	})
	sdk.Method("call", func(p []byte) ([]byte, error) {
		f := strings.SplitN(string(p), "\n", 5)
		for len(f) < 5 {
			f = append(f, "")
		}
		sdk.PutInt("calls", sdk.GetInt("calls")+1)
		if ms, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			spin(ms)
		}
		reply, err := sdk.CallWithKey(f[0], f[1], []byte(f[4]), f[2])
		if f[3] == "fail" {
			return nil, errors.New("failing after the call")
		}
		var ce *sdk.CallError
		if errors.As(err, &ce) {
			return []byte("error " + strconv.Itoa(ce.Status) + " " + ce.Message), nil
		}
		return append([]byte("ok "), reply...), nil
	})
	sdk.Method("spin", func(p []byte) ([]byte, error) {
		ms, _ := strconv.ParseInt(string(p), 10, 64)
		spin(ms)
		return []byte("done"), nil
	})
	sdk.Method("publish", func(p []byte) ([]byte, error) { return nil, sdk.Publish("jobs", p) })
	sdk.Method("follow", func(p []byte) ([]byte, error) {
		return nil, sdk.Follow(string(p), "jobs", sdk.FollowOptions{})
	})
	sdk.Method("once", func([]byte) ([]byte, error) {
		if _, ok := sdk.Get("opened"); ok {
			return []byte("again"), nil
		}
		sdk.Put("opened", nil)
		return []byte("first"), nil
	})
	sdk.OnReceive(func(e sdk.Event) error {
		f := strings.SplitN(string(e.Payload), "\n", 4)
		for len(f) < 4 {
			f = append(f, "")
		}
		if _, err := sdk.Call(f[0], "add", []byte(f[1])); err != nil {
			return err
		}
		if f[2] != "" {
			key := make([]byte, 8)
			sdk.Random(key)
			r, err := sdk.CallWithKey(f[2], "once", nil, hex.EncodeToString(key))
			if err != nil {
				return err
			}
			if string(r) == "first" {
				return errors.New("gate closed: first attempt")
			}
		}
		if ms, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			spin(ms)
		}
		sdk.PutInt("received", sdk.GetInt("received")+1)
		return nil
	})
}

// spin keeps the handler busy for ms milliseconds, 0: until its budget
// ends.
func spin(ms int64) {
	until := sdk.Now() + ms*1e6
	for ms == 0 || sdk.Now() < until {
	}
}

func main() {}
