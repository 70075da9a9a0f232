package delivery

import (
	"cmp"
	"container/list"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Bounds of a node's edge copies.
const (
	// DefaultEdgeCopies is how many publishers' edge sets a node keeps;
	// past it the least recently used goes (its next batch is answered
	// Unknown and brings the whole set again).
	DefaultEdgeCopies = 4096
	// DefaultEdgeCopyIdle: a publisher's edge set not used for this long
	// is dropped; a publisher that still has sockets here sends it again.
	DefaultEdgeCopyIdle = 10 * time.Minute
)

// EdgeCopies is a receiving node's copy of each publisher's connection
// edges on it, at the version the publisher's home last sent, so that a
// connection batch carries only what changed. It holds what it was sent
// and nothing else: a batch whose base version it does not hold, under
// this EdgeCopies' epoch and the sender's session, is answered Unknown,
// never sliced against another set. Memory is bounded: an empty set is
// dropped at once, an idle one after the idle time, and past the limit
// the least recently used.
type EdgeCopies struct {
	epoch uint64
	limit int
	idle  time.Duration
	clock Clock

	// mu guards m and lru (front: most recently used). Never held while
	// slicing: a stored set is never changed, a new version is a new
	// slice.
	mu  sync.Mutex
	m   map[string]*list.Element // publisher → *edgeCopy
	lru list.List
}

type edgeCopy struct {
	publisher        string
	session, version uint64
	edges            []ConnEdge // by id
	used             time.Time
}

// NewEdgeCopies returns an empty EdgeCopies with a fresh random epoch,
// keeping at most limit publishers' sets, each until it has been idle for
// idle.
func NewEdgeCopies(limit int, idle time.Duration, clock Clock) *EdgeCopies {
	return &EdgeCopies{epoch: rand.Uint64() | 1, limit: max(limit, 1), idle: idle, clock: clock, m: map[string]*list.Element{}}
}

// Epoch is this EdgeCopies' nonce, sent back with every result.
func (c *EdgeCopies) Epoch() uint64 { return c.epoch }

// Len reports how many publishers' sets are held.
func (c *EdgeCopies) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Slice resolves b's edge set (the batch's own for an unversioned batch,
// else the held copy changed as b says) and slices b's events into the
// inboxes as Slice does. A batch whose base it does not hold is answered
// Unknown and delivers nothing.
func (c *EdgeCopies) Slice(b *ConnBatch, lookup func(conn string) (Inbox, bool)) ConnResult {
	edges, ok := c.resolve(b)
	if !ok {
		return ConnResult{Epoch: c.epoch, Unknown: true}
	}
	whole := *b
	whole.Edges, whole.Removed = edges, nil
	res := Slice(&whole, lookup)
	res.Epoch = c.epoch
	return res
}

// resolve returns the whole edge set b stands for and stores it as the
// publisher's copy when b is versioned.
func (c *EdgeCopies) resolve(b *ConnBatch) ([]ConnEdge, bool) {
	if b.Set.Version == 0 {
		return b.Edges, true
	}
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(now)
	var cur *edgeCopy
	if el := c.m[b.Publisher]; el != nil {
		cur = el.Value.(*edgeCopy)
	}
	var edges []ConnEdge
	switch {
	case b.Set.Base == 0:
		edges = byID(b.Edges)
	case cur == nil || b.Set.Epoch != c.epoch || cur.session != b.Set.Session || cur.version != b.Set.Base:
		return nil, false
	case len(b.Edges) == 0 && len(b.Removed) == 0:
		edges = cur.edges
	default:
		edges = applyDelta(cur.edges, byID(b.Edges), b.Removed)
	}
	switch {
	case len(edges) == 0:
		// No socket here follows the publisher: nothing to keep.
		if cur != nil {
			c.drop(c.m[b.Publisher])
		}
	case cur != nil:
		cur.session, cur.version, cur.edges, cur.used = b.Set.Session, b.Set.Version, edges, now
		c.lru.MoveToFront(c.m[b.Publisher])
	default:
		c.m[b.Publisher] = c.lru.PushFront(&edgeCopy{publisher: b.Publisher, session: b.Set.Session, version: b.Set.Version, edges: edges, used: now})
		for len(c.m) > c.limit {
			c.drop(c.lru.Back())
		}
	}
	return edges, true
}

// sweep drops the sets idle past c.idle: the least recently used sit at
// the back. Called with mu held.
func (c *EdgeCopies) sweep(now time.Time) {
	for el := c.lru.Back(); el != nil && now.Sub(el.Value.(*edgeCopy).used) >= c.idle; el = c.lru.Back() {
		c.drop(el)
	}
}

func (c *EdgeCopies) drop(el *list.Element) {
	delete(c.m, el.Value.(*edgeCopy).publisher)
	c.lru.Remove(el)
}

func cmpEdge(a, b ConnEdge) int { return cmp.Compare(a.Edge, b.Edge) }

// byID returns es ordered by edge id with one edge per id (the last one
// sent): es itself when it already is, so a set is not copied on its way
// in; else a sorted copy (es may be the sender's, never written).
func byID(es []ConnEdge) []ConnEdge {
	if slices.IsSortedFunc(es, func(a, b ConnEdge) int { return cmp.Or(cmpEdge(a, b), -1) }) {
		return es
	}
	out := slices.Clone(es)
	slices.SortStableFunc(out, cmpEdge)
	// Keep the last of equal ids: walk back, skip what was kept.
	k := len(out)
	for i := len(out) - 1; i >= 0; i-- {
		if k < len(out) && out[k].Edge == out[i].Edge {
			continue
		}
		k--
		out[k] = out[i]
	}
	return out[k:]
}

// applyDelta returns old without the removed ids, with added (by id, one
// per id) put in: an added id old has replaces it.
func applyDelta(old, added []ConnEdge, removed []int64) []ConnEdge {
	gone := make(map[int64]bool, len(removed))
	for _, id := range removed {
		gone[id] = true
	}
	out := make([]ConnEdge, 0, len(old)+len(added))
	i, j := 0, 0
	for i < len(old) || j < len(added) {
		switch {
		case j == len(added) || i < len(old) && old[i].Edge < added[j].Edge:
			if !gone[old[i].Edge] {
				out = append(out, old[i])
			}
			i++
		case i == len(old) || added[j].Edge < old[i].Edge:
			out = append(out, added[j])
			j++
		default:
			out = append(out, added[j])
			i++
			j++
		}
	}
	return out
}
