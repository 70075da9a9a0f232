package host

import (
	"context"
	"encoding/hex"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// The subject fan-out baseline (delivery.FanOutSubject): what a user would
// build on NATS alone. Each event is published once on a subject per
// (publisher, topic); every node with a watcher subscribes and hands the
// event to its local sockets. Only the benchmarks use it.

func topicSubject(publisher, topic string) string {
	t := "*"
	if topic != "" {
		t = hex.EncodeToString([]byte(topic))
	}
	return "host.topic." + hex.EncodeToString([]byte(publisher)) + "." + t
}

// PublishTopic publishes each event once on its topic's subject.
func (t remoteTransport) PublishTopic(_ context.Context, publisher string, events []abi.Event) error {
	for i := range events {
		ev := events[i]
		ev.Publisher = publisher
		data := abi.AppendEvent(nil, &ev)
		t.n.metrics.observeRemote("topic", len(data))
		if err := t.n.nats.nc.Publish(topicSubject(publisher, ev.Topic), data); err != nil {
			return err
		}
	}
	return nil
}

var _ delivery.TopicPublisher = remoteTransport{}

// topicSubs are this node's subject subscriptions and the local connections
// behind each.
type topicSubs struct {
	nc *nats.Conn
	mu sync.Mutex // guards m
	m  map[string]*topicSub
}

func newTopicSubs(nc *nats.Conn) *topicSubs { return &topicSubs{nc: nc, m: map[string]*topicSub{}} }

type topicSub struct {
	sub   *nats.Subscription
	conns map[*conn]bool
}

// follow subscribes this node to the subject of (publisher, topic) for c.
func (ts *topicSubs) follow(publisher ObjectID, topic string, c *conn) {
	subj := topicSubject(publisher.String(), topic)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	s := ts.m[subj]
	if s == nil {
		s = &topicSub{conns: map[*conn]bool{}}
		ts.m[subj] = s
		sub, err := ts.nc.Subscribe(subj, func(m *nats.Msg) {
			ev, err := abi.DecodeEvent(m.Data)
			if err != nil {
				return
			}
			item := delivery.NewItem(ev)
			ts.mu.Lock()
			cs := make([]*conn, 0, len(s.conns))
			for c := range s.conns {
				cs = append(cs, c)
			}
			ts.mu.Unlock()
			for _, c := range cs {
				c.Offer(item)
			}
		})
		if err == nil {
			sub.SetPendingLimits(-1, -1)
			s.sub = sub
		}
	}
	s.conns[c] = true
}

// drop forgets c everywhere.
func (ts *topicSubs) drop(c *conn) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, s := range ts.m {
		delete(s.conns, c)
	}
}
