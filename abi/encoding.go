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

// CallRequest is an object's call of another object's method
// (ImportCall).
type CallRequest struct {
	Target string // "program/id" of the callee, in the caller's tenant
	Method string
	// Key, when set, makes the call once in effect: the callee records
	// it with the reply, and a call with a key already recorded gets that
	// reply without the method running again. Empty in a receive handler
	// means a key derived from the event and the call's index in the
	// handler.
	Key     string
	Payload []byte
}

// CallError is a failed object call as the caller sees it: the HTTP
// status the same failure has over the API (422 the callee's own error,
// 404 no such object or method, 508 a cycle or a chain too deep, 504 out
// of budget, 503 unavailable ...) and its message.
type CallError struct {
	Status  int
	Message string
}

func (e *CallError) Error() string { return e.Message }

// AppendCallRequest appends r's encoding to dst.
func AppendCallRequest(dst []byte, r *CallRequest) []byte {
	dst = appendBytes(dst, r.Target)
	dst = appendBytes(dst, r.Method)
	dst = appendBytes(dst, r.Key)
	return appendBytes(dst, r.Payload)
}

// DecodeCallRequest decodes a call request. Payload aliases b.
func DecodeCallRequest(b []byte) (CallRequest, error) {
	var r CallRequest
	d := NewReader(b)
	r.Target = d.String()
	r.Method = d.String()
	r.Key = d.String()
	r.Payload = d.Bytes()
	return r, d.Done()
}

// AppendCallError appends e's encoding to dst.
func AppendCallError(dst []byte, e *CallError) []byte {
	dst = binary.AppendUvarint(dst, uint64(e.Status))
	return appendBytes(dst, e.Message)
}

// DecodeCallError decodes a call error.
func DecodeCallError(b []byte) (CallError, error) {
	d := NewReader(b)
	e := CallError{Status: int(d.Uvarint()), Message: d.String()}
	return e, d.Done()
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
	d := NewReader(b)
	e.Publisher = string(d.Bytes())
	e.Topic = string(d.Bytes())
	e.Seq = d.Uvarint()
	e.Time = d.Varint()
	e.Payload = d.Bytes()
	return e, d.Done()
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
	d := NewReader(b)
	r.Publisher = string(d.Bytes())
	r.Topic = string(d.Bytes())
	r.Filter = string(d.Bytes())
	r.Kind = FollowerKind(d.Byte())
	r.Follower = string(d.Bytes())
	r.Tenant = string(d.Bytes())
	r.Params = d.Bytes()
	return r, d.Done()
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
	d := NewReader(b)
	for d.Err() == nil && d.Len() > 0 {
		k := d.Bytes()
		v := d.Bytes()
		out = append(out, Pair{Key: k, Value: v})
	}
	return out, d.Done()
}

// AppendBytes appends s as a length-prefixed byte string, the unit of every
// encoding here.
func AppendBytes[T ~string | ~[]byte](dst []byte, s T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes[T ~string | ~[]byte](dst []byte, s T) []byte { return AppendBytes(dst, s) }

// Reader decodes the units of these encodings; the first malformed one
// sticks as its error (ErrMalformed) and later reads return zero values.
type Reader struct {
	b   []byte
	err error
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Uvarint reads an unsigned varint.
func (d *Reader) Uvarint() uint64 {
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

// Varint reads a signed varint.
func (d *Reader) Varint() int64 {
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

// Byte reads one byte.
func (d *Reader) Byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = ErrMalformed
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// Count reads a length that must fit in what is left (a count of items of
// at least a byte each).
func (d *Reader) Count() int {
	n := d.Uvarint()
	if n > uint64(len(d.b)) {
		d.err = ErrMalformed
		return 0
	}
	return int(n)
}

// Bytes reads a length-prefixed byte string; it aliases the input.
func (d *Reader) Bytes() []byte {
	n := d.Count()
	if d.err != nil {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// String reads a length-prefixed string.
func (d *Reader) String() string { return string(d.Bytes()) }

// Done reports the first error, or ErrMalformed if bytes are left over.
func (d *Reader) Done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = ErrMalformed
	}
	return d.err
}

// Err reports the first error so far.
func (d *Reader) Err() error { return d.err }

// Len reports how many bytes are left.
func (d *Reader) Len() int { return len(d.b) }
