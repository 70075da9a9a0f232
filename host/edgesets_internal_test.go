package host

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// A node of the version before versioned edge sets refuses a versioned
// connection batch as a bad request (its decoder wants nothing after the
// edges): the transport reports that as delivery.ErrUnversioned, so the
// pump sends it the unversioned form; an unversioned batch it takes.
func TestConnectionsToAnOldNodeAreUnversioned(t *testing.T) {
	t.Parallel()
	n := layerNode(t)
	const old = "n-old"
	sub, err := n.nats.nc.Subscribe(nodeSubject(old, opConns.name), func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		b, err := delivery.DecodeConnBatch(m.Data)
		bare := *b
		bare.Removed, bare.Cursor, bare.Set = nil, 0, delivery.SetVersion{}
		if err != nil || len(delivery.AppendConnBatch(nil, &bare)) != len(m.Data) {
			reply.Header.Set(hdrStatus, "400")
			reply.Header.Set(hdrCode, codeBadRequest)
			reply.Header.Set(hdrError, "bad request: conns request: abi: malformed record")
			reply.Data = []byte(codeBadRequest)
		} else {
			reply.Header.Set(hdrStatus, "200")
			reply.Data = []byte(`{"gone":["c1"]}`)
		}
		m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	tr := remoteTransport{n}
	ctx := context.Background()
	batch := delivery.ConnBatch{Publisher: "chat/room1", Events: []abi.Event{{Topic: "m", Seq: 2}},
		Edges: []delivery.ConnEdge{{Edge: 1, Conn: "c1", Topic: "m", Cursor: 1}}}
	versioned := batch
	versioned.Cursor, versioned.Set = 1, delivery.SetVersion{Session: 9, Version: 1}
	if _, err := tr.Connections(ctx, old, &versioned); !errors.Is(err, delivery.ErrUnversioned) {
		t.Fatalf("a versioned batch to an old node: %v, want ErrUnversioned", err)
	}
	res, err := tr.Connections(ctx, old, &batch)
	if err != nil || len(res.Gone) != 1 {
		t.Fatalf("an unversioned batch to an old node: %+v %v", res, err)
	}
}
