package abi_test

import (
	"reflect"
	"testing"

	"github.com/durable-host/host/abi"
)

func TestEncodingsRoundTrip(t *testing.T) {
	e := abi.Event{Publisher: "chat/room1", Topic: "messages", Seq: 1 << 40, Time: -1, Payload: []byte("hi")}
	got, err := abi.DecodeEvent(abi.AppendEvent(nil, &e))
	if err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("event %+v %v", got, err)
	}
	r := abi.FollowRequest{Publisher: "p/1", Topic: "t", Filter: "a=b", Kind: abi.FollowerObject, Follower: "f/1", Tenant: "acme", Params: []byte{0, 1}}
	gr, err := abi.DecodeFollowRequest(abi.AppendFollowRequest(nil, &r))
	if err != nil || !reflect.DeepEqual(gr, r) {
		t.Fatalf("follow request %+v %v", gr, err)
	}
	pairs := []abi.Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte{}}}
	gp, err := abi.DecodePairs(abi.AppendPairs(nil, pairs))
	if err != nil || len(gp) != 2 || string(gp[0].Key) != "a" || string(gp[1].Key) != "b" {
		t.Fatalf("pairs %+v %v", gp, err)
	}
	c := abi.CallRequest{Target: "inventory/sku42", Method: "reserve", Key: "order-7", Payload: []byte(`{"n":1}`)}
	gc, err := abi.DecodeCallRequest(abi.AppendCallRequest(nil, &c))
	if err != nil || !reflect.DeepEqual(gc, c) {
		t.Fatalf("call request %+v %v", gc, err)
	}
	ce := abi.CallError{Status: 508, Message: "call cycle"}
	gce, err := abi.DecodeCallError(abi.AppendCallError(nil, &ce))
	if err != nil || gce != ce {
		t.Fatalf("call error %+v %v", gce, err)
	}
	enc := abi.AppendEvent(nil, &e)
	for i := 0; i < len(enc); i++ {
		if _, err := abi.DecodeEvent(enc[:i]); err == nil {
			t.Fatalf("truncated event at %d decoded", i)
		}
	}
	if _, err := abi.DecodeEvent(append(enc, 0)); err == nil {
		t.Fatal("trailing bytes accepted")
	}
}

// FuzzDecode: whatever a guest hands the host, decoding never panics, and
// what decodes survives a round trip (varints need not be canonical).
func FuzzDecode(f *testing.F) {
	f.Add(abi.AppendEvent(nil, &abi.Event{Publisher: "p/1", Topic: "t", Seq: 3, Payload: []byte("x")}))
	f.Add(abi.AppendFollowRequest(nil, &abi.FollowRequest{Publisher: "p/1", Topic: "t", Kind: abi.FollowerConnection}))
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := abi.DecodeEvent(b); err == nil {
			again, err := abi.DecodeEvent(abi.AppendEvent(nil, &e))
			if err != nil || !reflect.DeepEqual(again, e) {
				t.Fatalf("event does not survive a round trip: %+v %v", again, err)
			}
		}
		abi.DecodeFollowRequest(b)
		abi.DecodePairs(b)
	})
}
