package vm_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/vm"
	"github.com/durable-host/host/vm/vmtest"
)

// memHost is a Host over a map, for testing the VM alone.
type memHost struct {
	state     map[string][]byte
	published []string
	alarm     *time.Time
}

func newMemHost() *memHost { return &memHost{state: map[string][]byte{}} }

func (h *memHost) Get(_ context.Context, k []byte) ([]byte, bool, error) {
	v, ok := h.state[string(k)]
	return v, ok, nil
}
func (h *memHost) Put(_ context.Context, k, v []byte) error {
	h.state[string(k)] = append([]byte(nil), v...)
	return nil
}
func (h *memHost) Delete(_ context.Context, k []byte) error { delete(h.state, string(k)); return nil }
func (h *memHost) Scan(_ context.Context, p []byte, limit int) ([]abi.Pair, error) {
	var out []abi.Pair
	for k, v := range h.state {
		if strings.HasPrefix(k, string(p)) {
			out = append(out, abi.Pair{Key: []byte(k), Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Key, out[j].Key) < 0 })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
func (h *memHost) Publish(_ context.Context, t string, p []byte) error {
	h.published = append(h.published, t+":"+string(p))
	return nil
}
func (h *memHost) Follow(context.Context, abi.FollowRequest) error   { return nil }
func (h *memHost) Unfollow(context.Context, abi.FollowRequest) error { return nil }
func (h *memHost) Self() string                                      { return "test/1" }
func (h *memHost) Deadline() time.Time                               { return time.Time{} }
func (h *memHost) Call(_ context.Context, r abi.CallRequest) ([]byte, error) {
	if r.Method == "fail" {
		return nil, &abi.CallError{Status: 422, Message: "failed: " + r.Target}
	}
	return []byte(r.Target + "." + r.Method + "(" + string(r.Payload) + ")"), nil
}
func (h *memHost) SetAlarm(_ context.Context, t time.Time) error {
	h.alarm = &t
	return nil
}
func (h *memHost) Alarm(context.Context) (time.Time, bool, error) {
	if h.alarm == nil {
		return time.Time{}, false, nil
	}
	return *h.alarm, true, nil
}
func (h *memHost) DeleteAlarm(context.Context) error { h.alarm = nil; return nil }
func (h *memHost) Now() time.Time                    { return time.Now() }
func (h *memHost) Log(int32, string)                 {}

func newEngine(t testing.TB, budget time.Duration, pages uint32) *vm.Engine {
	t.Helper()
	cfg := vm.DefaultConfig()
	cfg.CacheDir = vmtest.CacheDir()
	if budget > 0 {
		cfg.Budget = budget
	}
	if pages > 0 {
		cfg.MemoryLimitPages = pages
	}
	e, err := vm.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func instance(t testing.TB, e *vm.Engine, name string) *vm.Instance {
	t.Helper()
	m, err := e.Compile(context.Background(), vmtest.Wasm(t, name))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.Instantiate(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(context.Background()) })
	return inst
}

func TestCounterCalls(t *testing.T) {
	e := newEngine(t, 0, 0)
	inst := instance(t, e, "counter")
	h := newMemHost()
	for want := 1; want <= 3; want++ {
		out, err := inst.Call(h, "inc", nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(rune('0'+want)) {
			t.Fatalf("inc = %q, want %d", out, want)
		}
	}
	out, err := inst.Call(h, "add", []byte(`{"amount": 39}`))
	if err != nil || string(out) != "42" {
		t.Fatalf("add = %q, %v", out, err)
	}
	if len(h.published) != 4 || h.published[3] != `changes:{"value":42}` {
		t.Fatalf("published %q", h.published)
	}
	_, err = inst.Call(h, "add", []byte(`{"amount": "x"}`))
	var ge *vm.GuestError
	if !errors.As(err, &ge) || !strings.Contains(ge.Message, "bad request") {
		t.Fatalf("bad payload: %v", err)
	}
	if _, err := inst.Call(h, "nope", nil); !errors.Is(err, vm.ErrMethodNotFound) {
		t.Fatalf("unknown method: %v", err)
	}
	if inst.Broken() {
		t.Fatal("error replies must not break the instance")
	}
	if inst.Module().Has(abi.HandlerEvent) || inst.Module().Has(abi.HandlerReceive) {
		t.Fatal("counter registers no event or receive handler")
	}
}

func TestHostileGuests(t *testing.T) {
	e := newEngine(t, 3*time.Second, 512)
	cases := []struct {
		method string
		check  func(error) bool
		broken bool
	}{
		{"loop", func(err error) bool { return errors.Is(err, vm.ErrBudget) }, true},
		{"bomb", func(err error) bool { var te *vm.TrapError; return errors.As(err, &te) }, true},
		{"trap", func(err error) bool { var te *vm.TrapError; return errors.As(err, &te) }, true},
		{"oob", func(err error) bool {
			var te *vm.TrapError
			return errors.As(err, &te) && strings.Contains(te.Message, "outside guest memory")
		}, true},
		{"oob_len", func(err error) bool { var te *vm.TrapError; return errors.As(err, &te) }, true},
		{"call_oob", func(err error) bool {
			var te *vm.TrapError
			return errors.As(err, &te) && strings.Contains(te.Message, "outside guest memory")
		}, true},
		{"big_reply", func(err error) bool { var te *vm.TrapError; return errors.As(err, &te) }, true},
		{"panic", func(err error) bool {
			var ge *vm.GuestError
			return errors.As(err, &ge) && strings.Contains(ge.Message, "on purpose")
		}, false},
	}
	for _, c := range cases {
		t.Run(c.method, func(t *testing.T) {
			inst := instance(t, e, "hostile")
			start := time.Now()
			_, err := inst.Call(newMemHost(), c.method, nil)
			if !c.check(err) {
				t.Fatalf("%s: unexpected error %T %v", c.method, err, err)
			}
			if inst.Broken() != c.broken {
				t.Fatalf("%s: broken = %v", c.method, inst.Broken())
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s took %v", c.method, time.Since(start))
			}
			// A fresh instance works.
			inst2 := instance(t, e, "hostile")
			if out, err := inst2.Call(newMemHost(), "ok", nil); err != nil || string(out) != "ok" {
				t.Fatalf("fresh instance: %q %v", out, err)
			}
		})
	}
}

func TestCompileRejects(t *testing.T) {
	e := newEngine(t, 0, 0)
	counter := vmtest.Wasm(t, "counter")
	cases := map[string][]byte{
		"not wasm":      []byte("hello world, not a module"),
		"truncated":     counter[:len(counter)/2],
		"missing call":  vmtest.MinimalModule(abi.Version, false),
		"wrong version": vmtest.MinimalModule(abi.Version+1, true),
		"empty":         nil,
	}
	for name, b := range cases {
		if _, err := e.Compile(context.Background(), b); !errors.Is(err, vm.ErrInvalidModule) {
			t.Errorf("%s: %v", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := e.Compile(context.Background(), vmtest.MinimalModule(abi.Version, true)); err != nil {
		t.Fatalf("minimal valid module: %v", err)
	}
}

// loopingInitModule is a valid module (version, call) whose _initialize
// never returns.
func loopingInitModule() []byte {
	m := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	// types: 0: () -> i32, 1: (i32, i32) -> i32, 2: () -> ()
	m = append(m, 0x01, 0x0e, 0x03, 0x60, 0x00, 0x01, 0x7f, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f, 0x60, 0x00, 0x00)
	m = append(m, 0x03, 0x04, 0x03, 0x00, 0x01, 0x02)
	var exp []byte
	for i, name := range []string{abi.ExportVersion, abi.ExportCall, "_initialize"} {
		exp = append(exp, byte(len(name)))
		exp = append(exp, name...)
		exp = append(exp, 0x00, byte(i))
	}
	m = append(m, 0x07, byte(len(exp)+1), 0x03)
	m = append(m, exp...)
	code := []byte{0x03,
		0x04, 0x00, 0x41, abi.Version, 0x0b, // version
		0x04, 0x00, 0x41, 0x00, 0x0b, // call: return 0
		0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b, // _initialize: loop { br 0 }
	}
	m = append(m, 0x0a, byte(len(code)))
	return append(m, code...)
}

// TestInitBudget: _initialize is not a handler call; it runs under the
// longer of InitBudget and Budget, so a short handler budget does not fail
// a slow start on a busy machine, and a guest that never finishes its init
// is still stopped and rejected.
func TestInitBudget(t *testing.T) {
	cfg := vm.DefaultConfig()
	cfg.Budget, cfg.InitBudget = 50*time.Millisecond, time.Second
	e, err := vm.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	start := time.Now()
	_, err = e.Compile(context.Background(), loopingInitModule())
	took := time.Since(start)
	if !errors.Is(err, vm.ErrInitBudget) || !errors.Is(err, vm.ErrInvalidModule) {
		t.Fatalf("looping _initialize: %v, want the budget error", err)
	}
	if took < time.Second {
		t.Fatalf("looping _initialize stopped after %v: the 50ms call budget applied, not the 1s init budget", took)
	}
	t.Logf("looping _initialize stopped after %v: %v", took, err)
}

// TestInitBudgetStartsWithTheStart: at most one _initialize per CPU runs
// at once, and the wall-clock init budget counts from when a start runs,
// not from when it queued behind the others (a hot update or a restart
// activates a hundred objects at once on a busy machine; queued starts
// did not fail their budget). One more looping start than there are
// tokens: each is stopped by its own budget, so the last one stopped ran
// after another's budget ended, at least two budgets after they all
// began.
func TestInitBudgetStartsWithTheStart(t *testing.T) {
	cfg := vm.DefaultConfig()
	const budget = 300 * time.Millisecond
	cfg.Budget, cfg.InitBudget = 50*time.Millisecond, budget
	e, err := vm.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	starts := max(2, runtime.GOMAXPROCS(0)) + 1
	took := make([]time.Duration, starts)
	begin := time.Now()
	var wg sync.WaitGroup
	for i := range starts {
		// A custom section of its own gives each module its own digest,
		// so no two share one compile.
		wasm := append(loopingInitModule(), 0x00, 0x03, 0x01, byte('a'+i), 0x00)
		wg.Go(func() {
			_, err := e.Compile(context.Background(), wasm)
			took[i] = time.Since(begin)
			if !errors.Is(err, vm.ErrInitBudget) {
				t.Errorf("looping start %d: %v, want the init budget's error", i, err)
			}
		})
	}
	wg.Wait()
	slowest := slices.Max(took)
	if slowest < 2*budget {
		t.Fatalf("%d looping starts all ended within %v of each other (%v): more ran at once than the %d tokens, or a queued start's budget ran while it waited", starts, slowest, took, starts-1)
	}
	t.Logf("%d looping starts with %d tokens and a %v budget ended after %v", starts, starts-1, budget, took)
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestGuestSleepHoldsNoCPU: a Go guest's time.Sleep (WASI poll_oneoff)
// waits for real, without spinning a core, and a sleep longer than the
// budget ends with the budget's error.
func TestGuestSleepHoldsNoCPU(t *testing.T) {
	e := newEngine(t, 2*time.Second, 0)
	inst := instance(t, e, "hostile")
	const nap = 500 * time.Millisecond
	cpu0, wall0 := cpuTime(t), time.Now()
	if _, err := inst.Call(newMemHost(), "shape", []byte(strconv.Itoa(int(nap.Milliseconds())))); err != nil {
		t.Fatal(err)
	}
	cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
	t.Logf("a %v sleep took %v and %v of CPU", nap, wall, cpu)
	if wall < nap {
		t.Fatalf("a %v sleep returned after %v", nap, wall)
	}
	if cpu > nap/10 {
		t.Fatalf("a %v sleep used %v of CPU: the guest spun", nap, cpu)
	}
	done := make(chan error, 1)
	go func() {
		_, err := inst.Call(newMemHost(), "shape", []byte(strconv.Itoa(int(time.Hour.Milliseconds()))))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, vm.ErrBudget) {
			t.Fatalf("an hour's sleep with a 2s budget: %v, want the budget error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("an hour's sleep with a 2s budget was not stopped a minute later")
	}
}
