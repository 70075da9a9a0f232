package delivery

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// ConnSets is what a publisher's home remembers of its connection edges
// by node: each node's edge set at its version, rebuilt only when the
// publisher's edges change (store.Tx.EdgesGeneration), and the version
// each node last acknowledged, so that a batch carries only the edges
// added and removed since. It lives in memory as long as the publisher
// does on this node: a new home (a takeover) or the publisher active
// again starts a new session, and each node gets its whole set once. The
// zero value is ready.
type ConnSets struct {
	// mu guards everything below. Rounds of one publisher do not overlap,
	// but its batches to the nodes run at once and acknowledge
	// concurrently. Never held while sending.
	mu      sync.Mutex
	session uint64
	last    uint64 // the last version given out
	gen     uint64 // the edges generation nodes was built from
	nodes   []*nodeEdges
	acks    map[string]setAck // node → the set it holds
	// old are the nodes of an earlier version: they read only whole,
	// unversioned batches (ErrUnversioned).
	old map[string]bool
}

// edgeSet is one node's connection edges at one version. It is never
// changed once built: a batch in flight and an acknowledgement hold it.
type edgeSet struct {
	version uint64
	edges   []ConnEdge // by id, cursors as when built
	// born is each edge's creation time: SQLite may give a removed
	// edge's id to a new one, which is another edge.
	born []int64
}

// nodeEdges is a node's set and where its edges sit in the edges it was
// built from, to read their cursors each round without copying them.
type nodeEdges struct {
	node   string
	set    *edgeSet
	pos    []int          // each edge's index in the store's edges
	topic  []int          // each edge's index in topics
	topics map[string]int // distinct topics of the node's edges
}

// setAck is what a node acknowledged: set, held under its epoch.
type setAck struct {
	epoch uint64
	set   *edgeSet
}

// nodeDue is one node's share of a round: its set and, per topic of its
// edges, the lowest cursor there (MaxUint64: none).
type nodeDue struct {
	*nodeEdges
	mins  []uint64
	after uint64 // the lowest cursor of all its edges
}

// owes reports whether some edge of the node is owed ev (its topic and
// cursor admit it; filters are the receiver's to apply).
func (d *nodeDue) owes(ev *abi.Event) bool {
	if k, ok := d.topics[ev.Topic]; ok && ev.Seq > d.mins[k] {
		return true
	}
	k, ok := d.topics[""]
	return ok && ev.Seq > d.mins[k]
}

// nodesFor returns each node's connection edges in all, rebuilding them
// when gen differs from the last call's. A node whose edges are the same
// as before keeps its set and version. Called between the publisher's
// calls (all is the store's cache: read, never changed).
func (s *ConnSets) nodesFor(gen uint64, all []store.Edge) []*nodeEdges {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == 0 {
		s.session = rand.Uint64() | 1
	}
	if s.nodes != nil && gen == s.gen {
		return s.nodes
	}
	old := map[string]*edgeSet{}
	for _, ne := range s.nodes {
		old[ne.node] = ne.set
	}
	byNode := map[string]*nodeEdges{}
	nodes := []*nodeEdges{}
	for i, e := range all {
		if e.Kind != abi.FollowerConnection {
			continue
		}
		ne := byNode[e.Node]
		if ne == nil {
			ne = &nodeEdges{node: e.Node, set: &edgeSet{}, topics: map[string]int{}}
			byNode[e.Node] = ne
			nodes = append(nodes, ne)
		}
		k, ok := ne.topics[e.Topic]
		if !ok {
			k = len(ne.topics)
			ne.topics[e.Topic] = k
		}
		ne.set.edges = append(ne.set.edges, ConnEdge{Edge: e.ID, Conn: e.Follower, Topic: e.Topic, Cursor: e.Cursor, Filter: e.Filter})
		ne.set.born = append(ne.set.born, e.Created)
		ne.pos = append(ne.pos, i)
		ne.topic = append(ne.topic, k)
	}
	for _, ne := range nodes {
		if !slices.IsSortedFunc(ne.set.edges, cmpEdge) {
			sortNode(ne)
		}
		if o := old[ne.node]; o != nil && o.same(ne.set) {
			ne.set = o
			continue
		}
		s.last++
		ne.set.version = s.last
	}
	// Acknowledgements of nodes with no edges left go: nothing more is
	// sent there until a new set, whole.
	for node := range s.acks {
		if byNode[node] == nil {
			delete(s.acks, node)
		}
	}
	for node := range s.old {
		if byNode[node] == nil {
			delete(s.old, node)
		}
	}
	s.gen, s.nodes = gen, nodes
	return nodes
}

