package vm

import (
	"errors"
	"fmt"
)

// Limits checkBounds holds a module to before wazero decodes it.
const (
	// maxLocals bounds the locals one function declares. Compilers emit
	// hundreds at most; wazero allocates them up front.
	maxLocals = 50_000
	// maxTableEntries bounds a table's size, initial and maximum: each entry
	// is 8 bytes per instance, and nothing else bounds tables the way the
	// page limit bounds memories.
	maxTableEntries = 1 << 20
)

// checkBounds walks the module's structure the way wazero's decoder will,
// and refuses a module whose counts or lengths promise more than the module
// holds. wazero sizes its slices and maps from those counts before reading
// the items, so a 15-byte module claiming 2^32-1 imports makes it allocate
// tens of GiB: a Go out-of-memory is fatal and takes the node down. Here
// every count must fit in the bytes that remain (each item takes at least
// one), and locals and tables have fixed ceilings. Instruction bodies are
// not decoded: wazero's validator reads those without sizing anything from
// them. Malformed modules that pass go on to wazero, which reports them.
func checkBounds(wasm []byte) error {
	mod, err := walkModule(wasm)
	if err != nil || !mod.growable {
		return err
	}
	// A table without a small maximum grows as far as table.grow asks:
	// 2^32 entries are 32 GiB. Go's linker never sets a maximum, so rather
	// than refuse the table, refuse table.grow on it.
	for _, body := range mod.bodies {
		grows, err := growsTable(body)
		if err != nil {
			return err
		}
		if grows {
			return boundsErr("table.grow on a table without a maximum of at most %d entries", maxTableEntries)
		}
	}
	return nil
}

// walkModule checks the counts of every section and returns what it
// learned.
func walkModule(wasm []byte) (*modScan, error) {
	r := &wreader{b: wasm, off: 8, mod: &modScan{}}
	for r.more() {
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			break
		}
		if uint64(size) > uint64(r.left()) {
			return nil, boundsErr("section %d claims %d bytes, %d remain", id, size, r.left())
		}
		s := &wreader{b: r.b[:r.off+int(size)], off: r.off, mod: r.mod}
		r.off += int(size)
		var err error
		switch id {
		case 0:
			err = s.custom()
		case 1:
			err = s.types()
		case 2:
			err = s.imports()
		case 4:
			err = s.vec("tables", func() error { return s.table() })
		case 6:
			err = s.vec("globals", func() error { s.valType(); s.byte(); return s.constExpr() })
		case 7:
			err = s.vec("exports", func() error { s.name("export"); s.byte(); s.u32(); return s.nameErr() })
		case 9:
			err = s.vec("element segments", func() error { return s.element() })
		case 10:
			err = s.vec("function bodies", func() error { return s.code() })
		case 11:
			err = s.vec("data segments", func() error { return s.data() })
		// Function, memory and tag items hold no counts of their own.
		case 3:
			err = s.count("functions")
		case 5:
			err = s.count("memories")
		case 13:
			err = s.count("tags")
		}
		if err == nil && errors.Is(s.err, errBounds) {
			err = s.err
		}
		if err != nil {
			return nil, err
		}
		// A section that is malformed inside is wazero's to report; its
		// size is known, so the walk goes on with the next.
	}
	return r.mod, nil
}

// modScan is what the walk learns about the whole module.
type modScan struct {
	// growable is set when a table has no maximum, or one over the limit.
	growable bool
	// bodies are the instructions of each function, after the locals.
	bodies [][]byte
}

var errBounds = errors.New("module exceeds the host's limits")

func boundsErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBounds, fmt.Sprintf(format, args...))
}

// wreader reads a wasm binary. Reading past the end sets err and yields
// zeros, so the walk can run on without checking every read; the callers
// stop at the first count that is out of bounds.
type wreader struct {
	b   []byte
	off int
	err error
	mod *modScan
}

var errShort = errors.New("truncated")

func (r *wreader) more() bool { return r.err == nil && r.off < len(r.b) }
func (r *wreader) left() int  { return len(r.b) - r.off }

func (r *wreader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.err = errShort
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

// leb reads an unsigned LEB128 of at most maxBytes bytes.
func (r *wreader) leb(maxBytes int) uint64 {
	var v uint64
	for i := 0; i < maxBytes; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v
		}
	}
	if r.err == nil {
		r.err = errShort
	}
	return 0
}

func (r *wreader) u32() uint32 { return uint32(r.leb(5)) }

func (r *wreader) skip(n uint64) {
	if r.err != nil {
		return
	}
	if n > uint64(r.left()) {
		r.err = errShort
		r.off = len(r.b)
		return
	}
	r.off += int(n)
}

// count reads a vector's count and checks it fits in what remains.
func (r *wreader) count(what string) error {
	n := r.u32()
	if r.err == nil && uint64(n) > uint64(r.left()) {
		return boundsErr("%d %s declared in %d bytes", n, what, r.left())
	}
	return nil
}

