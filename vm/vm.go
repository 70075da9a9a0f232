// Package vm runs guest programs with wazero: it compiles modules (with an
// on-disk compilation cache), checks them against the abi contract, makes
// instances, and calls their exports under the handler budget and the memory
// page limit.
//
// It owns nothing durable: the state, the log and the edges a handler touches
// are reached through the Host a caller passes to each call. A guest can never
// crash or hang the host: a trap, a pointer outside its memory, a memory bomb
// or a call past its budget fails that call and marks the instance broken; the
// caller discards it and makes a fresh one. The budget is enforced by code
// compiled into each module at upload (meter.go): a guest counts down at
// every function entry and loop, visits Go every few thousand steps, and
// traps once the engine's watchdog has raised its stop flag.
package vm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/durable-host/host/abi"
)

// Defaults.
const (
	// DefaultBudget is the wall-clock budget of one handler call (seed 000).
	DefaultBudget = 10 * time.Second
	// DefaultMemoryLimitPages bounds an instance's linear memory: 2048 pages
	// of 64 KiB = 128 MiB.
	DefaultMemoryLimitPages = 2048
	// DefaultMaxModuleSize bounds an uploaded module.
	DefaultMaxModuleSize = 32 << 20
)

// Config configures an Engine. Build it with DefaultConfig.
type Config struct {
	// Budget is the wall-clock budget of one handler call; past it the call
	// is cancelled, fails with ErrBudget and the instance is broken.
	Budget time.Duration
	// InitBudget bounds a fresh instance's _initialize. It is not a handler
	// call (the guest's runtime starts up), so it gets the longer of this
	// and Budget: a short handler budget does not fail a slow start on a
	// busy machine, and a guest that loops in its init is still stopped.
	InitBudget time.Duration
	// MemoryLimitPages is the most 64 KiB pages one instance may have.
	MemoryLimitPages uint32
	// MaxModuleSize is the largest module Compile accepts, in bytes.
	MaxModuleSize int
	// CacheDir holds compiled code across restarts; "" keeps it in memory.
	CacheDir string
	// PoolSize is how many instances the engine keeps made ahead for the
	// next activation of a module just instantiated (0: none; see
	// InstantiatePooled).
	PoolSize int
	// Logger receives guest log lines.
	Logger *slog.Logger
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Budget:           DefaultBudget,
		InitBudget:       DefaultBudget,
		MemoryLimitPages: DefaultMemoryLimitPages,
		MaxModuleSize:    DefaultMaxModuleSize,
		PoolSize:         DefaultPoolSize,
		Logger:           slog.Default(),
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Budget <= 0 {
		errs = append(errs, errors.New("budget must be positive"))
	}
	if c.MemoryLimitPages == 0 || c.MemoryLimitPages > 65536 {
		errs = append(errs, errors.New("memory limit must be 1..65536 pages"))
	}
	if c.PoolSize < 0 {
		errs = append(errs, errors.New("instance pool size must be 0 or more"))
	}
	if c.MaxModuleSize <= 0 {
		errs = append(errs, errors.New("max module size must be positive"))
	}
	return errors.Join(errs...)
}

// Errors callers branch on.
var (
	// ErrBudget: the handler ran past its budget and was stopped.
	ErrBudget = errors.New("handler ran past its budget")
	// ErrMemoryLimit: an instance would start above its memory limit.
	ErrMemoryLimit = errors.New("memory limit")
	// ErrInitBudget: a fresh instance's _initialize ran past InitBudget.
	ErrInitBudget = errors.New("_initialize ran past its budget")
	// ErrMethodNotFound: the program has no such method.
	ErrMethodNotFound = errors.New("no such method")
	// ErrNoHandler: the program does not export the handler asked for.
	ErrNoHandler = errors.New("program has no such handler")
	// ErrInvalidModule: Compile refused the module; the error says why.
	ErrInvalidModule = errors.New("invalid module")
	// ErrClosed: the engine was closed (the node is shutting down).
	ErrClosed = errors.New("engine closed")
	// ErrSkip: an event handler chose to send nothing.
	ErrSkip = errors.New("event skipped")
)

// GuestError is a handler's own error reply (status StatusError).
type GuestError struct{ Message string }

func (e *GuestError) Error() string { return e.Message }

// RefusedError is a follow hook's refusal.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "follow refused: " + e.Reason }

// TrapError is a guest that trapped, exited, or broke the ABI. The instance
// is broken.
type TrapError struct {
	Message string
	Output  string // the tail of what the guest wrote to stdout/stderr
}

