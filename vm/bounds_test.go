package vm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/durable-host/host/vm/vmtest"
)

// Module assembly for the bounds tests.
var (
	leb     = vmtest.LEB
	cat     = vmtest.Cat
	section = vmtest.Section
	vec     = vmtest.Vec
	str     = vmtest.Name
)

var (
	header = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	max32  = []byte{0xff, 0xff, 0xff, 0xff, 0x0f}
	// types: 0: () -> i32
	oneType = section(1, vec([]byte{0x60, 0x00, 0x01, 0x7f}))
)

// withBody is a module of one function of type () -> i32 with the given
// table section body (nil for none) and function body (locals and code).
func withBody(table, body []byte) []byte {
	m := cat(header, oneType, section(3, vec([]byte{0x00})))
	if table != nil {
		m = cat(m, section(4, table))
	}
	return cat(m, section(10, vec(cat(leb(uint64(len(body))), body))))
}

// growBody calls table.grow on table 0 and returns its result.
var growBody = []byte{0x00, 0xd0, 0x70, 0x41, 0x01, 0xfc, 0x0f, 0x00, 0x0b}

func TestCheckBoundsRefusesBombs(t *testing.T) {
	cases := map[string][]byte{
		"section size":     cat(header, []byte{0x01}, max32),
		"import count":     cat(header, section(2, max32)),
		"type count":       cat(header, section(1, max32)),
		"parameter count":  cat(header, section(1, vec(cat([]byte{0x60}, max32)))),
		"import name":      cat(header, section(2, vec(cat(max32, []byte("x"))))),
		"function count":   cat(header, oneType, section(3, max32)),
		"export name":      cat(header, section(7, vec(cat(max32, []byte("x"))))),
		"global count":     cat(header, section(6, max32)),
		"element count":    cat(header, section(9, max32)),
		"element funcs":    cat(header, section(9, vec(cat([]byte{0x00, 0x41, 0x00, 0x0b}, max32)))),
		"data length":      cat(header, section(11, vec(cat([]byte{0x01}, max32)))),
		"code count":       cat(header, section(10, max32)),
		"locals count":     withBody(nil, cat([]byte{0x01}, max32, []byte{0x7f, 0x41, 0x00, 0x0b})),
		"locals sum":       withBody(nil, cat([]byte{0x02}, leb(30_000), []byte{0x7f}, leb(30_000), []byte{0x7e, 0x41, 0x00, 0x0b})),
		"custom name":      cat(header, section(0, max32)),
		"function names":   cat(header, section(0, str("name"), []byte{0x01, 0x05}, max32)),
		"local names":      cat(header, section(0, str("name"), []byte{0x02, 0x07}, vec(cat([]byte{0x00}, max32)))),
		"table min":        withBody(vec([]byte{0x70, 0x00, 0x80, 0x80, 0x80, 0x40}), []byte{0x00, 0x41, 0x00, 0x0b}),
		"imported table":   cat(header, section(2, vec(cat(str("host"), str("t"), []byte{0x01, 0x70, 0x00}, leb(1<<27))))),
		"grow, no maximum": withBody(vec([]byte{0x70, 0x00, 0x01}), growBody),
		"grow, large max":  withBody(vec(cat([]byte{0x70, 0x01, 0x01}, leb(1<<30))), growBody),
		"br_table labels":  withBody(vec([]byte{0x70, 0x00, 0x01}), cat([]byte{0x00, 0x41, 0x00, 0x0e}, max32, []byte{0x00, 0x0b})),
		"unknown opcode":   withBody(vec([]byte{0x70, 0x00, 0x01}), []byte{0x00, 0x41, 0x00, 0xf0, 0x0b}),
	}
	for name, m := range cases {
		err := checkBounds(m)
		if !errors.Is(err, errBounds) {
			t.Errorf("%s (%d bytes): %v, want a bounds error", name, len(m), err)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestCheckBoundsAcceptsBoundedModules(t *testing.T) {
	cases := map[string][]byte{
		"grow, small max":  withBody(vec([]byte{0x70, 0x01, 0x01, 0x10}), growBody),
		"no table":         withBody(nil, []byte{0x00, 0x41, 0x00, 0x0b}),
		"table, no grow":   withBody(vec([]byte{0x70, 0x00, 0x01}), []byte{0x00, 0xfc, 0x10, 0x00, 0x0b}),
		"some locals":      withBody(nil, cat([]byte{0x01}, leb(1000), []byte{0x7f, 0x41, 0x00, 0x0b})),
		"grow-like consts": withBody(vec([]byte{0x70, 0x00, 0x01}), []byte{0x00, 0x41, 0xfc, 0x0f, 0x1a, 0x41, 0x00, 0x0b}),
		"v128.const":       withBody(vec([]byte{0x70, 0x00, 0x01}), cat([]byte{0x00, 0xfd, 0x0c}, bytes.Repeat([]byte{0xfc}, 16), []byte{0x1a, 0x41, 0x00, 0x0b})),
		"truncated":        cat(header, section(2, vec(cat(str("host"))))),
	}
	for name, m := range cases {
		if err := checkBounds(m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestCheckBoundsReadsRealModules: the modules our SDKs build pass, and the
// instruction walk reads every function body of every example to its end
// (a decoder bug would refuse real programs or miss a table.grow).
func TestCheckBoundsReadsRealModules(t *testing.T) {
	names := []string{"counter", "chat", "tally", "hostile"}
	if _, ok := vmtest.Examples(t)["counter-rust"]; ok {
		names = append(names, "counter-rust", "chat-rust", "tally-rust", "hostile-rust")
	} else {
		t.Log("Rust examples not built here (no rustc with the wasm32 target); Go modules only")
	}
	for _, name := range names {
		w := vmtest.Wasm(t, name)
		if err := checkBounds(w); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		mod, err := walkModule(w)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(mod.bodies) == 0 {
			t.Fatalf("%s: no function bodies found", name)
		}
		for i, body := range mod.bodies {
			grows, err := growsTable(body)
			if err != nil || grows {
				t.Fatalf("%s: body %d: grows=%v err=%v", name, i, grows, err)
			}
			if body[len(body)-1] != 0x0b {
				t.Fatalf("%s: body %d does not end with end", name, i)
			}
		}
		t.Logf("%s: %d bytes, %d function bodies read, growable table %v", name, len(w), len(mod.bodies), mod.growable)
	}
}

func BenchmarkCheckBounds(b *testing.B) {
	w := vmtest.Wasm(b, "chat")
	b.SetBytes(int64(len(w)))
	for b.Loop() {
		if err := checkBounds(w); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzCheckBounds(f *testing.F) {
	f.Add(withBody(vec([]byte{0x70, 0x00, 0x01}), growBody))
	f.Add(cat(header, section(2, max32)))
	f.Add(withBody(nil, cat([]byte{0x01}, max32, []byte{0x7f, 0x41, 0x00, 0x0b})))
	f.Fuzz(func(t *testing.T, m []byte) {
		_ = checkBounds(cat(header, m))
	})
}

func BenchmarkMeter(b *testing.B) {
	w := vmtest.Wasm(b, "chat")
	b.SetBytes(int64(len(w)))
	for b.Loop() {
		if _, err := meter(w); err != nil {
			b.Fatal(err)
		}
	}
}
