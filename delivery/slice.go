package delivery

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/durable-host/host/abi"
)

// Item is one event as it sits in connection inboxes on one node: shared by
// every inbox it lands in, with the forward envelope encoded once.
type Item struct {
	Event abi.Event
	// Envelope is the forward envelope: the frame written to a socket whose
	// program has no event export.
	Envelope []byte

	// memoMu guards memo, the frames shaped from this item by key.
	memoMu sync.Mutex
	memo   []*shaped
}

type shaped struct {
	key   string
	done  chan struct{}
	frame []byte
	err   error
}

// Shape returns the frame shape makes of this item under key, running shape
// once per key however many inboxes share the item: concurrent callers
// with the same key wait for the first. The host keys by program version
// and attached object, so a node runs an event export once per event for
// all its sockets of one object, not once per socket.
func (it *Item) Shape(key string, shape func() ([]byte, error)) ([]byte, error) {
	it.memoMu.Lock()
	for _, s := range it.memo {
		if s.key == key {
			it.memoMu.Unlock()
			<-s.done
			return s.frame, s.err
		}
	}
	s := &shaped{key: key, done: make(chan struct{})}
	it.memo = append(it.memo, s)
	it.memoMu.Unlock()
	defer close(s.done)
	s.frame, s.err = shape()
	return s.frame, s.err
}

// NewItem wraps an event and encodes its forward envelope.
func NewItem(e abi.Event) *Item {
	return &Item{Event: e, Envelope: AppendEnvelope(nil, &e)}
}

// AppendEnvelope appends the forward envelope of e, a JSON text frame:
//
//	{"type":"event","publisher":"chat/room1","topic":"messages","seq":7,
//	 "time":1700000000000000000,"payload":{...}}
//
// The payload is embedded as JSON when it is JSON in UTF-8, else as a
// string when it is UTF-8 text, else base64 under "payload_base64". So an
// envelope is always valid UTF-8, a text frame as it is: a socket writing
// it checks nothing.
func AppendEnvelope(dst []byte, e *abi.Event) []byte {
	dst = append(dst, `{"type":"event","publisher":`...)
	dst = appendJSONString(dst, e.Publisher)
	dst = append(dst, `,"topic":`...)
	dst = appendJSONString(dst, e.Topic)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"time":`...)
	dst = strconv.AppendInt(dst, e.Time, 10)
	switch {
	case len(e.Payload) > 0 && utf8.Valid(e.Payload) && json.Valid(e.Payload):
		dst = append(dst, `,"payload":`...)
		dst = append(dst, e.Payload...)
	case utf8.Valid(e.Payload):
		dst = append(dst, `,"payload":`...)
		dst = appendJSONString(dst, string(e.Payload))
	default:
		dst = append(dst, `,"payload_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, e.Payload)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// Inbox is a connection's bounded queue on the node holding its socket.
type Inbox interface {
	// Offer enqueues without blocking; false means the inbox is full.
	Offer(*Item) bool
}

// Slice is the receiving node's half of a connection batch whose Edges are
// the node's whole edge set (EdgeCopies.Slice resolves a versioned one
// first): it walks the events once, in publish order, and offers each to
// the inbox of every edge whose topic, cursor (the larger of its own and
// the batch's) and filter admit it. A connection whose inbox is full
// is refused (and gets nothing more from this batch); a connection the node
// does not have is gone.
func Slice(b *ConnBatch, lookup func(conn string) (Inbox, bool)) ConnResult {
	var res ConnResult
	// Edges with the same filter share its verdict on each event.
	type verdict struct {
		f     Filter
		event int
		ok    bool
	}
	type target struct {
		ConnEdge
		inbox  Inbox
		filter *verdict
		dead   *bool
	}
	// One allocation for all targets and one for all per-connection flags:
	// nothing is allocated per socket.
	targets := make([]target, 0, len(b.Edges))
	flags := make([]bool, len(b.Edges))
	verdicts := map[string]*verdict{}
	conns := make(map[string]int, len(b.Edges)) // conn → index in flags
	topics := map[string][]int{}                // topic → indexes in targets
	for _, e := range b.Edges {
		k, seen := conns[e.Conn]
		var in Inbox
		if !seen {
			k = len(conns)
			conns[e.Conn] = k
			var ok bool
			if in, ok = lookup(e.Conn); !ok {
				flags[k] = true
				res.Gone = append(res.Gone, e.Conn)
			}
		} else if !flags[k] {
			in, _ = lookup(e.Conn)
		}
		if flags[k] {
			continue
		}
		v := verdicts[e.Filter]
		if v == nil {
			v = &verdict{f: MustFilter(e.Filter), event: -1}
			verdicts[e.Filter] = v
		}
		e.Cursor = max(e.Cursor, b.Cursor)
		topics[e.Topic] = append(topics[e.Topic], len(targets))
		targets = append(targets, target{ConnEdge: e, inbox: in, filter: v, dead: &flags[k]})
	}
	for i := range b.Events {
		ev := &b.Events[i]
		var item *Item
		for _, ts := range [2][]int{topics[ev.Topic], topics[""]} {
			for _, ti := range ts {
				t := &targets[ti]
				if *t.dead || ev.Seq <= t.Cursor {
					continue
				}
				if v := t.filter; v.event != i {
					v.event, v.ok = i, v.f.Match(ev.Payload)
				}
				if !t.filter.ok {
					continue
				}
				if item == nil {
					item = NewItem(*ev)
				}
				if !t.inbox.Offer(item) {
					*t.dead = true
					res.Refused = append(res.Refused, t.Conn)
				}
			}
		}
	}
	return res
}