func (e *TrapError) Error() string {
	if e.Output != "" {
		return "program trapped: " + e.Message + ": " + e.Output
	}
	return "program trapped: " + e.Message
}

// Engine compiles and instantiates modules. It is safe for concurrent use.
type Engine struct {
	cfg   Config
	rt    wazero.Runtime
	cache wazero.CompilationCache

	// mu guards live, the instances the watchdog scans.
	mu   sync.Mutex
	live map[*Instance]struct{}

	// life is held shared by compiles and instantiations and exclusively
	// by Close, which sets closed: after it both fail with ErrClosed.
	life   sync.RWMutex
	closed bool

	// codeMu guards codes, the compiled modules by digest, and their
	// reference counts. Never held while compiling.
	codeMu sync.Mutex
	codes  map[string]*code
	// compiles counts modules compiled (not served from codes).
	compiles atomic.Int64
	// pool holds instances made ahead for activations.
	pool instancePool
	// starts holds a token per _initialize running: at most one per CPU,
	// so the init budget, which is wall-clock, measures the guest's start
	// and not its queue behind a hundred others (a hot update or a
	// restart activates many objects at once).
	starts chan struct{}

	stop    chan struct{}
	stopped chan struct{}
	closeMu sync.Once
	base    time.Time
	// halted is set by Close once it has stopped the watchdog: every
	// running guest is stopped, and new ones stop at once.
	halted atomic.Bool
	// budget and initBudget are the call and _initialize budgets in ns.
	budget, initBudget int64
}

// New starts an engine and its budget watchdog. Close stops it.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("vm config: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var cache wazero.CompilationCache
	var err error
	if cfg.CacheDir != "" {
		cache, err = wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("compilation cache %s: %w", cfg.CacheDir, err)
		}
	} else {
		cache = wazero.NewCompilationCache()
	}
	rc := wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(cache).
		// The budget is enforced by the code meter compiles in, not by
		// leaving native code at every loop (meter.go).
		WithCloseOnContextDone(false).
		WithMemoryLimitPages(cfg.MemoryLimitPages)
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("wasi: %w", err)
	}
	e := &Engine{
		cfg: cfg, rt: rt, cache: cache,
		budget: int64(cfg.Budget), initBudget: int64(max(cfg.Budget, cfg.InitBudget)),
		live:    map[*Instance]struct{}{},
		codes:   map[string]*code{},
		starts:  make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		base:    time.Now(),
	}
	if err := e.defineHostModule(ctx); err != nil {
		rt.Close(ctx)
		return nil, err
	}
	go e.watchdog()
	return e, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Close stops the watchdog and closes every instance and compiled module.
func (e *Engine) Close(ctx context.Context) error {
	e.closeMu.Do(func() { close(e.stop) })
	<-e.stopped
	// No watchdog from here on: stop every guest still running, or one
	// looping would hold its caller, and the wait for instantiations
	// below, for ever.
	e.mu.Lock()
	e.halted.Store(true)
	for inst := range e.live {
		inst.halt()
	}
	e.mu.Unlock()
	e.closePool()
	// Wait for compiles and instantiations in flight (a handler that a
	// shutdown's deadline did not wait for): wazero panics on a runtime
	// closed under them.
	e.life.Lock()
	e.closed = true
	e.life.Unlock()
	err := e.rt.Close(ctx)
	if cerr := e.cache.Close(ctx); err == nil {
		err = cerr
	}
	return err
}

func (e *Engine) now() int64 { return int64(time.Since(e.base)) }

