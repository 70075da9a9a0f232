package abi

import (
	"encoding/binary"
	"errors"
)

// ErrMalformed is returned when bytes do not decode as the record asked for.
var ErrMalformed = errors.New("abi: malformed record")

// Event is one published event as handed to receive and event exports.
type Event struct {
	Publisher string // "program/id"
	Topic     string
	Seq       uint64 // ascends per publisher, from 1
	Time      int64  // Unix nanoseconds at publish
	Payload   []byte
}

// FollowerKind says what kind of follower an edge leads to.
type FollowerKind uint8

// Follower kinds.
const (
	FollowerConnection FollowerKind = 1
	FollowerObject     FollowerKind = 2
)

func (k FollowerKind) String() string {
	switch k {
	case FollowerConnection:
		return "connection"
	case FollowerObject:
		return "object"
	}
	return "unknown"
}

// FollowRequest asks a publisher to admit a follower. The publisher's follow
// hook receives it and approves (StatusOK) or refuses (StatusRefused, reply =
// reason).
type FollowRequest struct {
	Publisher string // "program/id" followed
	Topic     string
	Filter    string // see the delivery package for its syntax; "" matches all
	Kind      FollowerKind
	Follower  string // "program/id" for objects, the connection id for connections
	Tenant    string // the follower's tenant ("" when tenancy is off)
	Params    []byte // what the follower presents (a room key, a token ...)
}

// Pair is one key/value of a state scan.
type Pair struct {
	Key, Value []byte
}

// AppendEvent appends e's encoding to dst.
func AppendEvent(dst []byte, e *Event) []byte {
	dst = appendBytes(dst, e.Publisher)
	dst = appendBytes(dst, e.Topic)
	dst = binary.AppendUvarint(dst, e.Seq)
	dst = binary.AppendVarint(dst, e.Time)
	return appendBytes(dst, e.Payload)
}

// DecodeEvent decodes an event. Payload aliases b.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	d := decoder{b: b}
	e.Publisher = string(d.bytes())
	e.Topic = string(d.bytes())
	e.Seq = d.uvarint()
	e.Time = d.varint()
	e.Payload = d.bytes()
	return e, d.done()
}

// AppendFollowRequest appends r's encoding to dst.
func AppendFollowRequest(dst []byte, r *FollowRequest) []byte {
	dst = appendBytes(dst, r.Publisher)
	dst = appendBytes(dst, r.Topic)
	dst = appendBytes(dst, r.Filter)
	dst = append(dst, byte(r.Kind))
	dst = appendBytes(dst, r.Follower)
	dst = appendBytes(dst, r.Tenant)
	return appendBytes(dst, r.Params)
}

// DecodeFollowRequest decodes a follow request. Params aliases b.
func DecodeFollowRequest(b []byte) (FollowRequest, error) {
	var r FollowRequest
	d := decoder{b: b}
	r.Publisher = string(d.bytes())
	r.Topic = string(d.bytes())
	r.Filter = string(d.bytes())
	r.Kind = FollowerKind(d.byte())
	r.Follower = string(d.bytes())
	r.Tenant = string(d.bytes())
	r.Params = d.bytes()
	return r, d.done()
}

// AppendPairs appends the encoding of a state scan result: each pair as two
// length-prefixed byte strings.
func AppendPairs(dst []byte, pairs []Pair) []byte {
	for i := range pairs {
		dst = appendBytes(dst, pairs[i].Key)
		dst = appendBytes(dst, pairs[i].Value)
	}
	return dst
}

// DecodePairs decodes a state scan result. Keys and values alias b.
func DecodePairs(b []byte) ([]Pair, error) {
	var out []Pair
	d := decoder{b: b}
	for d.err == nil && len(d.b) > 0 {
		k := d.bytes()
		v := d.bytes()
		out = append(out, Pair{Key: k, Value: v})
	}
	return out, d.done()
}

func appendBytes[T ~string | ~[]byte](dst []byte, s T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrMalformed
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = ErrMalformed
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = ErrMalformed
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = ErrMalformed
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = ErrMalformed
	}
	return d.err
}
