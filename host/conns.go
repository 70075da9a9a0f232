package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/vm"
)

// conns is the registry of this node's WebSocket connections, and what
// each of them uses of the node.
type conns struct {
	node   connNode
	shaper *shaper
	bg     context.Context // shaping outlives a socket's own context
	topics *topicSubs      // the subject fan-out baseline's; nil otherwise
	// copies are the publishers' edge sets for these connections, as
	// their homes sent them (versioned connection batches).
	copies *delivery.EdgeCopies
	log    *slog.Logger

	// mu guards m and closed.
	mu     sync.RWMutex
	m      map[string]*conn
	closed bool
	seq    atomic.Uint64
	wg     sync.WaitGroup // running connection handlers

	// Counts of connections already closed.
	closedFrames, closedEnvelopes atomic.Int64
}

// totals sums frames and envelopes written by every connection, open or
// closed.
func (cs *conns) totals() (frames, envelopes int64) {
	cs.mu.RLock()
	for _, c := range cs.m {
		frames += c.frames.Load()
		envelopes += c.envelopes.Load()
	}
	cs.mu.RUnlock()
	return frames + cs.closedFrames.Load(), envelopes + cs.closedEnvelopes.Load()
}

// connNode is what a connection asks of its node: its follows made and
// undone at the publisher's home, and its edges pruned there once it is
// gone.
type connNode interface {
	follows
	pruneConnection(ctx context.Context, publisher ObjectID, conn string)
}

func newConns(bg context.Context, node connNode, sh *shaper, topics *topicSubs, copies *delivery.EdgeCopies, log *slog.Logger) *conns {
	return &conns{node: node, shaper: sh, bg: bg, topics: topics, copies: copies, log: log, m: map[string]*conn{}}
}

func (cs *conns) lookup(id string) (delivery.Inbox, bool) {
	cs.mu.RLock()
	c, ok := cs.m[id]
	cs.mu.RUnlock()
	return c, ok
}

func (cs *conns) add(c *conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return false
	}
	cs.m[c.id] = c
	cs.wg.Add(1)
	return true
}

// remove forgets c, and its subject subscriptions.
func (cs *conns) remove(c *conn) {
	cs.mu.Lock()
	if _, ok := cs.m[c.id]; ok {
		delete(cs.m, c.id)
		cs.closedFrames.Add(c.frames.Load())
		cs.closedEnvelopes.Add(c.envelopes.Load())
	}
	cs.mu.Unlock()
	if cs.topics != nil {
		cs.topics.drop(c)
	}
}

func (cs *conns) count() int {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	return len(cs.m)
}

// closeAll closes every connection and waits for their handlers to finish
// (they prune their edges on the way out).
func (cs *conns) closeAll() {
	cs.mu.Lock()
	cs.closed = true
	all := make([]*conn, 0, len(cs.m))
	for _, c := range cs.m {
		all = append(all, c)
	}
	cs.mu.Unlock()
	for _, c := range all {
		c.ws.Close(websocket.StatusGoingAway, "node shutting down")
		c.cancel()
	}
	cs.wg.Wait()
}

// conn is one WebSocket connection: a follower of kind connection whose
// inbox of cfg.Delivery.Inbox items lives on this node.
type conn struct {
	id       string
	cs       *conns
	who      principal
	attached ObjectID // the object whose program shapes events, if it can
	useEvent bool
	ws       *websocket.Conn
	inbox    inbox
	ctrl     chan []byte
	ctx      context.Context
	cancel   context.CancelFunc
	behind   atomic.Bool
	// writing is set while a writer goroutine runs: one runs only while
	// there is something to write, so an idle connection holds no
	// goroutine (and no stack) for writing.
	writing atomic.Bool

	// Written only by the connection's writer: per-connection counters
	// cost nothing shared per frame (a node-wide atomic did, measurably,
	// across thousands of writers); /metrics sums them.
	frames, envelopes atomic.Int64
	// written is, per publisher, the last seq written to this socket; only
	// the writer touches it (one runs at a time). A slice: a socket
	// follows one publisher or a few.
	written []pubSeq

	// mu guards follows: publisher → topics this connection follows.
	mu      sync.Mutex
	follows map[ObjectID]map[string]bool
}

// Offer lands an item in the inbox, or refuses when it is full: the
// publisher then prunes every edge this connection holds, and the client is
// told it fell behind. The socket stays open.
func (c *conn) Offer(it *delivery.Item) bool {
	if c.inbox.push(it) {
		c.wake()
		return true
	}
	if c.behind.CompareAndSwap(false, true) {
		c.control(map[string]any{"type": "behind", "error": fmt.Sprintf("inbox full (%d events): your follows were dropped; follow again to resume", c.inbox.max)})
	}
	return false
}

// control queues a control frame without blocking delivery.
func (c *conn) control(v any) {
	b, _ := json.Marshal(v)
	select {
	case c.ctrl <- b:
		c.wake()
	default:
	}
}