// watchdog enforces the budget: one goroutine per engine scans running calls
// instead of arming a timer per call, so a call pays two atomic stores.
func (e *Engine) watchdog() {
	defer close(e.stopped)
	tick := e.cfg.Budget / 20
	tick = min(max(tick, time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	lastExpire := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		if time.Since(lastExpire) >= time.Second {
			lastExpire = time.Now()
			e.expirePool(lastExpire)
		}
		now := e.now()
		e.mu.Lock()
		for inst := range e.live {
			if d := inst.deadline.Load(); d != 0 && now > d {
				inst.expired.Store(true)
				inst.halt()
			}
		}
		e.mu.Unlock()
	}
}

// Module is one holder's reference to a compiled, validated program. The
// engine compiles each digest once and shares the code: every Compile or
// Acquire returns a reference of its own, which its holder gives back with
// Close; the code is closed when the last reference is.
type Module struct {
	*code
	closed atomic.Bool
}

// code is one compiled module, shared by every reference to its digest.
type code struct {
	engine   *Engine
	compiled wazero.CompiledModule
	// Digest is the sha256 of the module bytes, hex.
	Digest string
	// Size is the module's size in bytes.
	Size int
	// Exports lists the abi exports the module has.
	Exports []string
	// Handlers is the abi.Handler* bit set of optional handlers present.
	Handlers int32

	// Guarded by Engine.codeMu.
	refs  int
	ready chan struct{} // closed when the compile ended
	err   error         // the compile's failure, once ready
}

// Has reports whether the module has the optional handler bit h.
func (m *Module) Has(h int32) bool { return m.Handlers&h != 0 }

// Close gives this reference back; the compiled code is closed with the
// last one. Closing a reference twice is a no-op.
func (m *Module) Close(ctx context.Context) error {
	if m == nil || !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	return m.engine.release(ctx, m.code)
}

// Digest returns the hex sha256 of b, the content address of a module.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Compile compiles and validates a module: it must be wasm, within the size
// limit, import only the host module and WASI, export host_abi_version
// reporting abi.Version and call, and initialize within the budget.
//
// Each digest is compiled once at a time: concurrent calls with the same
// bytes wait for one compile and share its code, and it stays compiled
// while any reference is open. wazero shares the code of modules compiled
// from the same bytes, so closing a duplicate would free code others still
// instantiate from (wazero issue 2336); and a herd of first uses compiling
// one module each cost gigabytes.
func (e *Engine) Compile(ctx context.Context, wasm []byte) (*Module, error) {
	if len(wasm) > e.cfg.MaxModuleSize {
		return nil, fmt.Errorf("%w: module is %d bytes, the limit is %d", ErrInvalidModule, len(wasm), e.cfg.MaxModuleSize)
	}
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, fmt.Errorf("%w: not a WebAssembly module (no \\0asm header)", ErrInvalidModule)
	}
	digest := Digest(wasm)
	e.codeMu.Lock()
	c, ok := e.codes[digest]
	if !ok {
		c = &code{engine: e, Digest: digest, Size: len(wasm), ready: make(chan struct{})}
		e.codes[digest] = c
	}
	c.refs++
	e.codeMu.Unlock()
	if ok {
		<-c.ready
		if c.err != nil {
			e.release(ctx, c)
			return nil, c.err
		}
		return &Module{code: c}, nil
	}
	err := e.compile(ctx, c, wasm)
	e.codeMu.Lock()
	c.err = err
	if err != nil && e.codes[digest] == c {
		// A failed compile is not cached: the same bytes are tried again
		// next time (the failure may have been a cancelled context).
		delete(e.codes, digest)
	}
	e.codeMu.Unlock()
	close(c.ready)
	if err != nil {
		e.release(ctx, c)
		return nil, err
	}
	return &Module{code: c}, nil
}

// Acquire returns a new reference to the compiled module for digest if the
// engine holds it, without its bytes.
func (e *Engine) Acquire(digest string) (*Module, bool) {
	e.codeMu.Lock()
	c, ok := e.codes[digest]
	if ok {
		c.refs++
	}
	e.codeMu.Unlock()
	if !ok {
		return nil, false
	}
	<-c.ready
	if c.err != nil {
		e.release(context.Background(), c)
		return nil, false
	}
	return &Module{code: c}, true
}

// release drops one reference to c, closing its code with the last.
func (e *Engine) release(ctx context.Context, c *code) error {
	e.codeMu.Lock()
	defer e.codeMu.Unlock()
	c.refs--
	if c.refs > 0 {
		return nil
	}
	if e.codes[c.Digest] == c {
		delete(e.codes, c.Digest)
	}
	if c.compiled != nil {
		return c.compiled.Close(ctx)
	}
	return nil
}

// Compiles reports how many times the engine has compiled a module: once
// per digest while any reference to it is open.
func (e *Engine) Compiles() int64 { return e.compiles.Load() }

// Compiled reports how many distinct modules the engine holds compiled.
func (e *Engine) Compiled() int {
	e.codeMu.Lock()
	defer e.codeMu.Unlock()
	return len(e.codes)
}

func (e *Engine) compile(ctx context.Context, c *code, wasm []byte) error {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return ErrClosed
	}
	e.compiles.Add(1)
	if err := checkBounds(wasm); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidModule, err)
	}
	metered, err := meter(wasm)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidModule, err)
	}
	cm, err := e.rt.CompileModule(ctx, metered)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidModule, err)
	}
	c.compiled = cm
	if err := e.check(ctx, c); err != nil {
		return err
	}
	return nil
}

