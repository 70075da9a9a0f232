package vmtest

import "bytes"

// A tiny WebAssembly assembler, for the module shapes the SDKs never
// produce (decoder bombs, bad imports, unbounded tables).

// LEB is v as an unsigned LEB128.
func LEB(v uint64) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

// Cat concatenates parts.
func Cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// Section is a section: its id, its size, its body.
func Section(id byte, body ...[]byte) []byte {
	b := Cat(body...)
	return Cat([]byte{id}, LEB(uint64(len(b))), b)
}

// Vec is a vector: its count, then its items.
func Vec(items ...[]byte) []byte {
	return Cat(append([][]byte{LEB(uint64(len(items)))}, items...)...)
}

// Name is a length-prefixed name.
func Name(s string) []byte { return Cat(LEB(uint64(len(s))), []byte(s)) }
