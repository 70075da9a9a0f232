package vm_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// BenchmarkInstanceCall is the VM round trip of a warm counter instance over
// an in-memory Host, with the default 10 s budget enforced: method and
// payload in, the guest's dispatch and state access through host imports,
// the reply copied out.
func BenchmarkInstanceCall(b *testing.B) {
	for _, method := range []string{"get", "inc"} {
		b.Run(method, func(b *testing.B) {
			e := newEngine(b, 0, 0)
			if e.Config().Budget != vm.DefaultBudget {
				b.Fatalf("budget %v", e.Config().Budget)
			}
			inst := instance(b, e, "counter")
			h := newMemHost()
			if _, err := inst.Call(h, method, nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := inst.Call(h, method, nil); err != nil {
					b.Fatal(err)
				}
				h.published = h.published[:0]
			}
		})
	}
}

// stubHost defines every function the module imports from the host module
// as a no-op, so the module runs in a bare wazero runtime.
func stubHost(ctx context.Context, b *testing.B, rt wazero.Runtime, cm wazero.CompiledModule) {
	hb := rt.NewHostModuleBuilder(abi.ImportModule)
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != abi.ImportModule {
			continue
		}
		results := f.ResultTypes()
		hb.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			for i := range results {
				stack[i] = 0
			}
		}), f.ParamTypes(), results).Export(name)
	}
	if _, err := hb.Instantiate(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBareWazeroCall is the baseline for the budget's cost: the
// cheapest export of the counter (host_abi_version) called straight through
// wazero: without a budget, with wazero's WithCloseOnContextDone (an exit
// to Go at every loop), and metered the way the engine runs it (meter.go).
func BenchmarkBareWazeroCall(b *testing.B) {
	plain := vmtest.Wasm(b, "counter")
	metered, err := vm.Meter(plain)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		close bool
		wasm  []byte
	}{{"plain", false, plain}, {"closeOnContextDone", true, plain}, {"metered", false, metered}} {
		b.Run(c.name, func(b *testing.B) {
			wasm := c.wasm
			ctx := context.Background()
			cache, err := wazero.NewCompilationCacheWithDir(vmtest.CacheDir())
			if err != nil {
				b.Fatal(err)
			}
			defer cache.Close(ctx)
			rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().
				WithCompilationCache(cache).WithCloseOnContextDone(c.close))
			defer rt.Close(ctx)
			wasi_snapshot_preview1.MustInstantiate(ctx, rt)
			cm, err := rt.CompileModule(ctx, wasm)
			if err != nil {
				b.Fatal(err)
			}
			stubHost(ctx, b, rt, cm)
			mod, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize"))
			if err != nil {
				b.Fatal(err)
			}
			f := mod.ExportedFunction(abi.ExportVersion)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stack := make([]uint64, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := f.CallWithStack(cctx, stack); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if int32(stack[0]) != abi.Version {
				b.Fatalf("version %d", stack[0])
			}
		})
	}
}

// BenchmarkInstantiate is a cold activation's VM part with the module
// already compiled: a fresh counter instance, its _initialize, and closing it.
func BenchmarkInstantiate(b *testing.B) {
	e := newEngine(b, 0, 0)
	m, err := e.Compile(context.Background(), vmtest.Wasm(b, "counter"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		inst, err := e.Instantiate(ctx, m)
		if err != nil {
			b.Fatal(err)
		}
		inst.Close(ctx)
	}
}

// BenchmarkCompileWarmCache is a restarted node's first use of a program: a
// new engine on a warm on-disk compilation cache, Compile (a cache hit plus
// the validation instance) of the counter.
func BenchmarkCompileWarmCache(b *testing.B) {
	wasm := vmtest.Wasm(b, "counter")
	dir := b.TempDir()
	compile(b, dir, wasm) // fills the cache
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		compile(b, dir, wasm)
	}
}

// BenchmarkFirstCompile is an upload's compile with an empty cache.
// Slow (seconds per op): run it with a small -benchtime such as 3x.
func BenchmarkFirstCompile(b *testing.B) {
	wasm := vmtest.Wasm(b, "counter")
	root := b.TempDir()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		compile(b, filepath.Join(root, strconv.Itoa(i)), wasm)
	}
}

func compile(b *testing.B, cacheDir string, wasm []byte) {
	ctx := context.Background()
	cfg := vm.DefaultConfig()
	cfg.CacheDir = cacheDir
	e, err := vm.New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	if _, err := e.Compile(ctx, wasm); err != nil {
		b.Fatal(err)
	}
}