func (e *Engine) check(ctx context.Context, m *code) error {
	cm := m.compiled
	for _, imp := range cm.ImportedFunctions() {
		mod, name, _ := imp.Import()
		switch mod {
		case abi.ImportModule, wasi_snapshot_preview1.ModuleName:
			if mod == abi.ImportModule && !knownImport[name] {
				return fmt.Errorf("%w: imports unknown host function %s.%s", ErrInvalidModule, mod, name)
			}
		default:
			return fmt.Errorf("%w: imports %s.%s; only %q and WASI are provided", ErrInvalidModule, mod, name, abi.ImportModule)
		}
	}
	exports := cm.ExportedFunctions()
	want := map[string][]api.ValueType{
		abi.ExportVersion:  nil,
		abi.ExportHandlers: nil,
		abi.ExportCall:     {api.ValueTypeI32, api.ValueTypeI32},
		abi.ExportFollow:   {api.ValueTypeI32},
		abi.ExportReceive:  {api.ValueTypeI32},
		abi.ExportEvent:    {api.ValueTypeI32},
		abi.ExportAlarm:    nil,
	}
	for _, name := range []string{abi.ExportVersion, abi.ExportCall} {
		if _, ok := exports[name]; !ok {
			return fmt.Errorf("%w: missing export %q (build with the SDK, which provides it)", ErrInvalidModule, name)
		}
	}
	for _, name := range []string{abi.ExportVersion, abi.ExportHandlers, abi.ExportCall, abi.ExportFollow, abi.ExportReceive, abi.ExportEvent, abi.ExportAlarm} {
		params := want[name]
		def, ok := exports[name]
		if !ok {
			continue
		}
		if !sameTypes(def.ParamTypes(), params) || !sameTypes(def.ResultTypes(), []api.ValueType{api.ValueTypeI32}) {
			return fmt.Errorf("%w: export %q has the wrong signature", ErrInvalidModule, name)
		}
		m.Exports = append(m.Exports, name)
	}
	// Instantiate once: runs _initialize under the budget and asks the module
	// its ABI version and handlers.
	inst, err := e.instantiate(ctx, &Module{code: m}, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidModule, err)
	}
	defer inst.Close(ctx)
	v, err := inst.callRaw(nil, inst.version)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidModule, abi.ExportVersion, err)
	}
	if v != abi.Version {
		return fmt.Errorf("%w: ABI version %d, this host speaks %d: rebuild with a matching SDK", ErrInvalidModule, v, abi.Version)
	}
	if f := inst.mod.ExportedFunction(abi.ExportHandlers); f != nil {
		h, err := inst.callRaw(nil, f)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidModule, abi.ExportHandlers, err)
		}
		m.Handlers = h
	} else {
		for bit, name := range optionalHandlers {
			if _, ok := exports[name]; ok {
				m.Handlers |= bit
			}
		}
	}
	for bit, name := range optionalHandlers {
		if _, ok := exports[name]; !ok {
			m.Handlers &^= bit
		}
	}
	return nil
}

// optionalHandlers names the export of each abi.Handler* bit.
var optionalHandlers = map[int32]string{
	abi.HandlerFollow: abi.ExportFollow, abi.HandlerReceive: abi.ExportReceive,
	abi.HandlerEvent: abi.ExportEvent, abi.HandlerAlarm: abi.ExportAlarm,
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type instKey struct{}

// Instantiate makes a fresh instance of m and runs its _initialize.
func (e *Engine) Instantiate(ctx context.Context, m *Module) (*Instance, error) {
	return e.InstantiateLimited(ctx, m, 0)
}

// InstantiateLimited is Instantiate with a memory limit of pages 64 KiB
// pages for this instance, below the engine's MemoryLimitPages (0 or more
// means the engine's): a tenant's limit. Past it memory.grow fails, which
// a guest sees as out of memory.
func (e *Engine) InstantiateLimited(ctx context.Context, m *Module, pages uint32) (*Instance, error) {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return nil, ErrClosed
	}
	return e.instantiate(ctx, m, pages)
}

