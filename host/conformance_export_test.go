package host

import (
	"context"
	"fmt"

	"github.com/coder/websocket"

	"github.com/durable-host/host/abi"
)

// Hooks for the conformance tests (package host_test) that must reach the
// node's own connection rather than build a stand-in.

// HoldConnWriter takes the write side of the node's WebSocket connection
// id, so the connection's writer blocks on its next frame while the rest of
// the node runs; release ends the hold (the client then sees one empty text
// message).
func HoldConnWriter(n *Node, id string) (release func(), err error) {
	n.conns.mu.RLock()
	c := n.conns.m[id]
	n.conns.mu.RUnlock()
	if c == nil {
		return nil, fmt.Errorf("no connection %s on node %s", id, n.id)
	}
	w, err := c.ws.Writer(context.Background(), websocket.MessageText)
	if err != nil {
		return nil, err
	}
	return func() { w.Close() }, nil
}

// ConnQueued is the number of items waiting in the inbox of the node's
// connection id (-1 when there is no such connection).
func ConnQueued(n *Node, id string) int {
	n.conns.mu.RLock()
	c := n.conns.m[id]
	n.conns.mu.RUnlock()
	if c == nil {
		return -1
	}
	return c.inbox.len()
}

// StreamAfter is one read of a stream subscription on node n: the reader
// handleStream gives the subscription, on whichever node holds object.
func StreamAfter(n *Node, object, topic string, after uint64, limit, maxBytes int) ([]abi.Event, error) {
	id, err := ParseObjectID(object)
	if err != nil {
		return nil, err
	}
	return streamReader{read: n.readStream, obj: id, topic: topic}.After(context.Background(), after, limit, maxBytes)
}

// HintListenerRegistered registers a stream subscription's hint listener
// for object on node n, as handleStream does, and reports whether the
// node's NATS server has the interest the moment Listen returns.
func HintListenerRegistered(n *Node, object string) (bool, error) {
	id, err := ParseObjectID(object)
	if err != nil {
		return false, err
	}
	if n.nats.srv == nil {
		return false, fmt.Errorf("node %s has no embedded NATS server", n.id)
	}
	subject := HintSubject(id)
	stop, err := natsHints{nc: n.nats.nc, subject: subject}.Listen(func() {})
	if err != nil {
		return false, err
	}
	defer stop()
	return n.nats.srv.GlobalAccount().SubscriptionInterest(subject), nil
}
