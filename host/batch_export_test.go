package host

import (
	"context"
	"testing"
	"time"
)

// HoldObject activates id on n and holds its lock until release: calls
// made meanwhile queue at the object and run as batches once it is
// released. Batches take any call and may run as long as they need until
// the test ends.
func HoldObject(t testing.TB, n *Node, id ObjectID) (release func()) {
	t.Helper()
	return HoldObjectBatching(t, n, id, time.Hour)
}

// HoldObjectBatching is HoldObject with batches that stop growing after
// batchTime.
func HoldObjectBatching(t testing.TB, n *Node, id ObjectID, batchTime time.Duration) (release func()) {
	t.Helper()
	n.objects.env.batchTime, n.objects.env.batchedCall = batchTime, time.Hour
	return HoldObjectAsIs(t, n, id)
}

// HoldObjectAsIs is HoldObject with the node's own batch bounds.
func HoldObjectAsIs(t testing.TB, n *Node, id ObjectID) (release func()) {
	t.Helper()
	o, err := n.objects.acquire(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	return func() {
		o.unlock()
		n.objects.release(o)
	}
}

// QueuedCalls is how many calls wait at id's queue on n.
func QueuedCalls(n *Node, id ObjectID) int {
	o, err := n.objects.acquire(id)
	if err != nil {
		return 0
	}
	defer n.objects.release(o)
	return o.queued()
}