// reply queues a reply to a client request, waiting for room.
func (c *conn) reply(v any) {
	b, _ := json.Marshal(v)
	select {
	case c.ctrl <- b:
		c.wake()
	case <-c.ctx.Done():
	}
}

// wake starts the writer unless it runs.
func (c *conn) wake() {
	if c.writing.CompareAndSwap(false, true) {
		go c.writeLoop()
	}
}

// pubSeq is a publisher's last seq written to a socket.
type pubSeq struct {
	publisher string
	seq       uint64
}

// fresh reports whether ev is newer than every event of its publisher
// already written to this socket, and records it. A publisher's events
// reach a socket in seq order, so an older or equal one is a batch sent
// again: its connection progress failed to commit after it was sent (a
// replicated commit refused during a JetStream election, say), or a new
// home resent what the old one had sent but not yet recorded. Dropping it
// here keeps a connection at most once. Called by the writer only.
func (c *conn) fresh(ev *abi.Event) bool {
	for i := range c.written {
		if w := &c.written[i]; w.publisher == ev.Publisher {
			if ev.Seq <= w.seq {
				return false
			}
			w.seq = ev.Seq
			return true
		}
	}
	c.written = append(c.written, pubSeq{ev.Publisher, ev.Seq})
	return true
}

// Connect serves ws, upgraded by the API, as one of this node's
// connections until it ends: it answers hello, then reads the client's
// requests while its writer sends control frames and delivered events.
func (n *Node) Connect(ws *websocket.Conn, ac api.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{
		id:       n.id + "." + strconv.FormatUint(n.conns.seq.Add(1), 10),
		cs:       n.conns,
		who:      ac.Who,
		attached: ac.Object,
		useEvent: ac.UseEvent,
		ws:       ws,
		inbox:    inbox{max: n.dcfg.Inbox},
		ctrl:     make(chan []byte, 16),
		ctx:      ctx,
		cancel:   cancel,
		follows:  map[ObjectID]map[string]bool{},
	}
	if !n.conns.add(c) {
		cancel()
		ws.Close(websocket.StatusTryAgainLater, "node shutting down")
		return
	}
	n.metrics.conns.Inc()
	defer n.conns.wg.Done()
	defer n.metrics.conns.Dec()
	c.aside(func() {
		c.reply(map[string]any{"type": "hello", "connection": c.id, "node": n.id, "object": names.Show(c.who, c.attached)})
	})
	c.readLoop()
	c.close()
}

// close unregisters the connection and reports it gone to every publisher
// it followed, which prune its edges.
func (c *conn) close() {
	c.cancel()
	c.cs.remove(c)
	c.ws.CloseNow()
	c.mu.Lock()
	pubs := make([]ObjectID, 0, len(c.follows))
	for p := range c.follows {
		pubs = append(pubs, p)
	}
	c.mu.Unlock()
	for _, p := range pubs {
		c.cs.node.pruneConnection(context.Background(), p, c.id)
	}
}

// clientRequest is a frame a client sends.
type clientRequest struct {
	Type   string `json:"type"`
	Object string `json:"object"`
	Topic  string `json:"topic"`
	Filter string `json:"filter"`
	Params string `json:"params"`
}

func (c *conn) readLoop() {
	for {
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return
		}
		// Everything but the read runs on a goroutine of its own, whose
		// stack goes with it: decoding JSON and a follow run deep (the
		// publisher's hook, perhaps on another node), and this goroutine,
		// which stays as long as the socket, keeps the small stack a read
		// needs. Requests are still handled one at a time, in order.
		c.aside(func() { c.request(typ, data) })
	}
}

