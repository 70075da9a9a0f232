package host

import (
	"testing"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// TestInboxFIFOBoundedAndShrinks checks the connection queue: items come
// out in the order they went in across growth and wrap-around, an offer
// past the bound is refused without losing what is queued, and an idle
// inbox gives its grown array back.
func TestInboxFIFOBoundedAndShrinks(t *testing.T) {
	item := func(seq uint64) *delivery.Item { return &delivery.Item{Event: abi.Event{Seq: seq}} }
	q := &inbox{max: 10}
	next, want := uint64(1), uint64(1)
	take := func(k int) {
		t.Helper()
		for range k {
			it := q.pop()
			if it == nil || it.Event.Seq != want {
				t.Fatalf("pop: got %v, want seq %d", it, want)
			}
			want++
		}
	}
	put := func(k int) {
		t.Helper()
		for range k {
			if !q.push(item(next)) {
				t.Fatalf("push %d refused with %d queued", next, q.len())
			}
			next++
		}
	}
	put(3)
	take(2) // head moves inside the small ring
	put(4)  // wraps, then grows while wrapped
	if len(q.buf) <= inboxSmall {
		t.Fatalf("did not grow: %d slots for %d items", len(q.buf), q.len())
	}
	put(5) // 10 queued: the bound
	if q.push(item(999)) {
		t.Fatal("an 11th item was taken by an inbox bounded at 10")
	}
	if q.len() != 10 {
		t.Fatalf("len %d after a refused push, want 10", q.len())
	}
	q.shrink() // not empty: keeps its items
	take(10)
	if q.pop() != nil {
		t.Fatal("pop from an empty inbox returned an item")
	}
	q.shrink()
	if len(q.buf) != inboxSmall {
		t.Fatalf("idle inbox kept %d slots", len(q.buf))
	}
	put(2)
	take(2)
}
