package host

import (
	"context"
	"sync"
	"sync/atomic"
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

// HoldSyncs makes every output gate's fsync on n wait until release is
// called, and counts them: synced is how many have begun.
func HoldSyncs(n *Node) (release func(), synced func() int64) {
	ch := make(chan struct{})
	var began atomic.Int64
	hook := func() {
		began.Add(1)
		<-ch
	}
	n.objects.env.syncHook.Store(&hook)
	var once sync.Once
	return func() {
		once.Do(func() {
			n.objects.env.syncHook.Store(nil)
			close(ch)
		})
	}, began.Load
}

// DurableCap is the output gate's cap on reads of id's log on n.
func DurableCap(n *Node, id ObjectID) (uint64, bool) { return n.objects.durableCap(id) }