// aside runs f on a goroutine of its own and waits for it.
func (c *conn) aside(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// request answers one client frame.
func (c *conn) request(typ websocket.MessageType, data []byte) {
	if typ != websocket.MessageText {
		c.reply(map[string]any{"type": "error", "error": "send JSON text frames: {\"type\":\"follow\",\"object\":\"PROGRAM/ID\",\"topic\":\"T\"}"})
		return
	}
	req, err := parseClientRequest(data)
	if err != nil {
		c.reply(map[string]any{"type": "error", "request": req.Type, "error": err.Error()})
		return
	}
	c.handle(&req)
}

// maxParams bounds what a client presents to a follow hook.
const maxParams = 4 << 10

// parseClientRequest decodes and checks one client frame: a JSON object
// with a known type, and for follow and unfollow an optional PROGRAM/ID, a
// topic, a filter and params within their limits. Any byte string gets an
// answer, never a panic; the fuzz test holds it to that.
func parseClientRequest(data []byte) (clientRequest, error) {
	var req clientRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return clientRequest{}, fmt.Errorf("malformed request (want a JSON object such as {\"type\":\"follow\",\"topic\":\"T\"}): %v", err)
	}
	switch req.Type {
	case "follow", "unfollow":
	case "ping":
		return req, nil
	default:
		return req, fmt.Errorf("unknown request type %q: use follow, unfollow or ping", names.Clip(req.Type))
	}
	if req.Object != "" {
		if _, err := ParseObjectID(req.Object); err != nil {
			return req, err
		}
	}
	if len(req.Topic) > abi.MaxTopicLen {
		return req, fmt.Errorf("%w: topic longer than %d bytes", ErrBadRequest, abi.MaxTopicLen)
	}
	if !utf8.ValidString(req.Topic) {
		return req, fmt.Errorf("%w: topic is not valid UTF-8", ErrBadRequest)
	}
	if _, err := delivery.ParseFilter(req.Filter); err != nil {
		return req, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if len(req.Params) > maxParams {
		return req, fmt.Errorf("%w: params longer than %d bytes", ErrBadRequest, maxParams)
	}
	return req, nil
}

func (c *conn) handle(req *clientRequest) {
	errReply := func(err error) {
		c.reply(map[string]any{"type": "error", "request": req.Type, "object": req.Object, "topic": req.Topic, "error": err.Error()})
	}
	pub := c.attached
	if req.Object != "" {
		var err error
		if pub, err = names.FollowTarget(c.who, req.Object); err != nil {
			errReply(err)
			return
		}
	}
	switch req.Type {
	case "follow":
		c.behind.Store(false)
		e, err := c.cs.node.Follow(c.ctx, pub, abi.FollowRequest{
			Topic: req.Topic, Filter: req.Filter, Kind: abi.FollowerConnection,
			Follower: c.id, Tenant: c.who.Tenant, Params: []byte(req.Params),
		})
		if err != nil {
			var re *vm.RefusedError
			if errors.As(err, &re) {
				err = fmt.Errorf("follow refused by %s: %s", names.Show(c.who, pub), re.Reason)
			}
			errReply(err)
			return
		}
		c.mu.Lock()
		if c.follows[pub] == nil {
			c.follows[pub] = map[string]bool{}
		}
		c.follows[pub][req.Topic] = true
		c.mu.Unlock()
		if c.cs.topics != nil {
			c.cs.topics.follow(pub, req.Topic, c)
		}
		c.reply(map[string]any{"type": "followed", "object": names.Show(c.who, pub), "topic": req.Topic, "edge": e.ID, "cursor": e.Cursor})
	case "unfollow":
		ok, err := c.cs.node.Unfollow(c.ctx, pub, abi.FollowerConnection, c.id, req.Topic)
		if err != nil {
			errReply(err)
			return
		}
		c.mu.Lock()
		delete(c.follows[pub], req.Topic)
		c.mu.Unlock()
		c.reply(map[string]any{"type": "unfollowed", "object": names.Show(c.who, pub), "topic": req.Topic, "existed": ok})
	case "ping":
		c.reply(map[string]any{"type": "pong"})
	}
}

// writeLoop writes control frames and inbox items to the socket until
// both are empty, then ends (wake starts it again). Without an event
// export an item's frame is its forward envelope, encoded once per node
// and shared by every socket: no VM runs and nothing is allocated per
// socket. A failed write ends the connection; its writer stays marked
// running, so none starts again.
func (c *conn) writeLoop() {
	for {
		var frame []byte
		text := false // known valid UTF-8 (forward envelopes are)
		// One channel at a time, without blocking: a select over all of
		// them locks every channel per frame (7% of a node's CPU writing
		// one event to 5,000 sockets). A closed connection's write fails.
		var it *delivery.Item
		select {
		case frame = <-c.ctrl:
		default:
			it = c.inbox.pop()
		}
		switch {
		case frame != nil:
		case it != nil:
			if !c.fresh(&it.Event) {
				continue
			}
			if !c.useEvent {
				frame, text = it.Envelope, true
				c.envelopes.Add(1)
				break
			}
			out, err := c.cs.shaper.frame(c.cs.bg, c.attached, it)
			if errors.Is(err, vm.ErrSkip) {
				continue
			}
			if err != nil {
				c.cs.log.Debug("event handler failed", slog.String("conn", c.id), slog.Any("err", err))
				b, _ := json.Marshal(map[string]any{"type": "error", "error": "event handler: " + err.Error(), "publisher": it.Event.Publisher, "seq": it.Event.Seq})
				frame = b
				break
			}
			frame = out
		case c.ctx.Err() != nil:
			return
		default:
			// Nothing to write: end, unless something came in meanwhile
			// and no other writer took it.
			c.inbox.shrink()
			c.writing.Store(false)
			if len(c.ctrl) == 0 && c.inbox.len() == 0 || !c.writing.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		typ := websocket.MessageText
		if !text && !utf8.Valid(frame) {
			typ = websocket.MessageBinary
		}
		// A cancellable context costs the socket library a timer per
		// frame; closing the socket (CloseNow on the way out) is what
		// interrupts a stuck write.
		if err := c.ws.Write(context.Background(), typ, frame); err != nil {
			c.cancel()
			return
		}
		c.frames.Add(1)
	}
}