// vec reads a vector's count, checks it, and reads each item with item,
// stopping at the first error or malformed read.
func (r *wreader) vec(what string, item func() error) error {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(r.left()) {
		return boundsErr("%d %s declared in %d bytes", n, what, r.left())
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		if err := item(); err != nil {
			return err
		}
	}
	return nil
}

// name reads a length-prefixed byte string.
func (r *wreader) name(what string) []byte {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(r.left()) {
		r.err = boundsErr("%s name of %d bytes in %d", what, n, r.left())
		return nil
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}

// nameErr returns the bounds error name left, if any.
func (r *wreader) nameErr() error {
	if errors.Is(r.err, errBounds) {
		return r.err
	}
	return nil
}

func (r *wreader) custom() error {
	name := r.name("custom section")
	if err := r.nameErr(); err != nil || r.err != nil {
		return err
	}
	if string(name) != "name" {
		return nil
	}
	// The name section: wazero decodes subsections 0-2 and sizes maps from
	// their counts.
	for r.more() {
		sub := r.byte()
		size := r.u32()
		if r.err != nil {
			return nil
		}
		if uint64(size) > uint64(r.left()) {
			return boundsErr("name subsection %d claims %d bytes, %d remain", sub, size, r.left())
		}
		s := &wreader{b: r.b[:r.off+int(size)], off: r.off}
		r.off += int(size)
		var err error
		switch sub {
		case 0:
			s.name("module")
		case 1:
			err = s.vec("function names", func() error { s.u32(); s.name("function"); return s.nameErr() })
		case 2:
			err = s.vec("local name maps", func() error {
				s.u32()
				return s.vec("local names", func() error { s.u32(); s.name("local"); return s.nameErr() })
			})
		}
		if err == nil {
			err = s.nameErr()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *wreader) valTypes(what string) error {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(r.left()) {
		return boundsErr("%d %s types declared in %d bytes", n, what, r.left())
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		r.valType()
	}
	return nil
}

func (r *wreader) valType() {
	switch r.byte() {
	case 0x63, 0x64: // (ref null ht), (ref ht)
		r.leb(5)
	}
}

func (r *wreader) types() error {
	return r.vec("types", func() error {
		if r.byte() != 0x60 {
			r.err = errShort // wazero reports the form
			return nil
		}
		if err := r.valTypes("parameter"); err != nil {
			return err
		}
		return r.valTypes("result")
	})
}

func (r *wreader) imports() error {
	return r.vec("imports", func() error {
		r.name("import module")
		r.name("import")
		if err := r.nameErr(); err != nil {
			return err
		}
		switch r.byte() {
		case 0x00: // function
			r.u32()
		case 0x01: // table
			return r.table()
		case 0x02: // memory: bounded by the page limit
			r.limits()
		case 0x03: // global
			r.valType()
			r.byte()
		case 0x04: // tag
			r.byte()
			r.u32()
		}
		return nil
	})
}

// limits reads limits and returns min and max (max -1 when absent).
func (r *wreader) limits() (uint64, int64) {
	flag := r.byte()
	min := r.leb(10)
	max := int64(-1)
	if flag&0x01 != 0 {
		max = int64(r.leb(10) & (1<<62 - 1))
	}
	return min, max
}

func (r *wreader) table() error {
	r.valType()
	min, max := r.limits()
	if r.err != nil {
		return nil
	}
	if min > maxTableEntries {
		return boundsErr("a table of %d entries; the limit is %d", min, maxTableEntries)
	}
	if max < 0 || max > maxTableEntries {
		r.mod.growable = true
	}
	return nil
}

// constExpr skips a constant expression up to its end opcode. The opcodes
// are the ones constant expressions may hold.
func (r *wreader) constExpr() error {
	for r.err == nil {
		switch op := r.byte(); op {
		case 0x0b: // end
			return nil
		case 0x41, 0x23, 0xd2: // i32.const, global.get, ref.func
			r.leb(5)
		case 0x42: // i64.const
			r.leb(10)
		case 0x43:
			r.skip(4)
		case 0x44:
			r.skip(8)
		case 0xd0: // ref.null
			r.leb(5)
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended constants
		case 0xfd: // v128.const
			r.u32()
			r.skip(16)
		default:
			r.err = errShort // not a constant expression: wazero reports it
		}
	}
	return nil
}

func (r *wreader) element() error {
	flags := r.u32()
	if r.err != nil || flags > 7 {
		r.err = errShort
		return nil
	}
	if flags&0x02 != 0 && flags&0x01 == 0 { // explicit table index
		r.u32()
	}
	if flags&0x01 == 0 { // active: an offset
		if err := r.constExpr(); err != nil {
			return err
		}
	}
	if flags&0x03 != 0 { // elemkind or reftype
		r.valType()
	}
	if flags&0x04 == 0 {
		return r.vec("element function indices", func() error { r.u32(); return nil })
	}
	return r.vec("element expressions", r.constExpr)
}

func (r *wreader) code() error {
	size := r.u32()
	if r.err != nil {
		return nil
	}
	if uint64(size) > uint64(r.left()) {
		return boundsErr("a function body of %d bytes in %d", size, r.left())
	}
	body := &wreader{b: r.b[:r.off+int(size)], off: r.off}
	r.off += int(size)
	var locals uint64
	err := body.vec("local declarations", func() error {
		locals += uint64(body.u32())
		body.valType()
		if locals > maxLocals {
			return boundsErr("a function declares more than %d locals", maxLocals)
		}
		return nil
	})
	if err == nil && body.err != nil {
		// The table.grow check needs every body.
		return boundsErr("a function's locals cannot be read")
	}
	r.mod.bodies = append(r.mod.bodies, body.b[body.off:])
	return err
}

// growsTable reports whether a function body holds table.grow.
func growsTable(code []byte) (bool, error) {
	r := &wreader{b: code}
	for r.more() {
		op, sub, err := r.instr()
		if err != nil {
			return false, err
		}
		if op == 0xfc && sub == 15 {
			return true, nil
		}
	}
	return false, nil
}

// instr reads one instruction with its immediates and returns its opcode
// and, for the prefixed ones (0xfc, 0xfd), its sub-opcode. It decodes the
// instructions of WebAssembly 2.0 (the features the engine enables) to find
// opcode boundaries; an opcode it does not know is refused, since the walk
// cannot see past it and wazero would refuse it anyway.
func (r *wreader) instr() (op byte, sub uint32, err error) {
	op = r.byte()
	switch {
	case op <= 0x01, op == 0x05, op == 0x0b, op == 0x0f, op == 0x1a, op == 0x1b,
		op == 0xd1, op >= 0x45 && op <= 0xc4:
		// No immediates.
	case op >= 0x02 && op <= 0x04: // block, loop, if: a block type
		r.leb(5)
	case op == 0x0c, op == 0x0d, op == 0x10, op >= 0x20 && op <= 0x26, op == 0xd2:
		r.u32()
	case op == 0x0e: // br_table
		n := r.u32()
		if uint64(n) > uint64(r.left()) {
			return op, 0, boundsErr("br_table of %d labels in %d bytes", n, r.left())
		}
		for i := uint32(0); i <= n && r.err == nil; i++ {
			r.u32()
		}
	case op == 0x11: // call_indirect
		r.u32()
		r.u32()
	case op == 0x1c: // select with types
		n := r.u32()
		r.skip(uint64(n))
	case op >= 0x28 && op <= 0x3e: // loads and stores
		r.u32()
		r.u32()
	case op == 0x3f, op == 0x40:
		r.byte()
	case op == 0x41:
		r.leb(5)
	case op == 0x42:
		r.leb(10)
	case op == 0x43:
		r.skip(4)
	case op == 0x44:
		r.skip(8)
	case op == 0xd0: // ref.null
		r.leb(5)
	case op == 0xfc:
		switch sub = r.u32(); {
		case sub <= 7:
		case sub == 8: // memory.init
			r.u32()
			r.byte()
		case sub == 9, sub == 13, sub == 15, sub == 16, sub == 17:
			r.u32()
		case sub == 10, sub == 12, sub == 14:
			r.u32()
			r.u32()
		case sub == 11:
			r.byte()
		default:
			return op, sub, boundsErr("unknown instruction 0xfc %d", sub)
		}
	case op == 0xfd:
		switch sub = r.u32(); {
		case sub <= 11, sub == 92, sub == 93: // memory access
			r.u32()
			r.u32()
		case sub == 12, sub == 13: // v128.const, i8x16.shuffle
			r.skip(16)
		case sub >= 21 && sub <= 34: // lanes
			r.byte()
		case sub >= 84 && sub <= 91: // lane loads and stores
			r.u32()
			r.u32()
			r.byte()
		}
	default:
		return op, 0, boundsErr("unknown instruction 0x%02x", op)
	}
	if r.err != nil {
		return op, sub, boundsErr("a function body ends inside an instruction")
	}
	return op, sub, nil
}

func (r *wreader) data() error {
	flags := r.u32()
	switch flags {
	case 0:
		if err := r.constExpr(); err != nil {
			return err
		}
	case 1:
	case 2:
		r.u32()
		if err := r.constExpr(); err != nil {
			return err
		}
	default:
		r.err = errShort
		return nil
	}
	n := r.u32()
	if r.err == nil && uint64(n) > uint64(r.left()) {
		return boundsErr("a data segment of %d bytes in %d", n, r.left())
	}
	r.skip(uint64(n))
	return nil
}
