package delivery_test

import (
	"reflect"
	"testing"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

func TestWireRoundTrip(t *testing.T) {
	b := &delivery.ConnBatch{Publisher: "chat/room1",
		Events: []abi.Event{{Publisher: "chat/room1", Topic: "m", Seq: 7, Time: -3, Payload: []byte(`{"a":1}`)}},
		Edges:  []delivery.ConnEdge{{Edge: 4, Conn: "n-1.9", Topic: "m", Cursor: 6, Filter: "a=1"}}}
	got, err := delivery.DecodeConnBatch(delivery.AppendConnBatch(nil, b))
	if err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("conn batch: %+v %v", got, err)
	}
	d := &delivery.ObjectDelivery{Publisher: "p/1", Follower: "f/1", Topic: "t", Filter: "x=y", Through: 9,
		Range: &delivery.Range{After: 2, Through: 9}}
	gd, err := delivery.DecodeObjectDelivery(delivery.AppendObjectDelivery(nil, d))
	if err != nil || !reflect.DeepEqual(gd, d) {
		t.Fatalf("object delivery: %+v %v", gd, err)
	}
	enc := delivery.AppendConnBatch(nil, b)
	for i := 0; i < len(enc); i++ {
		if _, err := delivery.DecodeConnBatch(enc[:i]); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
}

// A versioned batch (its changes, cursor and version after the edges)
// round-trips, and WireSize splits exactly its encoded length.
func TestWireVersionedConnBatch(t *testing.T) {
	for _, b := range []*delivery.ConnBatch{
		{Publisher: "chat/room1", Events: []abi.Event{{Publisher: "chat/room1", Topic: "m", Seq: 300, Time: 1 << 60, Payload: []byte("x")}},
			Edges: []delivery.ConnEdge{}, Cursor: 299,
			Set: delivery.SetVersion{Epoch: 1<<64 - 1, Session: 1 << 63, Base: 7, Version: 7}},
		{Publisher: "p/1", Events: []abi.Event{},
			Edges:   []delivery.ConnEdge{{Edge: -1, Conn: "n.1", Topic: "", Cursor: 1 << 40, Filter: "u=ann"}},
			Removed: []int64{3, -9, 1 << 62}, Cursor: 5,
			Set: delivery.SetVersion{Epoch: 2, Session: 3, Base: 4, Version: 5}},
		{Publisher: "p/1", Events: []abi.Event{}, Edges: []delivery.ConnEdge{}, Set: delivery.SetVersion{Session: 3, Version: 1}},
	} {
		enc := delivery.AppendConnBatch(nil, b)
		got, err := delivery.DecodeConnBatch(enc)
		if err != nil || !reflect.DeepEqual(got, b) {
			t.Fatalf("versioned batch: %+v %v, want %+v", got, err, b)
		}
		if ev, ed := b.WireSize(); ev+ed != len(enc) {
			t.Fatalf("WireSize %d+%d, encoded %d", ev, ed, len(enc))
		}
		for i := 0; i < len(enc); i++ {
			if _, err := delivery.DecodeConnBatch(enc[:i]); err == nil && i > 0 && !unversionedPrefix(b, enc[:i]) {
				t.Fatalf("truncated at %d of %d decoded", i, len(enc))
			}
		}
	}
}

// unversionedPrefix: a versioned batch cut right after its edges is a
// whole unversioned one, as nodes sent before versions.
func unversionedPrefix(b *delivery.ConnBatch, enc []byte) bool {
	c := *b
	c.Removed, c.Cursor, c.Set = nil, 0, delivery.SetVersion{}
	return len(enc) == len(delivery.AppendConnBatch(nil, &c))
}

// Malformed batches are errors, never panics or huge allocations.
func TestWireMalformedConnBatch(t *testing.T) {
	good := delivery.AppendConnBatch(nil, &delivery.ConnBatch{Publisher: "p/1", Cursor: 1, Set: delivery.SetVersion{Version: 1}})
	for name, b := range map[string][]byte{
		"empty":              {},
		"huge event count":   {3, 'p', '/', '1', 0xff, 0xff, 0xff, 0xff, 0x0f},
		"huge removed count": append(good[:len(good)-7:len(good)-7], 0xff, 0xff, 0xff, 0xff, 0x0f),
		"trailing byte":      append(good[:len(good):len(good)], 0),
		"cut version":        good[:len(good)-1],
		"bad varint":         append(good[:len(good)-1:len(good)-1], 0x80),
	} {
		if _, err := delivery.DecodeConnBatch(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecodeWire: hostile bytes from another node never panic the decoder.
func FuzzDecodeWire(f *testing.F) {
	f.Add(delivery.AppendConnBatch(nil, &delivery.ConnBatch{Publisher: "p/1", Events: []abi.Event{{Topic: "t", Seq: 1}}}))
	f.Add(delivery.AppendObjectDelivery(nil, &delivery.ObjectDelivery{Publisher: "p/1", Range: &delivery.Range{After: 1, Through: 2}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add(delivery.AppendConnBatch(nil, &delivery.ConnBatch{Publisher: "p/1", Edges: []delivery.ConnEdge{{Edge: 2, Conn: "c"}}, Removed: []int64{1}, Cursor: 3, Set: delivery.SetVersion{Epoch: 1, Session: 2, Base: 3, Version: 4}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		// What decodes encodes to as many bytes as WireSize says and
		// decodes the same again.
		if cb, err := delivery.DecodeConnBatch(b); err == nil {
			enc := delivery.AppendConnBatch(nil, cb)
			if ev, ed := cb.WireSize(); ev+ed != len(enc) {
				t.Fatalf("WireSize %d+%d, encoded %d", ev, ed, len(enc))
			}
			again, err := delivery.DecodeConnBatch(enc)
			if err != nil || !reflect.DeepEqual(again, cb) {
				t.Fatalf("re-decoded %+v %v, want %+v", again, err, cb)
			}
		}
		delivery.DecodeObjectDelivery(b)
		delivery.DecodeEvents(b, "p/1")
	})
}
