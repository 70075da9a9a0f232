package vm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The budget's stop, compiled into the guest.
//
// A handler that loops forever must still end at its budget, and native
// code cannot be interrupted from outside: wazero's WithCloseOnContextDone
// answers that by leaving the compiled code for Go at every loop's back
// edge to look at the context. That exit costs about as much as the loop
// body of a small handler many times over: a warm Go counter call took
// 25-35 µs with it and 8-10 µs without.
//
// meter rewrites each module at compile time instead. It adds two globals,
// a countdown and a stop flag, and at each function's entry and each loop's
// header it counts down; once every meterEvery steps the count runs out and
// the guest
//
//   - calls memory.grow 0, which wazero serves in Go: the goroutine reaches
//     a point where Go's scheduler and garbage collector can stop it (they
//     cannot stop native code, so a guest that never left it would hold a
//     whole garbage collection, and with it the node, until it ended);
//   - traps (unreachable) if the stop flag is set: the watchdog sets it
//     when the call's budget ends.
//
// So a call is stopped within meterEvery loop iterations or function
// entries of its budget's end, and leaves native code at least that often.
// Counting function entries too bounds a guest that recurses without
// looping.
//
// What meter changes besides:
//   - a module without a memory gets one of no pages, for memory.grow;
//   - a start section is removed and its function exported as meterStart,
//     which the engine calls before _initialize: the watchdog can only
//     reach the stop flag once instantiation has returned the instance;
//   - custom sections named .debug_* are dropped: their code offsets would
//     no longer match.
//
// Function, global and type indices are unchanged: the globals are
// appended after the module's own.

const (
	// meterEvery is how many loop iterations and function entries run
	// between two visits to Go.
	meterEvery = 4096
	// meterStop is the export of the stop flag (an i32 global).
	meterStop = "durable-host.stop"
	// meterStart is the export of the module's start function, if it had
	// one.
	meterStart = "durable-host.start"
)

// A metered module may be at most maxMeteredGrowth times the size of the
// module as uploaded, plus meteredSlack for what every module gets. The
// examples grow by 3-16 %; a module of little but empty loops or
// functions (three bytes each, forty once counted) would grow over
// tenfold, and the size limit on uploads would no longer bound what the
// compiler is given.
const (
	maxMeteredGrowth = 2
	meteredSlack     = 64 << 10
)

// maxControlWork bounds the sum, over a module's function bodies, of each
// body's blocks, loops and ifs squared (once metered). wazero's compile
// time grows with the square of a function's control structures: 8,000
// loops in one function took a second to compile, 30,000 metered ones
// over ten minutes, from a 90 KB upload. The Go examples sum to 6.5-9.2
// million; at the bound a compile stays within some tens of seconds.
const maxControlWork = 500_000_000

// checkStructs is the ifs in one check (meterCheck).
const checkStructs = 2

// errMeter is a module meter could not rewrite.
var errMeter = errors.New("module cannot be prepared")

// sectionOrder is each known section's rank in a module.
var sectionOrder = map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}

type wsection struct {
	id   byte
	body []byte
}

