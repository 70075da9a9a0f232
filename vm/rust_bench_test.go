package vm_test

import (
	"context"
	"testing"

	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// The Go and Rust counters side by side: module size, cold activation (a
// fresh instance from a compiled module, as when an object is activated) and
// a warm call (inc: a state read, a state write and a publish).
//
//	go test ./vm/ -run '^$' -bench 'Counter' -benchmem

// benchHost is a memHost that drops published events, so a long benchmark
// does not grow a slice.
type benchHost struct{ *memHost }

func (benchHost) Publish(context.Context, string, []byte) error { return nil }

var counterTwins = []struct{ lang, program string }{{"go", "counter"}, {"rust", "counter-rust"}}

func compileForBench(b *testing.B, e *vm.Engine, program string) *vm.Module {
	b.Helper()
	if _, ok := vmtest.Examples(b)[program]; !ok {
		b.Skipf("%s not built (no wasm-capable rustc)", program)
	}
	m, err := e.Compile(context.Background(), vmtest.Wasm(b, program))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close(context.Background()) })
	return m
}

func BenchmarkCounterActivation(b *testing.B) {
	for _, c := range counterTwins {
		b.Run(c.lang, func(b *testing.B) {
			e := newEngine(b, 0, 0)
			m := compileForBench(b, e, c.program)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				inst, err := e.Instantiate(ctx, m)
				if err != nil {
					b.Fatal(err)
				}
				inst.Close(ctx)
			}
			b.ReportMetric(float64(m.Size), "module-bytes")
		})
	}
}

// BenchmarkCounterFirstCall is activation plus the first call: for Rust that
// includes the SDK's lazy registration, for Go the init already ran in
// _initialize during Instantiate.
func BenchmarkCounterFirstCall(b *testing.B) {
	for _, c := range counterTwins {
		b.Run(c.lang, func(b *testing.B) {
			e := newEngine(b, 0, 0)
			m := compileForBench(b, e, c.program)
			ctx := context.Background()
			h := benchHost{newMemHost()}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				inst, err := e.Instantiate(ctx, m)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := inst.Call(h, "get", nil); err != nil {
					b.Fatal(err)
				}
				inst.Close(ctx)
			}
		})
	}
}

func BenchmarkCounterWarmCall(b *testing.B) {
	for _, c := range counterTwins {
		b.Run(c.lang, func(b *testing.B) {
			e := newEngine(b, 0, 0)
			m := compileForBench(b, e, c.program)
			ctx := context.Background()
			inst, err := e.Instantiate(ctx, m)
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Close(ctx)
			h := benchHost{newMemHost()}
			if _, err := inst.Call(h, "inc", nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := inst.Call(h, "inc", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCounterWarmJSONCall(b *testing.B) {
	payload := []byte(`{"amount": 2}`)
	for _, c := range counterTwins {
		b.Run(c.lang, func(b *testing.B) {
			e := newEngine(b, 0, 0)
			m := compileForBench(b, e, c.program)
			ctx := context.Background()
			inst, err := e.Instantiate(ctx, m)
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Close(ctx)
			h := benchHost{newMemHost()}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := inst.Call(h, "add", payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
