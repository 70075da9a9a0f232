package vm_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// A herd of first uses of one module compiles it once, and closing some
// references while others instantiate leaves the code usable: wazero shares
// the code of modules compiled from the same bytes, so one compile's Close
// used to free what the others were instantiating (a node panicked in
// wazero's NewFunction under its first burst after a restart).
func TestCompileOncePerDigestUnderAHerd(t *testing.T) {
	for _, name := range []string{"counter", "counter-rust"} {
		t.Run(name, func(t *testing.T) {
			wasm := vmtest.Wasm(t, name)
			e := newEngine(t, 0, 0)
			ctx := context.Background()
			const herd = 24
			mods := make([]*vm.Module, herd)
			var wg sync.WaitGroup
			errs := make(chan error, 2*herd)
			for i := range herd {
				wg.Go(func() {
					m, err := e.Compile(ctx, wasm)
					if err != nil {
						errs <- err
						return
					}
					mods[i] = m
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := e.Compiled(); got != 1 {
				t.Fatalf("%d concurrent compiles of one module left %d compiled modules, want 1", herd, got)
			}
			for i := 1; i < herd; i++ {
				if mods[i].Digest != mods[0].Digest {
					t.Fatal("references to one module disagree on its digest")
				}
			}
			// Half the holders close while the other half instantiate
			// and call: every call must work.
			errs = make(chan error, herd)
			for i, m := range mods {
				wg.Go(func() {
					if i%2 == 0 {
						m.Close(ctx)
						m.Close(ctx) // a second close of one reference is a no-op
						return
					}
					inst, err := e.Instantiate(ctx, m)
					if err != nil {
						errs <- err
						return
					}
					defer inst.Close(ctx)
					if _, err := inst.Call(newMemHost(), "inc", nil); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("instantiate while other references closed: %v", err)
			}
			if got := e.Compiled(); got != 1 {
				t.Fatalf("with half the references open, %d compiled modules, want 1", got)
			}
			for i, m := range mods {
				if i%2 == 1 {
					m.Close(ctx)
				}
			}
			if got := e.Compiled(); got != 0 {
				t.Fatalf("every reference closed, yet %d compiled modules are held", got)
			}
			// Compiled again after the last close: a fresh compile.
			m, err := e.Compile(ctx, wasm)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := e.Acquire(m.Digest); !ok {
				t.Fatal("Acquire found no compiled module for a digest just compiled")
			}
			if _, ok := e.Acquire("nope"); ok {
				t.Fatal("Acquire found a module never compiled")
			}
		})
	}
}

// A module that fails to compile is not cached: every caller gets the error.
func TestCompileFailureIsNotCached(t *testing.T) {
	e := newEngine(t, 0, 0)
	bad := []byte("\x00asm\x01\x00\x00\x00\x01\xff") // a truncated type section
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := e.Compile(context.Background(), bad); err == nil {
				t.Error("a malformed module compiled")
			}
		})
	}
	wg.Wait()
	if got := e.Compiled(); got != 0 {
		t.Fatalf("a failed compile left %d compiled modules", got)
	}
}

// Closing the engine while modules compile and instantiate (a shutdown
// whose deadline did not wait for every handler) fails them with ErrClosed
// instead of panicking inside wazero.
func TestCloseUnderCompilesAndInstantiations(t *testing.T) {
	ctx := context.Background()
	wasm := vmtest.Wasm(t, "counter-rust")
	e := newEngine(t, 0, 0)
	m, err := e.Compile(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	other := vmtest.Wasm(t, "chat-rust")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if i%2 == 0 {
				if inst, err := e.Instantiate(ctx, m); err == nil {
					inst.Close(ctx)
				} else if !errors.Is(err, vm.ErrClosed) {
					t.Errorf("instantiate while closing: %v", err)
				}
				return
			}
			if om, err := e.Compile(ctx, other); err == nil {
				om.Close(ctx)
			} else if !errors.Is(err, vm.ErrClosed) {
				t.Errorf("compile while closing: %v", err)
			}
		})
	}
	e.Close(ctx)
	wg.Wait()
	if _, err := e.Compile(ctx, other); !errors.Is(err, vm.ErrClosed) && err != nil {
		t.Fatalf("compile after close: %v", err)
	}
}
