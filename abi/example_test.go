package abi_test

import (
	"fmt"

	"github.com/durable-host/host/abi"
)

// An event crosses the boundary as one encoded record: the host appends it,
// the guest (or the SDK for it) decodes it after input_read.
func ExampleAppendEvent() {
	b := abi.AppendEvent(nil, &abi.Event{Publisher: "chat/room1", Topic: "messages", Seq: 7, Time: 1700000000000000000, Payload: []byte(`{"text":"hi"}`)})
	e, err := abi.DecodeEvent(b)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s %s %d %s\n", e.Publisher, e.Topic, e.Seq, e.Payload)
	// Output: chat/room1 messages 7 {"text":"hi"}
}

// A follow hook gets the request encoded: who asks, on which topic, with
// what filter and params.
func ExampleDecodeFollowRequest() {
	b := abi.AppendFollowRequest(nil, &abi.FollowRequest{Publisher: "chat/room1", Topic: "messages", Kind: abi.FollowerConnection, Follower: "n-1.7", Params: []byte("key")})
	r, err := abi.DecodeFollowRequest(b)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Kind, r.Follower, r.Topic, string(r.Params))
	// Output: connection n-1.7 messages key
}

// A truncated record is an error, never a panic: the host decodes what a
// hostile guest hands it the same way.
func ExampleDecodeEvent_truncated() {
	b := abi.AppendEvent(nil, &abi.Event{Publisher: "chat/room1", Topic: "t", Seq: 1})
	_, err := abi.DecodeEvent(b[:len(b)-3])
	fmt.Println(err != nil)
	// Output: true
}
