package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durable-host/host/host/client"
)

// envelope is the part of an event's forward envelope (a stream's data, a
// watcher's frame) the checks read.
type envelope struct {
	Type    string `json:"type"`
	Seq     uint64 `json:"seq"`
	Time    int64  `json:"time"`
	Payload struct {
		Value int64 `json:"value"`
	} `json:"payload"`
}

// SubSession is one connection of a stream subscriber: the node it read
// through, the checkpoint it resumed from (exclusive), the events it got,
// and why it ended.
type SubSession struct {
	Node   int      `json:"node"`
	After  uint64   `json:"after"`
	Events []Change `json:"events"`
	Err    string   `json:"err,omitempty"`
	// End is why it ended, in a word (see ended).
	End string `json:"end"`
}

// subscriber reads one counter's stream (topic "changes") from its start,
// through a random live node; when the stream ends or its node goes down it
// resumes through another node after the last seq it got.
type subscriber struct {
	object   string
	mu       sync.Mutex // guards sessions
	sessions []SubSession
	last     atomic.Uint64 // the checkpoint: the highest seq got
}

// streamIdle is how long a reader waits without an event before it opens
// a new connection: a stream or follow can stall silently (its node's
// NATS link, a follow held by a home that died); resuming is safe for a
// subscriber (from its checkpoint) and is a new connection for a watcher.
// The clients write each counter several times a second.
const streamIdle = 5 * time.Second

func (s *subscriber) run(ctx context.Context, w *workload, rng *rand.Rand) {
	prev := -1
	for ctx.Err() == nil {
		node, ok := w.pickNode(rng, prev)
		if !ok {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		prev = node
		sess := SubSession{Node: node, After: s.last.Load()}
		after := sess.After
		var lastEvent atomic.Int64
		lastEvent.Store(time.Now().UnixNano())
		sctx, cancel := w.connection(ctx, node, &lastEvent)
		err := w.cluster.Nodes[node].Client.Subscribe(sctx, s.object, client.SubscribeOptions{Topic: "changes", After: &after}, func(data []byte) bool {
			var e envelope
			if json.Unmarshal(data, &e) != nil {
				return true
			}
			lastEvent.Store(time.Now().UnixNano())
			sess.Events = append(sess.Events, Change{Seq: e.Seq, Value: e.Payload.Value, Time: e.Time})
			if e.Seq > s.last.Load() {
				s.last.Store(e.Seq)
			}
			return true
		})
		cancel()
		if err != nil {
			sess.Err = err.Error()
		}
		sess.End = ended(ctx, sctx, err)
		s.mu.Lock()
		s.sessions = append(s.sessions, sess)
		s.mu.Unlock()
		pause(ctx, time.Duration(100+rng.IntN(200))*time.Millisecond)
	}
}

func (s *subscriber) Sessions() []SubSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]SubSession(nil), s.sessions...)
}

// WatchConn is one WebSocket connection of a watcher: the node, when it
// was opened and closed (Unix ns, the clock of the events' times), the
// events it got, and why it ended.
type WatchConn struct {
	Node   int      `json:"node"`
	Opened int64    `json:"opened"`
	Closed int64    `json:"closed"`
	Events []Change `json:"events"`
	Err    string   `json:"err,omitempty"`
	// End is why it ended, in a word (see ended).
	End string `json:"end"`
}

// watcher follows one counter's "changes" topic over a WebSocket through a
// random live node, and connects again (through another node) when the
// connection drops, its node goes down, or it hears nothing for
// streamIdle. Connections are at-most-once: what a connection misses is
// lost, counted, not a violation.
type watcher struct {
	object string
	mu     sync.Mutex // guards conns
	conns  []WatchConn
}

func (wt *watcher) run(ctx context.Context, w *workload, rng *rand.Rand) {
	prev := -1
	for ctx.Err() == nil {
		node, ok := w.pickNode(rng, prev)
		if !ok {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		prev = node
		conn := WatchConn{Node: node, Opened: time.Now().UnixNano()}
		var lastEvent atomic.Int64
		lastEvent.Store(conn.Opened)
		wctx, cancel := w.connection(ctx, node, &lastEvent)
		err := w.cluster.Nodes[node].Client.Watch(wctx, wt.object, client.WatchOptions{Topic: "changes"}, func(data []byte) bool {
			var e envelope
			if json.Unmarshal(data, &e) != nil {
				return true
			}
			if e.Type != "event" {
				// "behind": the node dropped this connection's follows.
				conn.Err = "behind"
				return false
			}
			lastEvent.Store(time.Now().UnixNano())
			conn.Events = append(conn.Events, Change{Seq: e.Seq, Value: e.Payload.Value, Time: e.Time})
			return true
		})
		cancel()
		conn.Closed = time.Now().UnixNano()
		conn.End = ended(ctx, wctx, err)
		if conn.Err == "behind" {
			conn.End = "behind"
		}
		if err != nil && conn.Err == "" {
			conn.Err = err.Error()
		}
		wt.mu.Lock()
		wt.conns = append(wt.conns, conn)
		wt.mu.Unlock()
		pause(ctx, time.Duration(100+rng.IntN(200))*time.Millisecond)
	}
}

func (wt *watcher) Conns() []WatchConn {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	return append([]WatchConn(nil), wt.conns...)
}

// pickNode picks a live node, another than prev when there is one.
func (w *workload) pickNode(rng *rand.Rand, prev int) (int, bool) {
	up, _ := w.nodes.up()
	if len(up) == 0 {
		return 0, false
	}
	if len(up) > 1 {
		for k, i := range up {
			if i == prev {
				up = append(up[:k:k], up[k+1:]...)
				break
			}
		}
	}
	return up[rng.IntN(len(up))], true
}

// connection is the context of one reader's connection through node: it
// ends with ctx, when the schedule takes the node down (a paused node
// holds its sockets open and silent), or after streamIdle without an
// event.
func (w *workload) connection(ctx context.Context, node int, lastEvent *atomic.Int64) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
			}
			switch {
			case w.nodes.isDown(node):
				cancel(errNodeDown)
				return
			case time.Since(time.Unix(0, lastEvent.Load())) > streamIdle:
				cancel(errIdle)
				return
			}
		}
	}()
	return cctx, func() { cancel(nil) }
}

var (
	errNodeDown = errors.New("node down")
	errIdle     = errors.New("idle")
)

// ended says in a word why a reader's connection ended: the run's end
// (ctx), its node taken down or its silence (the connection's context,
// cctx), a node's refusal of the request (with its HTTP status), or a
// drop: any other error, or the stream's end. A WebSocket follow the node
// refused (as it does while the publisher has no live home: "unavailable")
// is a drop too; the client does not tell it from a closed socket but by
// its text.
func ended(ctx, cctx context.Context, err error) string {
	var ae *client.APIError
	switch cause := context.Cause(cctx); {
	case ctx.Err() != nil:
		return "run end"
	case cause == errNodeDown || cause == errIdle:
		return cause.Error()
	case errors.As(err, &ae):
		return fmt.Sprintf("refused %d", ae.Status)
	default:
		return "dropped"
	}
}

// ends counts the connections' ends by reason, most first: "node down 4,
// idle 2".
func ends(reasons []string) string {
	n := map[string]int{}
	for _, r := range reasons {
		n[r]++
	}
	keys := slices.Collect(maps.Keys(n))
	slices.SortFunc(keys, func(a, b string) int {
		if n[a] != n[b] {
			return n[b] - n[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
