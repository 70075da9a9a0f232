package delivery

import (
	"encoding/binary"
	"errors"

	"github.com/durable-host/host/abi"
)

// The wire forms of deliveries between nodes: compact, length-prefixed, so a
// connection batch costs one encoding of its events per node.

var errWire = errors.New("delivery: malformed wire message")

// AppendConnBatch appends b's wire form to dst.
func AppendConnBatch(dst []byte, b *ConnBatch) []byte {
	dst = appendStr(dst, b.Publisher)
	dst = binary.AppendUvarint(dst, uint64(len(b.Events)))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i])
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Edges)))
	for _, e := range b.Edges {
		dst = binary.AppendVarint(dst, e.Edge)
		dst = appendStr(dst, e.Conn)
		dst = appendStr(dst, e.Topic)
		dst = binary.AppendUvarint(dst, e.Cursor)
		dst = appendStr(dst, e.Filter)
	}
	return dst
}

// DecodeConnBatch decodes a connection batch; payloads alias b.
func DecodeConnBatch(buf []byte) (*ConnBatch, error) {
	r := reader{b: buf}
	b := &ConnBatch{Publisher: r.str()}
	n := r.count()
	b.Events = make([]abi.Event, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		e := r.event()
		e.Publisher = b.Publisher
		b.Events = append(b.Events, e)
	}
	n = r.count()
	b.Edges = make([]ConnEdge, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		b.Edges = append(b.Edges, ConnEdge{Edge: r.varint(), Conn: r.str(), Topic: r.str(), Cursor: r.uvarint(), Filter: r.str()})
	}
	return b, r.done()
}

// AppendObjectDelivery appends d's wire form to dst.
func AppendObjectDelivery(dst []byte, d *ObjectDelivery) []byte {
	dst = appendStr(dst, d.Publisher)
	dst = appendStr(dst, d.Follower)
	dst = appendStr(dst, d.Topic)
	dst = appendStr(dst, d.Filter)
	dst = binary.AppendUvarint(dst, d.Through)
	if d.Range != nil {
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, d.Range.After)
		dst = binary.AppendUvarint(dst, d.Range.Through)
	} else {
		dst = append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(d.Events)))
	for i := range d.Events {
		dst = appendEvent(dst, &d.Events[i])
	}
	return dst
}

// DecodeObjectDelivery decodes an object delivery; payloads alias buf.
func DecodeObjectDelivery(buf []byte) (*ObjectDelivery, error) {
	r := reader{b: buf}
	d := &ObjectDelivery{Publisher: r.str(), Follower: r.str(), Topic: r.str(), Filter: r.str(), Through: r.uvarint()}
	if r.byte() == 1 {
		d.Range = &Range{After: r.uvarint(), Through: r.uvarint()}
	}
	n := r.count()
	for i := 0; i < n && r.err == nil; i++ {
		e := r.event()
		e.Publisher = d.Publisher
		d.Events = append(d.Events, e)
	}
	return d, r.done()
}

// AppendEvents appends a list of events (without publishers) to dst.
func AppendEvents(dst []byte, evs []abi.Event) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(evs)))
	for i := range evs {
		dst = appendEvent(dst, &evs[i])
	}
	return dst
}

// DecodeEvents decodes AppendEvents' output, setting each publisher.
func DecodeEvents(buf []byte, publisher string) ([]abi.Event, error) {
	r := reader{b: buf}
	n := r.count()
	out := make([]abi.Event, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		e := r.event()
		e.Publisher = publisher
		out = append(out, e)
	}
	return out, r.done()
}

func appendStr[T ~string | ~[]byte](dst []byte, s T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendEvent(dst []byte, e *abi.Event) []byte {
	dst = appendStr(dst, e.Topic)
	dst = binary.AppendUvarint(dst, e.Seq)
	dst = binary.AppendVarint(dst, e.Time)
	return appendStr(dst, e.Payload)
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errWire
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errWire
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a length that must fit in what is left.
func (r *reader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err = errWire
		return 0
	}
	return int(n)
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errWire
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.count()
	if r.err != nil {
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string { return string(r.bytes()) }

func (r *reader) event() abi.Event {
	return abi.Event{Topic: r.str(), Seq: r.uvarint(), Time: r.varint(), Payload: r.bytes()}
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = errWire
	}
	return r.err
}
