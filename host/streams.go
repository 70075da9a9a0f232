package host

import (
	"context"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/store"
)

// Streams (seed 003): GET /v1/objects/{program}/{id}/stream?topic=&after=&filter=
// answers with server-sent events, each read from the object's log. The
// object's home publishes an empty NATS message on its hint subject after
// every commit that appended events; subscriptions anywhere in the cluster
// listen there and read the log (on the home, over NATS when it is
// elsewhere) after their cursor.

// hintPrefix is the subject prefix of the hints; the object's name is hex
// encoded, since program names hold dots.
const hintPrefix = "HOST_NOTIFICATIONS."

// HintSubject is the NATS subject carrying obj's empty hints.
func HintSubject(obj ObjectID) string {
	return hintPrefix + hex.EncodeToString([]byte(obj.String())) + ".changed.v1"
}

// hintCommitted tells obj's subscriptions that its log grew. Called after
// the commit, never before: a hint never announces what a reader cannot
// see yet.
func (n *Node) hintCommitted(obj ObjectID) {
	_ = n.nats.nc.Publish(HintSubject(obj), nil)
}

// natsHints is the hint transport of one object over the node's NATS
// connection.
type natsHints struct {
	nc      *nats.Conn
	subject string
}

func (h natsHints) Listen(f func()) (func(), error) {
	sub, err := h.nc.Subscribe(h.subject, func(*nats.Msg) { f() })
	if err != nil {
		return nil, err
	}
	if err := h.nc.FlushTimeout(5 * time.Second); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	return func() { sub.Unsubscribe() }, nil
}

func (h natsHints) Ping() error { return h.nc.Publish(h.subject, nil) }

// streamQuery is a subscription's read, sent to the object's home when it
// is on another node.
type streamQuery struct {
	Topic    string `json:"topic,omitempty"`
	Filter   string `json:"filter,omitempty"`
	After    uint64 `json:"after"`
	Limit    int    `json:"limit"`
	MaxBytes int    `json:"max_bytes"`
	Latest   bool   `json:"latest,omitempty"`
}

// opStream reads a subscription's batch on the object's home.
var opStream = objectOp("stream", 0, (*Node).readLocal)

// readLocal answers q from this node's copy of obj's file.
func (n *Node) readLocal(ctx context.Context, obj ObjectID, q streamQuery) ([]abi.Event, error) {
	// Async acknowledgement: what was committed before the read is
	// shipped before it is read, and what commits meanwhile is left out
	// (its own hint brings it).
	if err := n.replicas.waitShipped(ctx, obj); err != nil {
		return nil, err
	}
	limit, capped := n.replicas.readCap(obj)
	// Under the output gate: nothing not yet durable.
	durable := func() (uint64, bool) { return n.objects.durableCap(obj) }
	return store.Read(ctx, n.objectPath(obj), store.Query{After: q.After, Topic: q.Topic, Capped: capped, Cap: limit, CapAfter: durable,
		Match: delivery.MustFilter(q.Filter).MatchFunc(), Limit: q.Limit, MaxBytes: q.MaxBytes, Latest: q.Latest})
}

// readStream answers q on obj's home.
func (n *Node) readStream(ctx context.Context, obj ObjectID, q streamQuery) ([]abi.Event, error) {
	return opStream.onHome(ctx, n, obj, q)
}

// streamReader is a subscription's delivery.StreamReader; read answers a
// query on the object's home.
type streamReader struct {
	read   func(context.Context, ObjectID, streamQuery) ([]abi.Event, error)
	obj    ObjectID
	topic  string
	filter string
}

func (r streamReader) After(ctx context.Context, after uint64, limit, maxBytes int) ([]abi.Event, error) {
	return r.read(ctx, r.obj, streamQuery{Topic: r.topic, Filter: r.filter, After: after, Limit: limit, MaxBytes: maxBytes})
}

func (r streamReader) Latest(ctx context.Context) (abi.Event, bool, error) {
	evs, err := r.read(ctx, r.obj, streamQuery{Topic: r.topic, Filter: r.filter, Latest: true})
	if err != nil || len(evs) == 0 {
		return abi.Event{}, false, err
	}
	return evs[0], true, nil
}

// streams is the node's live subscriptions, told when NATS reconnects
// and ended when the node shuts down.
type streams struct {
	mu    sync.Mutex
	subs  map[*delivery.Subscription]struct{}
	ended chan struct{} // closed by end
	once  sync.Once
}

func newStreams() *streams {
	return &streams{subs: map[*delivery.Subscription]struct{}{}, ended: make(chan struct{})}
}

// end ends every subscription, now and to come.
func (s *streams) end() { s.once.Do(func() { close(s.ended) }) }

func (s *streams) add(sub *delivery.Subscription) {
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
}

func (s *streams) remove(sub *delivery.Subscription) {
	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
}

// reconnected pings for every subscription: what was missed while NATS
// was away is read on the hints' receipt.
func (s *streams) reconnected() {
	s.mu.Lock()
	subs := make([]*delivery.Subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		sub.Reconnected()
	}
}

// Stream runs the stream subscription q for the API until ctx ends or
// the node shuts down (nil), or the subscription fails: the object's log
// read on its home after the cursor, woken by its hints.
func (n *Node) Stream(ctx context.Context, q api.StreamQuery, send func(*abi.Event) error, flush func() error) error {
	counted := func(e *abi.Event) error {
		if err := send(e); err != nil {
			return err
		}
		n.metrics.streamEvents.Inc()
		return nil
	}
	sub := delivery.NewSubscription(n.cfg.Streams, streamReader{read: n.readStream, obj: q.Object, topic: q.Topic, filter: q.Filter},
		natsHints{nc: n.nats.nc, subject: HintSubject(q.Object)}, q.After, counted)
	sub.SetFlush(flush)
	n.streams.add(sub)
	defer n.streams.remove(sub)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.streams.ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := sub.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	n.log.Debug("stream ended", slog.String("object", q.Object.String()), slog.Any("err", err))
	return err
}
