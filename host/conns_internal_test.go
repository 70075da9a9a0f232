package host

import (
	"context"
	"testing"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// conformance: D10 D12
func TestD10_InboxHolds256ThenRefuses(t *testing.T) {
	cfg := DefaultConfig()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &conn{
		inbox: make(chan *delivery.Item, cfg.Delivery.Inbox),
		ctrl:  make(chan []byte, 16),
		ctx:   ctx,
	}
	item := delivery.NewItem(abi.Event{Publisher: "p/1", Topic: "t", Seq: 1})
	for i := 0; i < 256; i++ {
		if !c.Offer(item) {
			t.Fatalf("item %d refused: the inbox holds 256", i+1)
		}
	}
	if c.Offer(item) {
		t.Fatal("the 257th item landed: the inbox must hold 256 and refuse more")
	}
	// The client is told it fell behind, once.
	if len(c.ctrl) != 1 {
		t.Fatalf("%d notices queued, want one behind notice", len(c.ctrl))
	}
	c.Offer(item)
	if len(c.ctrl) != 1 {
		t.Fatal("a second refusal queued another notice")
	}
}
