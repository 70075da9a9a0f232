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

// FuzzDecodeWire: hostile bytes from another node never panic the decoder.
func FuzzDecodeWire(f *testing.F) {
	f.Add(delivery.AppendConnBatch(nil, &delivery.ConnBatch{Publisher: "p/1", Events: []abi.Event{{Topic: "t", Seq: 1}}}))
	f.Add(delivery.AppendObjectDelivery(nil, &delivery.ObjectDelivery{Publisher: "p/1", Range: &delivery.Range{After: 1, Through: 2}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		delivery.DecodeConnBatch(b)
		delivery.DecodeObjectDelivery(b)
		delivery.DecodeEvents(b, "p/1")
	})
}
