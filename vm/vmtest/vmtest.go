// Package vmtest gives tests real modules: the examples built from source
// once per test process, and small hand-assembled modules for the cases the
// SDK cannot produce (a wrong ABI version, missing exports).
package vmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	examples "github.com/durable-host/host/examples/wasm"
)

var (
	once  sync.Once
	built map[string]string
	err   error
)

// Examples builds every example (Rust ones when a wasm-capable rustc is
// installed) once per process and returns program name → module path.
func Examples(t testing.TB) map[string]string {
	t.Helper()
	b, err := Built()
	if err != nil {
		t.Fatalf("build examples: %v", err)
	}
	return b
}

// Built is Examples for callers without a testing.TB (runnable Examples).
func Built() (map[string]string, error) {
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		_, rerr := examples.Rustc()
		var bs []examples.Built
		bs, err = examples.Build(ctx, filepath.Join(examples.SourceDir(), "out"), examples.Options{SkipRust: rerr != nil})
		built = map[string]string{}
		for _, b := range bs {
			built[b.Name] = b.Path
		}
	})
	return built, err
}

// Wasm returns the bytes of one built example.
func Wasm(t testing.TB, name string) []byte {
	t.Helper()
	b, err := Module(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Module is Wasm for callers without a testing.TB.
func Module(name string) ([]byte, error) {
	bs, err := Built()
	if err != nil {
		return nil, fmt.Errorf("build examples: %w", err)
	}
	p, ok := bs[name]
	if !ok {
		return nil, fmt.Errorf("example %q was not built", name)
	}
	return os.ReadFile(p)
}

// CacheDir is a compilation cache shared by the test processes of one
// machine, so each package does not recompile the same examples.
func CacheDir() string { return filepath.Join(os.TempDir(), "host-test-wazero-cache") }

// MinimalModule returns a hand-assembled module exporting host_abi_version
// (returning version) and, when withCall, call(i32, i32) -> i32 returning 0.
func MinimalModule(version byte, withCall bool) []byte {
	m := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	// types: 0: () -> i32, 1: (i32, i32) -> i32
	m = append(m, 0x01, 0x0b, 0x02, 0x60, 0x00, 0x01, 0x7f, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f)
	name := "host_abi_version"
	if withCall {
		m = append(m, 0x03, 0x03, 0x02, 0x00, 0x01)
		exp := []byte{0x02, byte(len(name))}
		exp = append(exp, name...)
		exp = append(exp, 0x00, 0x00, 0x04, 'c', 'a', 'l', 'l', 0x00, 0x01)
		m = append(m, 0x07, byte(len(exp)))
		m = append(m, exp...)
		m = append(m, 0x0a, 0x0b, 0x02, 0x04, 0x00, 0x41, version, 0x0b, 0x04, 0x00, 0x41, 0x00, 0x0b)
		return m
	}
	m = append(m, 0x03, 0x02, 0x01, 0x00)
	exp := []byte{0x01, byte(len(name))}
	exp = append(exp, name...)
	exp = append(exp, 0x00, 0x00)
	m = append(m, 0x07, byte(len(exp)))
	m = append(m, exp...)
	m = append(m, 0x0a, 0x06, 0x01, 0x04, 0x00, 0x41, version, 0x0b)
	return m
}
