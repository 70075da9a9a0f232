package delivery

import (
	"encoding/binary"

	"github.com/durable-host/host/abi"
)

// The wire forms of deliveries between nodes: compact, length-prefixed, so a
// connection batch costs one encoding of its events per node.

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
	r := newReader(buf)
	b := &ConnBatch{Publisher: r.String()}
	n := r.Count()
	b.Events = make([]abi.Event, 0, n)
	for i := 0; i < n && r.Err() == nil; i++ {
		e := r.event()
		e.Publisher = b.Publisher
		b.Events = append(b.Events, e)
	}
	n = r.Count()
	b.Edges = make([]ConnEdge, 0, n)
	for i := 0; i < n && r.Err() == nil; i++ {
		b.Edges = append(b.Edges, ConnEdge{Edge: r.Varint(), Conn: r.String(), Topic: r.String(), Cursor: r.Uvarint(), Filter: r.String()})
	}
	return b, r.Done()
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
	r := newReader(buf)
	d := &ObjectDelivery{Publisher: r.String(), Follower: r.String(), Topic: r.String(), Filter: r.String(), Through: r.Uvarint()}
	if r.Byte() == 1 {
		d.Range = &Range{After: r.Uvarint(), Through: r.Uvarint()}
	}
	n := r.Count()
	for i := 0; i < n && r.Err() == nil; i++ {
		e := r.event()
		e.Publisher = d.Publisher
		d.Events = append(d.Events, e)
	}
	return d, r.Done()
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
	r := newReader(buf)
	n := r.Count()
	out := make([]abi.Event, 0, n)
	for i := 0; i < n && r.Err() == nil; i++ {
		e := r.event()
		e.Publisher = publisher
		out = append(out, e)
	}
	return out, r.Done()
}

func appendStr[T ~string | ~[]byte](dst []byte, s T) []byte { return abi.AppendBytes(dst, s) }

func appendEvent(dst []byte, e *abi.Event) []byte {
	dst = appendStr(dst, e.Topic)
	dst = binary.AppendUvarint(dst, e.Seq)
	dst = binary.AppendVarint(dst, e.Time)
	return appendStr(dst, e.Payload)
}

type reader struct{ *abi.Reader }

func newReader(b []byte) reader { return reader{abi.NewReader(b)} }

func (r reader) event() abi.Event {
	return abi.Event{Topic: r.String(), Seq: r.Uvarint(), Time: r.Varint(), Payload: r.Bytes()}
}
