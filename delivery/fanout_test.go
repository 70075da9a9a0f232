package delivery_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// topicNet is a fakeNet that also publishes topics, as the node's
// transport does for the subject baseline.
type topicNet struct {
	*fakeNet
	mu        sync.Mutex
	published [][]abi.Event
}

func (n *topicNet) PublishTopic(_ context.Context, publisher string, events []abi.Event) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.published = append(n.published, events)
	return nil
}

// Each fan-out carries a round to the same watchers as it says: the
// product one batch per node, the socket baseline one per watcher, the
// subject baseline one topic publish and no batch. In every mode the
// connection edges advance together and a gone node's connection is
// pruned.
func TestFanOutModes(t *testing.T) {
	for _, c := range []struct {
		mode             delivery.FanOut
		batches, publish int // for 40 watchers on 4 live nodes
	}{
		{delivery.FanOutNode, 4, 0},
		{delivery.FanOutSocket, 40, 0},
		{delivery.FanOutSubject, 0, 1},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			pb := newPub(t)
			net := &topicNet{fakeNet: newNet()}
			cfg := delivery.DefaultConfig()
			cfg.FanOut = c.mode
			obs := &nopObs{}
			p := delivery.NewPump(cfg, net, net, obs, slog.Default())
			var inboxes []*inbox
			for i := range 40 {
				node := []string{"A", "B", "C", "D"}[i%4]
				id := fmt.Sprintf("%s.%d", node, i)
				inboxes = append(inboxes, net.conn(node, id, delivery.DefaultInbox))
				pb.follow(t, abi.FollowerConnection, id, node, "messages", "")
			}
			pb.follow(t, abi.FollowerConnection, "Z.1", "Z", "messages", "") // node Z is gone
			pb.publish(t, "messages", `"one"`, `"two"`, `"three"`)
			drain(t, p, pb)

			if got := len(net.batches); got != c.batches {
				t.Errorf("%d connection batches, want %d", got, c.batches)
			}
			if got := len(net.published); got != c.publish {
				t.Errorf("%d topic publishes, want %d", got, c.publish)
			}
			for _, evs := range net.published {
				if len(evs) != 3 {
					t.Errorf("a topic publish carried %d events, want the round's 3", len(evs))
				}
			}
			if c.mode != delivery.FanOutSubject {
				// The subject baseline's delivery is NATS's, not the pump's.
				for i, in := range inboxes {
					if got := seqs(in.items); !slices.Equal(got, []uint64{1, 2, 3}) {
						t.Fatalf("watcher %d got %v", i, got)
					}
				}
			}
			es := pb.edges(t)
			if len(es) != 40 || obs.pruned != 1 {
				t.Fatalf("%d edges left, %d pruned: want the gone node's one pruned", len(es), obs.pruned)
			}
			for _, e := range es {
				if e.Cursor != 3 {
					t.Fatalf("edge %s at cursor %d, want 3", e.Follower, e.Cursor)
				}
			}
		})
	}
}
