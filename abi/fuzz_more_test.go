package abi_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/durable-host/host/abi"
)

// FuzzDecode (encoding_test.go) holds DecodeEvent to a round trip and only
// checks that the other decoders never panic; the targets here hold them to
// a round trip too, and bound what they decode by the input's size.

// FuzzDecodeFollowRequest: a follow request a guest hands the host decodes
// without panicking, or not at all; what decodes survives a round trip and
// holds no more bytes than it came in.
func FuzzDecodeFollowRequest(f *testing.F) {
	f.Add(abi.AppendFollowRequest(nil, &abi.FollowRequest{Publisher: "p/1", Topic: "t", Filter: "a=1", Kind: abi.FollowerObject, Follower: "f/1", Tenant: "acme", Params: []byte("key")}))
	f.Add(abi.AppendFollowRequest(nil, &abi.FollowRequest{Kind: abi.FollowerConnection}))
	f.Add([]byte{0x03, 'p', '/', '1', 0x01, 't', 0x00, 0xff, 0x00, 0x00, 0x00})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := abi.DecodeFollowRequest(b)
		if err != nil {
			return
		}
		if n := len(r.Publisher) + len(r.Topic) + len(r.Filter) + len(r.Follower) + len(r.Tenant) + len(r.Params); n > len(b) {
			t.Fatalf("%d bytes decoded into %d", len(b), n)
		}
		again, err := abi.DecodeFollowRequest(abi.AppendFollowRequest(nil, &r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("follow request does not survive a round trip: %+v → %+v %v", r, again, err)
		}
	})
}

// FuzzDecodePairs: a scan result decodes without panicking, or not at all;
// what decodes has at most one pair per two input bytes (no amplification)
// and re-encodes to the same bytes (lengths need not be canonical, so
// compare decoded forms).
func FuzzDecodePairs(f *testing.F) {
	f.Add(abi.AppendPairs(nil, []abi.Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: nil}}))
	f.Add([]byte{})
	f.Add([]byte{0x00, 0x00, 0x00})
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, err := abi.DecodePairs(b)
		if err != nil {
			return
		}
		if 2*len(pairs) > len(b) {
			t.Fatalf("%d bytes decoded into %d pairs", len(b), len(pairs))
		}
		again, err := abi.DecodePairs(abi.AppendPairs(nil, pairs))
		if err != nil || len(again) != len(pairs) {
			t.Fatalf("pairs do not survive a round trip: %d → %d %v", len(pairs), len(again), err)
		}
		for i := range pairs {
			if !bytes.Equal(again[i].Key, pairs[i].Key) || !bytes.Equal(again[i].Value, pairs[i].Value) {
				t.Fatalf("pair %d: %q=%q → %q=%q", i, pairs[i].Key, pairs[i].Value, again[i].Key, again[i].Value)
			}
		}
	})
}

// FuzzReader: any sequence of reads on any bytes never panics; the first
// error sticks, reads after it return zero values, and what is left never
// grows.
func FuzzReader(f *testing.F) {
	f.Add([]byte{0x01, 'a', 0x02, 0x7f}, []byte{4, 0, 1, 3, 2, 5})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, []byte{0, 1, 4})
	f.Fuzz(func(t *testing.T, b, ops []byte) {
		d := abi.NewReader(b)
		left := d.Len()
		var failed error
		for _, op := range ops {
			var zero bool
			switch op % 6 {
			case 0:
				zero = d.Uvarint() == 0
			case 1:
				zero = d.Varint() == 0
			case 2:
				zero = d.Byte() == 0
			case 3:
				zero = d.Count() == 0
			case 4:
				zero = d.Bytes() == nil
			case 5:
				zero = d.String() == ""
			}
			if failed != nil && (!zero || d.Err() != failed) {
				t.Fatalf("a read after the error %v returned a value or changed the error to %v", failed, d.Err())
			}
			if failed == nil {
				failed = d.Err()
			}
			if d.Len() > left || d.Len() < 0 {
				t.Fatalf("%d bytes left after %d", d.Len(), left)
			}
			left = d.Len()
		}
		if err := d.Done(); err == nil && d.Len() != 0 {
			t.Fatal("Done accepted leftover bytes")
		}
	})
}

// FuzzDecodeCallRequest: a call request a guest hands the host decodes
// without panicking, or not at all; what decodes survives a round trip.
func FuzzDecodeCallRequest(f *testing.F) {
	f.Add(abi.AppendCallRequest(nil, &abi.CallRequest{Target: "inventory/sku42", Method: "reserve", Key: "k", Payload: []byte("{}")}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := abi.DecodeCallRequest(b)
		if err != nil {
			return
		}
		if n := len(r.Target) + len(r.Method) + len(r.Key) + len(r.Payload); n > len(b) {
			t.Fatalf("%d bytes decoded into %d", len(b), n)
		}
		again, err := abi.DecodeCallRequest(abi.AppendCallRequest(nil, &r))
		if err != nil || again.Target != r.Target || again.Method != r.Method || again.Key != r.Key || string(again.Payload) != string(r.Payload) {
			t.Fatalf("call request does not survive a round trip: %+v → %+v %v", r, again, err)
		}
	})
}