// meter returns wasm rewritten as described above. wasm has passed
// checkBounds; a module it cannot read is refused with errMeter.
func meter(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 {
		return nil, fmt.Errorf("%w: too short", errMeter)
	}
	var secs []wsection
	r := &wreader{b: wasm, off: 8}
	for r.more() {
		id := r.byte()
		size := r.u32()
		if r.err != nil || uint64(size) > uint64(r.left()) {
			return nil, fmt.Errorf("%w: a section runs past the end", errMeter)
		}
		secs = append(secs, wsection{id, r.b[r.off : r.off+int(size)]})
		r.off += int(size)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", errMeter, r.err)
	}

	var (
		importedGlobals, definedGlobals uint32
		hasMemory                       bool
		start                           = -1
	)
	exportNames := map[string]bool{}
	for _, s := range secs {
		sr := &wreader{b: s.body}
		switch s.id {
		case 2:
			n := sr.u32()
			for i := uint32(0); i < n && sr.err == nil; i++ {
				sr.name("import module")
				sr.name("import")
				switch sr.byte() {
				case 0x00:
					sr.u32()
				case 0x01:
					sr.valType()
					sr.limits()
				case 0x02:
					sr.limits()
					hasMemory = true
				case 0x03:
					sr.valType()
					sr.byte()
					importedGlobals++
				case 0x04:
					sr.byte()
					sr.u32()
				default:
					sr.err = errShort
				}
			}
		case 5:
			hasMemory = hasMemory || sr.u32() > 0
		case 6:
			definedGlobals = sr.u32()
		case 7:
			n := sr.u32()
			for i := uint32(0); i < n && sr.err == nil; i++ {
				exportNames[string(sr.name("export"))] = true
				sr.byte()
				sr.u32()
			}
		case 8:
			start = int(sr.u32())
		}
		if sr.err != nil {
			return nil, fmt.Errorf("%w: section %d: %v", errMeter, s.id, sr.err)
		}
	}
	for _, name := range []string{meterStop, meterStart} {
		if exportNames[name] {
			return nil, fmt.Errorf("%w: the export name %q is the host's own", errMeter, name)
		}
	}
	fuel := importedGlobals + definedGlobals
	stop := fuel + 1
	check := meterCheck(fuel, stop)

	// The sections meter adds, each emitted before the first section
	// ranked after it, or at the end.
	type added struct {
		id   byte
		body []byte
		done bool
	}
	globals := join(meterGlobal(meterEvery), meterGlobal(0))
	exports := join(appendName(nil, meterStop), []byte{0x03}, appendU32(nil, stop))
	if start >= 0 {
		exports = join(exports, appendName(nil, meterStart), []byte{0x00}, appendU32(nil, uint32(start)))
	}
	adds := []*added{
		{id: 5, body: []byte{0x01, 0x01, 0x00, 0x00}, done: hasMemory}, // one memory, 0 pages, max 0
		{id: 6, body: join(appendU32(nil, 2), globals)},
		{id: 7, body: join(appendU32(nil, 1+boolU32(start >= 0)), exports)},
	}

	out := make([]byte, 0, len(wasm)+len(wasm)/8+64)
	out = append(out, wasm[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	emitAdds := func(before int) {
		for _, a := range adds {
			if !a.done && sectionOrder[a.id] < before {
				emit(a.id, a.body)
				a.done = true
			}
		}
	}
	for _, s := range secs {
		rank, known := sectionOrder[s.id]
		if known {
			emitAdds(rank)
		}
		switch s.id {
		case 0:
			name := (&wreader{b: s.body}).name("custom section")
			if strings.HasPrefix(string(name), ".debug_") {
				continue
			}
			emit(s.id, s.body)
		case 6:
			sr := &wreader{b: s.body}
			n := sr.u32()
			emit(6, join(appendU32(nil, n+2), s.body[sr.off:], globals))
			adds[1].done = true
		case 7:
			sr := &wreader{b: s.body}
			n := sr.u32()
			emit(7, join(appendU32(nil, n+1+boolU32(start >= 0)), s.body[sr.off:], exports))
			adds[2].done = true
		case 5:
			if !adds[0].done { // a memory section of none
				emit(5, adds[0].body)
				adds[0].done = true
				continue
			}
			emit(s.id, s.body)
		case 8:
			// Exported as meterStart instead.
		case 10:
			body, err := meterCode(s.body, check, fuel)
			if err != nil {
				return nil, err
			}
			emit(10, body)
		default:
			emit(s.id, s.body)
		}
	}
	emitAdds(1 << 30)
	if len(out) > maxMeteredGrowth*len(wasm)+meteredSlack {
		return nil, fmt.Errorf("%w: %d bytes hold too many functions and loops: counting them would make the module %d bytes", errMeter, len(wasm), len(out))
	}
	return out, nil
}

// meterCode rewrites the code section: check at each function's entry and
// after each loop instruction. globals is the module's own count of
// globals: an instruction naming one past it would be invalid in the
// module as uploaded, but name meter's countdown or stop flag once they
// are added, so it is refused here (a guest that cleared its stop flag
// would never end).
func meterCode(sec []byte, check []byte, globals uint32) ([]byte, error) {
	r := &wreader{b: sec}
	n := r.u32()
	out := appendU32(make([]byte, 0, len(sec)+len(sec)/4), n)
	var body []byte
	var work uint64 // the sum over bodies of their blocks, loops and ifs squared
	for i := uint32(0); i < n; i++ {
		size := r.u32()
		if r.err != nil || uint64(size) > uint64(r.left()) {
			return nil, fmt.Errorf("%w: function body %d runs past its section", errMeter, i)
		}
		b := &wreader{b: r.b[r.off : r.off+int(size)]}
		r.off += int(size)
		locals := b.u32()
		for j := uint32(0); j < locals && b.err == nil; j++ {
			b.u32()
			b.valType()
		}
		if b.err != nil {
			return nil, fmt.Errorf("%w: function body %d: locals", errMeter, i)
		}
		body = append(body[:0], b.b[:b.off]...)
		body = append(body, check...)
		from := b.off
		structs := uint64(checkStructs)
		for b.more() {
			at := b.off
			op, _, err := b.instr()
			if err != nil {
				return nil, fmt.Errorf("%w: function body %d: %v", errMeter, i, err)
			}
			if op == 0x23 || op == 0x24 { // global.get, global.set
				if g := (&wreader{b: b.b[at+1 : b.off]}).u32(); g >= globals {
					return nil, fmt.Errorf("%w: function body %d uses global %d; the module has %d", errMeter, i, g, globals)
				}
			}
			if op >= 0x02 && op <= 0x04 { // block, loop, if
				structs++
			}
			if op == 0x03 { // loop: count each time round
				body = append(body, b.b[from:b.off]...)
				body = append(body, check...)
				from = b.off
				structs += checkStructs
			}
		}
		if work += structs * structs; work > maxControlWork {
			return nil, fmt.Errorf("%w: its functions hold too many blocks, loops and ifs for the time compiling them takes (by function %d, the sum of their counts squared is past %d)", errMeter, i, uint64(maxControlWork))
		}
		body = append(body, b.b[from:]...)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	if r.err != nil || r.left() != 0 {
		return nil, fmt.Errorf("%w: the code section holds more than its bodies", errMeter)
	}
	return out, nil
}

// meterCheck is the instructions run at each entry and loop header:
//
//	global.set $fuel (i32.sub (global.get $fuel) (i32.const 1))
//	if (i32.eqz (global.get $fuel))
//	  drop (memory.grow (i32.const 0))   ;; a visit to Go
//	  if (global.get $stop) unreachable
//	  global.set $fuel (i32.const meterEvery)
//	end
func meterCheck(fuel, stop uint32) []byte {
	g := appendU32(nil, fuel)
	s := appendU32(nil, stop)
	c := join([]byte{0x23}, g, []byte{0x41, 0x01, 0x6b, 0x24}, g)
	c = join(c, []byte{0x23}, g, []byte{0x45, 0x04, 0x40})
	c = append(c, 0x41, 0x00, 0x40, 0x00, 0x1a)
	c = join(c, []byte{0x23}, s, []byte{0x04, 0x40, 0x00, 0x0b})
	c = append(c, 0x41)
	c = appendS32(c, meterEvery)
	c = join(c, []byte{0x24}, g, []byte{0x0b})
	return c
}

// meterGlobal is a mutable i32 global's entry with initial value v.
func meterGlobal(v int32) []byte {
	return append(appendS32([]byte{0x7f, 0x01, 0x41}, v), 0x0b)
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func join(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func appendName(b []byte, s string) []byte {
	return append(appendU32(b, uint32(len(s))), s...)
}

// appendU32 appends v as an unsigned LEB128, which is Go's uvarint.
func appendU32(b []byte, v uint32) []byte { return binary.AppendUvarint(b, uint64(v)) }

func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
