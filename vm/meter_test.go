package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/vm/vmtest"
)

// meterModule assembles a module exporting host_abi_version and call,
// whose call body is callBody (after its locals vector). Function 2, of
// type (i32) -> (), recurses twice on n-1 until n is 0: 2^n calls without
// a loop. start, when not nil, is the body of a start function 3 of type
// () -> (). The module has one mutable i32 global (0) and one memory page.
func meterModule(callBody, start []byte, extraExport []byte) []byte {
	types := section(1, vec(
		[]byte{0x60, 0x00, 0x01, 0x7f},             // 0: () -> i32
		[]byte{0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f}, // 1: (i32, i32) -> i32
		[]byte{0x60, 0x00, 0x00},                   // 2: () -> ()
		[]byte{0x60, 0x01, 0x7f, 0x00},             // 3: (i32) -> ()
	))
	funcs := [][]byte{{0x00}, {0x01}, {0x03}}
	bodies := [][]byte{
		{0x00, 0x41, abi.Version, 0x0b},
		callBody,
		// if n == 0 return; r(n-1); r(n-1)
		{0x00, 0x20, 0x00, 0x45, 0x0d, 0x00,
			0x20, 0x00, 0x41, 0x01, 0x6b, 0x10, 0x02,
			0x20, 0x00, 0x41, 0x01, 0x6b, 0x10, 0x02, 0x0b},
	}
	if start != nil {
		funcs = append(funcs, []byte{0x02})
		bodies = append(bodies, start)
	}
	exports := [][]byte{
		cat(str(abi.ExportVersion), []byte{0x00, 0x00}),
		cat(str(abi.ExportCall), []byte{0x00, 0x01}),
		cat(str("g"), []byte{0x03, 0x00}),
	}
	if extraExport != nil {
		exports = append(exports, extraExport)
	}
	m := cat(header, types, section(3, vec(funcs...)),
		section(5, vec([]byte{0x00, 0x01})),
		section(6, vec([]byte{0x7f, 0x01, 0x41, 0x00, 0x0b})),
		section(7, vec(exports...)))
	if start != nil {
		m = cat(m, section(8, leb(3)))
	}
	var code [][]byte
	for _, b := range bodies {
		code = append(code, cat(leb(uint64(len(b))), b))
	}
	return cat(m, section(10, vec(code...)))
}

var (
	// recurseCall runs r(60): 2^60 calls, none of them in a loop.
	recurseCall = []byte{0x00, 0x41, 60, 0x10, 0x02, 0x41, 0x00, 0x0b}
	// countCall counts up the i32 at address 0 forever.
	countCall = []byte{0x00, 0x03, 0x40,
		0x41, 0x00, 0x41, 0x00, 0x28, 0x02, 0x00, 0x41, 0x01, 0x6a, 0x36, 0x02, 0x00,
		0x0c, 0x00, 0x0b, 0x41, 0x00, 0x0b}
	// globalCall returns global 0 as its status.
	globalCall = []byte{0x00, 0x23, 0x00, 0x0b}
	// loopStart loops forever.
	loopStart = []byte{0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b}
	// setStart sets global 0 to 7.
	setStart = []byte{0x00, 0x41, 0x07, 0x24, 0x00, 0x0b}
)

func meterEngine(t *testing.T, budget time.Duration) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Budget, cfg.InitBudget = budget, budget
	cfg.CacheDir = vmtest.CacheDir()
	e, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func meterInstance(t *testing.T, e *Engine, wasm []byte) *Instance {
	t.Helper()
	m, err := e.Compile(context.Background(), wasm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	inst, err := e.Instantiate(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	return inst
}

// startCall runs call on inst in the background; its error arrives on
// the channel returned.
func startCall(inst *Instance) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := inst.Call(nil, "m", nil)
		done <- err
	}()
	return done
}

// wantErr fails the test unless done yields an error that is want within
// a minute.
func wantErr(t *testing.T, what string, done <-chan error, want error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s did not end within a minute", what)
	}
}

// callStopped runs call on inst and fails the test unless it ends with
// ErrBudget within a minute.
func callStopped(t *testing.T, inst *Instance) {
	t.Helper()
	wantErr(t, "the call past its budget", startCall(inst), ErrBudget)
}

// TestBudgetStopsRecursionWithoutLoops: a guest that calls itself 2^60
// times without a loop is stopped at its budget (each function entry
// counts, not only loop headers).
func TestBudgetStopsRecursionWithoutLoops(t *testing.T) {
	e := meterEngine(t, 100*time.Millisecond)
	callStopped(t, meterInstance(t, e, meterModule(recurseCall, nil, nil)))
}

