package host

import (
	"github.com/coder/websocket"
	dto "github.com/prometheus/client_model/go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// Hooks for the fan-out benchmarks in fanout_bench_test.go (package
// host_test). They read node internals without allocating per call where
// the benchmarks poll them.

// FbServerSockets returns the server side of every WebSocket connection the
// node holds: the raw-ceiling benchmark writes to them directly, with no
// pump and no inbox.
func FbServerSockets(n *Node) []*websocket.Conn {
	n.conns.mu.RLock()
	defer n.conns.mu.RUnlock()
	out := make([]*websocket.Conn, 0, len(n.conns.m))
	for _, c := range n.conns.m {
		out = append(out, c.ws)
	}
	return out
}

// FbPumpBusy reports whether id's pump goroutine is running.
func FbPumpBusy(n *Node, id ObjectID) bool {
	n.objects.mu.Lock()
	o := n.objects.active[id]
	n.objects.mu.Unlock()
	return o != nil && o.pump.running.Load()
}

// FbReceiveCommits reads host_receive_commits_total without going through
// /metrics.
func FbReceiveCommits(n *Node) float64 {
	var m dto.Metric
	n.metrics.received.Write(&m)
	return m.GetCounter().GetValue()
}

// OfferToEveryConnection offers ev, with envelope as its frame, to every
// WebSocket connection's inbox on n, as a connection batch's slice does:
// a test sends a batch again without making the pump fail.
func OfferToEveryConnection(n *Node, ev abi.Event, envelope []byte) {
	n.conns.mu.RLock()
	defer n.conns.mu.RUnlock()
	for _, c := range n.conns.m {
		c.Offer(&delivery.Item{Event: ev, Envelope: envelope})
	}
}