// instantiate is InstantiateLimited with life held.
func (e *Engine) instantiate(ctx context.Context, m *Module, pages uint32) (*Instance, error) {
	base := context.Background()
	if pages > 0 && pages < e.cfg.MemoryLimitPages {
		for _, mem := range m.compiled.ExportedMemories() {
			if mem.Min() > pages {
				return nil, fmt.Errorf("%w: the module starts with %d memory pages, the limit is %d", ErrMemoryLimit, mem.Min(), pages)
			}
		}
		base = experimental.WithMemoryAllocator(base, cappedAllocator(uint64(pages)*65536))
	}
	// The budget starts once this start has a CPU's token, not while it
	// waits for one.
	select {
	case e.starts <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.stop:
		return nil, ErrClosed
	}
	defer func() { <-e.starts }()
	inst := &Instance{e: e, out: &tail{max: 4096}}
	// The instance's context lives as long as the instance; the watchdog
	// cancels it when a call overruns, which ends the host functions
	// waiting on it; the guest itself is stopped by its stop flag.
	ictx, cancel := context.WithCancel(context.WithValue(base, instKey{}, inst))
	inst.ctx, inst.cancel = ictx, cancel
	e.mu.Lock()
	e.live[inst] = struct{}{}
	e.mu.Unlock()

	mc := wazero.NewModuleConfig().
		WithName("").
		// The start functions run below, once the watchdog can stop them.
		WithStartFunctions().
		WithSysWalltime().
		WithSysNanotime().
		// A guest's sleep (WASI poll_oneoff, Go's time.Sleep) waits
		// without holding a CPU, and ends when the call's budget does.
		// wazero's default returns at once, and a Go guest spins.
		WithNanosleep(func(ns int64) { sleepCtx(ictx, time.Duration(ns)) }).
		WithRandSource(rand.Reader).
		WithStdout(inst.out).
		WithStderr(inst.out)
	mod, err := e.rt.InstantiateModule(ictx, m.compiled, mc)
	if err == nil {
		err = e.start(inst, mod)
		if err != nil {
			mod.Close(context.Background())
		}
	}
	if err != nil {
		inst.release()
		if inst.expired.Load() {
			return nil, fmt.Errorf("%w (%v)", ErrInitBudget, time.Duration(e.initBudget))
		}
		if e.halted.Load() {
			return nil, ErrClosed
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &TrapError{Message: "initialize: " + err.Error(), Output: inst.out.String()}
	}
	inst.mod = mod
	inst.module = m
	inst.version = mod.ExportedFunction(abi.ExportVersion)
	inst.call = mod.ExportedFunction(abi.ExportCall)
	if m.Has(abi.HandlerFollow) {
		inst.follow = mod.ExportedFunction(abi.ExportFollow)
	}
	if m.Has(abi.HandlerReceive) {
		inst.receive = mod.ExportedFunction(abi.ExportReceive)
	}
	if m.Has(abi.HandlerEvent) {
		inst.event = mod.ExportedFunction(abi.ExportEvent)
	}
	if m.Has(abi.HandlerAlarm) {
		inst.alarm = mod.ExportedFunction(abi.ExportAlarm)
	}
	return inst, nil
}

// start hands the watchdog the new instance's stop flag and runs its start
// function and _initialize under the init budget.
func (e *Engine) start(inst *Instance, mod api.Module) error {
	stop, ok := mod.ExportedGlobal(meterStop).(api.MutableGlobal)
	if !ok {
		return fmt.Errorf("the module has no %s global: it was not prepared by meter", meterStop)
	}
	e.mu.Lock()
	inst.stop = stop
	if e.halted.Load() {
		inst.halt()
	}
	e.mu.Unlock()
	inst.deadline.Store(e.now() + e.initBudget)
	defer inst.deadline.Store(0)
	for _, name := range []string{meterStart, "_initialize"} {
		if f := mod.ExportedFunction(name); f != nil {
			if _, err := f.Call(inst.ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 || ctx.Err() != nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// cappedAllocator backs linear memories that cannot grow past limit bytes.
func cappedAllocator(limit uint64) experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capacity, max uint64) experimental.LinearMemory {
		return &cappedMemory{limit: min(max, limit)}
	})
}

// cappedMemory is a linear memory with a byte limit: Reallocate past it
// returns nil, so memory.grow fails (returns -1) in the guest.
type cappedMemory struct {
	buf   []byte
	limit uint64
}

func (m *cappedMemory) Reallocate(size uint64) []byte {
	if size > m.limit && m.buf != nil {
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	// Grow with room, as append would, but never past the limit.
	nb := make([]byte, size, max(size, min(2*uint64(cap(m.buf)), m.limit)))
	copy(nb, m.buf)
	m.buf = nb
	return nb
}

func (m *cappedMemory) Free() { m.buf = nil }
