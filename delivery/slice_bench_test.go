package delivery_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// sbInbox stands in for a connection's inbox: Offer keeps the item, as a
// channel send would, without allocating.
type sbInbox struct {
	last *delivery.Item
	n    int
}

func (i *sbInbox) Offer(it *delivery.Item) bool {
	i.last = it
	i.n++
	return true
}

// BenchmarkFanoutSlice is the receiving node's half of one connection batch
// to 5,000 local sockets: delivery.Slice over one event beside 5,000 edges,
// with a lookup shaped like the node's (a map under a read lock), and the
// forward envelope encoded by NewItem. Per-socket figures divide by the
// edges; the envelope must be encoded once per event, not once per socket.
func BenchmarkFanoutSlice(b *testing.B) {
	for _, edges := range []int{1, 100, 5000} {
		b.Run(fmt.Sprintf("edges=%d", edges), func(b *testing.B) {
			var mu sync.RWMutex
			inboxes := make(map[string]*sbInbox, edges)
			batch := &delivery.ConnBatch{Publisher: "chat/room1"}
			for i := 0; i < edges; i++ {
				id := "node1." + strconv.Itoa(i)
				inboxes[id] = &sbInbox{}
				batch.Edges = append(batch.Edges, delivery.ConnEdge{Edge: int64(i + 1), Conn: id, Topic: "messages", Cursor: 0})
			}
			batch.Events = []abi.Event{{Publisher: "chat/room1", Topic: "messages", Seq: 1, Time: time.Now().UnixNano(),
				Payload: []byte(`{"author":"ann","text":"hello, fan-out"}`)}}
			lookup := func(c string) (delivery.Inbox, bool) {
				mu.RLock()
				in, ok := inboxes[c]
				mu.RUnlock()
				return in, ok
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res := delivery.Slice(batch, lookup)
				if len(res.Refused)+len(res.Gone) != 0 {
					b.Fatal("refused or gone")
				}
			}
			b.StopTimer()
			items := map[*delivery.Item]bool{}
			for _, in := range inboxes {
				items[in.last] = true
				if in.n != b.N {
					b.Fatalf("inbox got %d items, want %d", in.n, b.N)
				}
			}
			if len(items) != 1 {
				b.Fatalf("last event landed as %d items: the envelope was encoded per socket", len(items))
			}
			r := testing.AllocsPerRun(20, func() { delivery.Slice(batch, lookup) })
			b.ReportMetric(r/float64(edges), "allocs/socket")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(edges), "ns/socket")
		})
	}
}

// BenchmarkFanoutEnvelope encodes one forward envelope: the per-node,
// per-event cost that the slice pays once however many sockets follow.
func BenchmarkFanoutEnvelope(b *testing.B) {
	e := abi.Event{Publisher: "chat/room1", Topic: "messages", Seq: 12345, Time: time.Now().UnixNano(),
		Payload: []byte(`{"author":"ann","text":"hello, fan-out"}`)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = delivery.AppendEnvelope(buf[:0], &e)
	}
}
