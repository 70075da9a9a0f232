package delivery_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// wireNet carries connection batches as the node does: to another node
// encoded, decoded there and resolved against its edge copies; to itself
// as they are; sliced into inboxes that keep nothing.
type wireNet struct {
	*fakeNet
	mu     sync.Mutex
	copies map[string]*delivery.EdgeCopies
	boxes  map[string]*sbInbox
	bytes  int
}

func (n *wireNet) Connections(_ context.Context, node string, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	got := b
	if node != n.self {
		enc := delivery.AppendConnBatch(nil, b)
		var err error
		if got, err = delivery.DecodeConnBatch(enc); err != nil {
			return delivery.ConnResult{}, err
		}
		n.mu.Lock()
		n.bytes += len(enc)
		n.mu.Unlock()
	}
	n.mu.Lock()
	c := n.copies[node]
	if c == nil {
		c = delivery.NewEdgeCopies(delivery.DefaultEdgeCopies, delivery.DefaultEdgeCopyIdle, delivery.RealClock)
		n.copies[node] = c
	}
	n.mu.Unlock()
	return c.Slice(got, func(conn string) (delivery.Inbox, bool) {
		n.mu.Lock()
		defer n.mu.Unlock()
		in, ok := n.boxes[conn]
		return in, ok
	}), nil
}

// BenchmarkFanoutRound is one publish and the pump round that carries it
// to 5,000 watchers on 8 nodes (7 remote): the publisher's read of its
// edges, one batch per node encoded and decoded, each node's slice, and
// the record. The sockets' writes are not in it.
func BenchmarkFanoutRound(b *testing.B) {
	for _, watchers := range []int{500, 5000} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) {
			pb := newPub(b)
			net := &wireNet{fakeNet: newNet(), copies: map[string]*delivery.EdgeCopies{}, boxes: map[string]*sbInbox{}}
			for i := range 8 {
				net.live["N"+strconv.Itoa(i)] = true
			}
			for i := range watchers {
				node := "N" + strconv.Itoa(i%8)
				id := node + "." + strconv.Itoa(i)
				net.boxes[id] = &sbInbox{}
				pb.follow(b, abi.FollowerConnection, id, node, "messages", "")
			}
			net.self = "N0"
			p := delivery.NewPump(delivery.DefaultConfig(), net, net, &nopObs{}, slog.Default())
			round := func() {
				pb.publish(b, "messages", `{"author":"ann","text":"hello, fan-out"}`)
				if _, _, err := p.Round(context.Background(), pb); err != nil {
					b.Fatal(err)
				}
			}
			round()
			net.bytes = 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				round()
			}
			b.ReportMetric(float64(net.bytes)/float64(b.N), "wire-B/round")
		})
	}
}