// TestLoopingGuestDoesNotHoldTheGarbageCollector: while a guest loops in
// native code, a garbage collection (which stops every goroutine) still
// completes, long before the guest's budget ends: the guest leaves native
// code for Go every meterEvery iterations. A guest that never left would
// hold the collection, and every goroutine of the node behind it, until
// its budget stopped it.
func TestLoopingGuestDoesNotHoldTheGarbageCollector(t *testing.T) {
	e := meterEngine(t, 30*time.Second)
	inst := meterInstance(t, e, meterModule(countCall, nil, nil))
	done := startCall(inst)
	// Wait until the guest is in its loop: its count has moved.
	mem := inst.mod.Memory()
	for {
		if n, _ := mem.ReadUint32Le(0); n > 1000 {
			break
		}
		runtime.Gosched()
	}
	runtime.GC()
	runtime.GC()
	if inst.expired.Load() {
		t.Fatal("the garbage collection completed only once the guest's budget had stopped it")
	}
	if n, _ := mem.ReadUint32Le(0); n == 0 {
		t.Fatal("the guest's count reads 0")
	}
	// And the guest is stopped by the watchdog all the same.
	inst.deadline.Store(e.now())
	wantErr(t, "the looping call past its deadline", done, ErrBudget)
}

// TestCloseStopsRunningGuests: closing the engine stops the watchdog, so
// it stops every guest still running itself: a looping call ends with
// ErrClosed, a looping start fails its compile with ErrClosed, and Close
// returns (it waits for instantiations in flight).
func TestCloseStopsRunningGuests(t *testing.T) {
	e := meterEngine(t, time.Hour)
	inst := meterInstance(t, e, meterModule(countCall, nil, nil))
	called := startCall(inst)
	compiled := make(chan error, 1)
	go func() {
		_, err := e.Compile(context.Background(), meterModule(globalCall, loopStart, nil))
		compiled <- err
	}()
	// Wait for both: the call's count moves, and a second instance (the
	// compile's) is running its start.
	mem := inst.mod.Memory()
	for {
		n, _ := mem.ReadUint32Le(0)
		starting := false
		e.mu.Lock()
		for other := range e.live {
			starting = starting || other != inst && other.deadline.Load() != 0
		}
		e.mu.Unlock()
		if n > 0 && starting {
			break
		}
		runtime.Gosched()
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	wantErr(t, "Close", closed, nil)
	wantErr(t, "the looping call", called, ErrClosed)
	wantErr(t, "the looping start's compile", compiled, ErrClosed)
}

// TestStartSectionRunsUnderTheInitBudget: meter moves a start section's
// function to an export the engine runs before _initialize: a start that
// loops is stopped by the init budget, and one that sets state has done so
// before the first call.
func TestStartSectionRunsUnderTheInitBudget(t *testing.T) {
	e := meterEngine(t, 100*time.Millisecond)
	if _, err := e.Compile(context.Background(), meterModule(globalCall, loopStart, nil)); !errors.Is(err, ErrInitBudget) {
		t.Fatalf("looping start: %v, want the init budget's error", err)
	}
	inst := meterInstance(t, e, meterModule(globalCall, setStart, nil))
	_, err := inst.Call(nil, "m", nil)
	var ge *GuestError
	if !errors.As(err, &ge) || !strings.Contains(ge.Message, "status 7") {
		t.Fatalf("call after a start that set the global to 7: %v", err)
	}
}

// TestMeterRefusesGlobalsPastTheModules: a module whose code names a
// global past its own (invalid as uploaded) would, once metered, name the
// stop flag: one that clears it in its loop would never end. It is
// refused.
func TestMeterRefusesGlobalsPastTheModules(t *testing.T) {
	e := meterEngine(t, 100*time.Millisecond)
	// The module has one global (0): meter's countdown would be 1 and the
	// stop flag 2. loop { global.set 2 (i32.const 0); br 0 }
	clear := []byte{0x00, 0x03, 0x40, 0x41, 0x00, 0x24, 0x02, 0x0c, 0x00, 0x0b, 0x41, 0x00, 0x0b}
	m, err := e.Compile(context.Background(), meterModule(clear, nil, nil))
	if err == nil {
		inst := meterInstance(t, e, meterModule(clear, nil, nil))
		m.Close(context.Background())
		callStopped(t, inst)
		t.Fatal("a module clearing the stop flag compiled")
	}
	if !errors.Is(err, ErrInvalidModule) || !strings.Contains(err.Error(), "global 2") {
		t.Fatalf("a module using global 2 of 1: %v", err)
	}
}

// TestMeterRefusesModulesThatWouldGrowTenfold: a module of 30,000 empty
// functions (four bytes each) would be eight times its size once metered;
// it is refused rather than handed to the compiler, so the upload size
// limit still bounds what is compiled. A thirtieth of them is within
// bounds.
func TestMeterRefusesModulesThatWouldGrowTenfold(t *testing.T) {
	empties := func(n int) []byte {
		funcs := make([][]byte, n)
		bodies := make([][]byte, n)
		for i := range n {
			funcs[i] = []byte{0x00}
			bodies[i] = []byte{0x02, 0x00, 0x0b} // size, no locals, end
		}
		return cat(header, section(1, vec([]byte{0x60, 0x00, 0x00})), section(3, vec(funcs...)), section(10, vec(bodies...)))
	}
	w := empties(30_000)
	if _, err := meter(w); !errors.Is(err, errMeter) || !strings.Contains(err.Error(), "too many functions and loops") {
		t.Fatalf("a module of 30,000 empty functions (%d bytes): %v", len(w), err)
	}
	if _, err := meter(empties(1_000)); err != nil {
		t.Fatalf("a module of 1,000 empty functions: %v", err)
	}
}

// TestMeterRefusesFunctionsTooSlowToCompile: compile time grows with the
// square of a function's control structures, so a small module can hold
// a CPU for minutes. A function of 40,000 empty blocks (120 KB) is
// refused before the compiler sees it; the examples are far inside the
// bound (TestMeterKeepsModulesValid).
func TestMeterRefusesFunctionsTooSlowToCompile(t *testing.T) {
	e := meterEngine(t, time.Second)
	body := []byte{0x00}
	for range 40_000 {
		body = append(body, 0x02, 0x40, 0x0b) // block end
	}
	body = append(body, 0x41, 0x00, 0x0b)
	w := meterModule(body, nil, nil)
	_, err := e.Compile(context.Background(), w)
	if !errors.Is(err, ErrInvalidModule) || !strings.Contains(err.Error(), "too many blocks, loops and ifs") {
		t.Fatalf("a function of 40,000 blocks (%d bytes): %v", len(w), err)
	}
}

// TestMeterRefusesTheHostsExportNames: a module exporting a name meter
// adds is refused with a clear error, not rewritten into an invalid one.
func TestMeterRefusesTheHostsExportNames(t *testing.T) {
	e := meterEngine(t, time.Second)
	_, err := e.Compile(context.Background(), meterModule(globalCall, nil, cat(str(meterStop), []byte{0x00, 0x00})))
	if !errors.Is(err, ErrInvalidModule) || !strings.Contains(err.Error(), fmt.Sprintf("%q is the host's own", meterStop)) {
		t.Fatalf("a module exporting %q: %v", meterStop, err)
	}
}

// TestMeterKeepsModulesValid: every example, and modules with and without
// a memory, globals, exports or a start section, compile once metered;
// the metered examples hold a check per function and per loop.
func TestMeterKeepsModulesValid(t *testing.T) {
	e := meterEngine(t, time.Second)
	mods := map[string][]byte{
		"minimal":      vmtest.MinimalModule(abi.Version, true),
		"version only": vmtest.MinimalModule(abi.Version, false),
		"start":        meterModule(globalCall, setStart, nil),
		"recurse":      meterModule(recurseCall, nil, nil),
	}
	for name := range vmtest.Examples(t) {
		mods[name] = vmtest.Wasm(t, name)
	}
	for name, w := range mods {
		m, err := meter(w)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := e.rt.CompileModule(context.Background(), m); err != nil {
			t.Fatalf("%s metered does not compile: %v", name, err)
		}
		scan, err := walkModule(w)
		if err != nil {
			t.Fatal(err)
		}
		loops := 0
		for _, body := range scan.bodies {
			r := &wreader{b: body}
			for r.more() {
				if op, _, err := r.instr(); err == nil && op == 0x03 {
					loops++
				}
			}
		}
		mscan, err := walkModule(m)
		if err != nil {
			t.Fatal(err)
		}
		checks := 0
		for _, body := range mscan.bodies {
			checks += bytes.Count(body, []byte{0x41, 0x00, 0x40, 0x00, 0x1a})
		}
		if want := len(scan.bodies) + loops; checks != want {
			t.Fatalf("%s: %d checks, want %d (%d functions, %d loops)", name, checks, want, len(scan.bodies), loops)
		}
		t.Logf("%s: %d → %d bytes, %d functions, %d loops", name, len(w), len(m), len(scan.bodies), loops)
	}
}

// FuzzMeter: meter never panics, and a module wazero accepts stays
// accepted once metered.
func FuzzMeter(f *testing.F) {
	f.Add(meterModule(recurseCall, setStart, nil)[8:])
	f.Add(meterModule(countCall, nil, nil)[8:])
	f.Add(vmtest.MinimalModule(abi.Version, true)[8:])
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	f.Fuzz(func(t *testing.T, m []byte) {
		w := cat(header, m)
		if checkBounds(w) != nil {
			return
		}
		metered, err := meter(w)
		if err != nil {
			return
		}
		cm, err := rt.CompileModule(ctx, w)
		if err != nil {
			return
		}
		cm.Close(ctx)
		cm, err = rt.CompileModule(ctx, metered)
		if err != nil {
			t.Fatalf("valid module invalid once metered: %v", err)
		}
		cm.Close(ctx)
	})
}