// sortNode orders a node's edges by id, keeping their positions in step.
// The store lists edges by id, so this is a safeguard, not a path.
func sortNode(ne *nodeEdges) {
	idx := make([]int, len(ne.pos))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmpEdge(ne.set.edges[a], ne.set.edges[b]) })
	set := &edgeSet{edges: make([]ConnEdge, len(idx)), born: make([]int64, len(idx))}
	pos, topic := make([]int, len(idx)), make([]int, len(idx))
	for to, from := range idx {
		set.edges[to], set.born[to] = ne.set.edges[from], ne.set.born[from]
		pos[to], topic[to] = ne.pos[from], ne.topic[from]
	}
	ne.set, ne.pos, ne.topic = set, pos, topic
}

// same reports whether two sets hold the same edges (cursors aside: the
// batch's cursor carries them).
func (a *edgeSet) same(b *edgeSet) bool {
	if len(a.edges) != len(b.edges) {
		return false
	}
	for i := range a.edges {
		if !sameEdge(a, i, b, i) {
			return false
		}
	}
	return true
}

func sameEdge(a *edgeSet, i int, b *edgeSet, j int) bool {
	x, y := &a.edges[i], &b.edges[j]
	return x.Edge == y.Edge && a.born[i] == b.born[j] && x.Conn == y.Conn && x.Topic == y.Topic && x.Filter == y.Filter
}

// due returns ne's share of a round from the edges' cursors now.
func (ne *nodeEdges) due(all []store.Edge) nodeDue {
	d := nodeDue{nodeEdges: ne, mins: make([]uint64, len(ne.topics)), after: math.MaxUint64}
	for i := range d.mins {
		d.mins[i] = math.MaxUint64
	}
	for k, p := range ne.pos {
		c := all[p].Cursor
		d.mins[ne.topic[k]] = min(d.mins[ne.topic[k]], c)
		d.after = min(d.after, c)
	}
	return d
}

// describe fills b's edges for node: nothing but the version when the
// node holds set, the changes since the set it holds, or the whole set
// when it holds none this session knows of; for a node of an earlier
// version, the whole set in the unversioned form.
func (s *ConnSets) describe(b *ConnBatch, node string, set *edgeSet) {
	s.mu.Lock()
	ack, ok := s.acks[node]
	session, old := s.session, s.old[node]
	s.mu.Unlock()
	b.Edges, b.Removed = nil, nil
	switch {
	case old:
		// The form before versions: every edge with its own cursor.
		b.Edges = make([]ConnEdge, len(set.edges))
		for i, e := range set.edges {
			e.Cursor = max(e.Cursor, b.Cursor)
			b.Edges[i] = e
		}
		b.Cursor, b.Set = 0, SetVersion{}
	case !ok:
		b.Edges = set.edges
		b.Set = SetVersion{Session: session, Version: set.version}
	case ack.set == set:
		b.Set = SetVersion{Epoch: ack.epoch, Session: session, Base: set.version, Version: set.version}
	default:
		b.Edges, b.Removed = delta(ack.set, set)
		b.Set = SetVersion{Epoch: ack.epoch, Session: session, Base: ack.set.version, Version: set.version}
	}
}

// whole fills b with node's whole set, forgetting what the node was
// thought to hold: it answered Unknown.
func (s *ConnSets) whole(b *ConnBatch, node string, set *edgeSet) {
	s.mu.Lock()
	delete(s.acks, node)
	s.mu.Unlock()
	s.describe(b, node, set)
}

// unversioned records that node reads only unversioned batches.
func (s *ConnSets) unversioned(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.old == nil {
		s.old = map[string]bool{}
	}
	s.old[node] = true
	delete(s.acks, node)
}

// acked records that node holds set under epoch. A set the node no
// longer has edges in (rebuilt meanwhile) is not recorded.
func (s *ConnSets) acked(node string, epoch uint64, set *edgeSet) {
	if epoch == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ne := range s.nodes {
		if ne.node != node {
			continue
		}
		if a, ok := s.acks[node]; ok && a.epoch == epoch && a.set.version > set.version {
			return // a later set's acknowledgement came first
		}
		if s.acks == nil {
			s.acks = map[string]setAck{}
		}
		s.acks[node] = setAck{epoch: epoch, set: set}
		return
	}
}

// delta returns the edges of to that from lacks or has otherwise, and
// the ids of from's edges to lacks: one walk of both, in id order, and
// allocations for the changes only.
func delta(from, to *edgeSet) (added []ConnEdge, removed []int64) {
	i, j := 0, 0
	for i < len(from.edges) || j < len(to.edges) {
		switch {
		case j == len(to.edges) || i < len(from.edges) && from.edges[i].Edge < to.edges[j].Edge:
			removed = append(removed, from.edges[i].Edge)
			i++
		case i == len(from.edges) || to.edges[j].Edge < from.edges[i].Edge:
			added = append(added, to.edges[j])
			j++
		default:
			if !sameEdge(from, i, to, j) {
				added = append(added, to.edges[j])
			}
			i++
			j++
		}
	}
	return added, removed
}
