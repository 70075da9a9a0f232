package vm_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"

	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// TestInstanceMemoryLimit: an instance made with a page limit below the
// engine's (a tenant's limit) cannot grow past it: the memory bomb runs
// out of memory with less than the limit in use, where the engine's own
// limit (2048 pages) would have let it take 128 MiB; and a module that
// starts above the limit is refused before it runs.
func TestInstanceMemoryLimit(t *testing.T) {
	e := newEngine(t, 0, 0)
	m, err := e.Compile(context.Background(), vmtest.Wasm(t, "hostile"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.InstantiateLimited(context.Background(), m, 8); !errors.Is(err, vm.ErrMemoryLimit) {
		t.Fatalf("8 pages for a module that starts with more: %v, want ErrMemoryLimit", err)
	}
	inUse := regexp.MustCompile(`\((\d+) in use\)`)
	for _, pages := range []uint32{64} {
		inst, err := e.InstantiateLimited(context.Background(), m, pages)
		if err != nil {
			t.Fatal(err)
		}
		_, err = inst.Call(newMemHost(), "bomb", nil)
		var te *vm.TrapError
		if !errors.As(err, &te) {
			t.Fatalf("bomb under %d pages: %v, want a trap", pages, err)
		}
		mm := inUse.FindStringSubmatch(err.Error())
		if mm == nil {
			t.Fatalf("bomb under %d pages: no heap figure in %.300q", pages, err.Error())
		}
		used, _ := strconv.Atoi(mm[1])
		if used > int(pages)*65536 {
			t.Fatalf("bomb under %d pages had %d bytes in use, over the limit", pages, used)
		}
		t.Logf("%d pages: the bomb ran out of memory with %d bytes of heap in use", pages, used)
		inst.Close(context.Background())
	}
}
