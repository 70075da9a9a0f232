package delivery

import (
	"encoding/binary"

	"github.com/durable-host/host/abi"
)

// The wire forms of deliveries between nodes: compact, length-prefixed, so a
// connection batch costs one encoding of its events per node.

// AppendConnBatch appends b's wire form to dst: the publisher and the
// events, then the edges, then (for a versioned batch, or one with a
// cursor) the removed ids, the cursor and the set's version. An
// unversioned batch without a cursor has no such trailer: its form is the
// one nodes used before edge sets were versioned.
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
	if !b.trailer() {
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Removed)))
	for _, id := range b.Removed {
		dst = binary.AppendVarint(dst, id)
	}
	dst = binary.AppendUvarint(dst, b.Cursor)
	for _, v := range [...]uint64{b.Set.Epoch, b.Set.Session, b.Set.Base, b.Set.Version} {
		dst = binary.AppendUvarint(dst, v)
	}
	return dst
}

func (b *ConnBatch) trailer() bool {
	return len(b.Removed) > 0 || b.Cursor != 0 || b.Set != SetVersion{}
}

// WireSize is the length of AppendConnBatch's output in two parts: the
// publisher and the events, which every node gets once, and the rest, the
// edges and their version, which a steady edge set keeps to a few bytes.
func (b *ConnBatch) WireSize() (events, edges int) {
	events = strLen(b.Publisher) + uvarintLen(uint64(len(b.Events)))
	for i := range b.Events {
		e := &b.Events[i]
		events += strLen(e.Topic) + uvarintLen(e.Seq) + varintLen(e.Time) + strLen(e.Payload)
	}
	edges = uvarintLen(uint64(len(b.Edges)))
	for _, e := range b.Edges {
		edges += varintLen(e.Edge) + strLen(e.Conn) + strLen(e.Topic) + uvarintLen(e.Cursor) + strLen(e.Filter)
	}
	if !b.trailer() {
		return events, edges
	}
	edges += uvarintLen(uint64(len(b.Removed)))
	for _, id := range b.Removed {
		edges += varintLen(id)
	}
	edges += uvarintLen(b.Cursor)
	for _, v := range [...]uint64{b.Set.Epoch, b.Set.Session, b.Set.Base, b.Set.Version} {
		edges += uvarintLen(v)
	}
	return events, edges
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

func varintLen(v int64) int { return uvarintLen(uint64(v<<1) ^ uint64(v>>63)) }

func strLen[T ~string | ~[]byte](s T) int { return uvarintLen(uint64(len(s))) + len(s) }

// DecodeConnBatch decodes a connection batch; payloads alias buf.
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
	if r.Err() == nil && r.Len() > 0 {
		if n = r.Count(); n > 0 {
			b.Removed = make([]int64, 0, n)
		}
		for i := 0; i < n && r.Err() == nil; i++ {
			b.Removed = append(b.Removed, r.Varint())
		}
		b.Cursor = r.Uvarint()
		b.Set = SetVersion{Epoch: r.Uvarint(), Session: r.Uvarint(), Base: r.Uvarint(), Version: r.Uvarint()}
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
