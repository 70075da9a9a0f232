// Package cluster is a node's membership and the placement of objects: a
// lease per node in JetStream KV (joined under a fresh id, renewed by
// heartbeats, watched and swept to learn which peers are live) and the
// object directory (each object's home node, claimed with compare-and-set,
// cached, and reclaimed by a restarted node from its earlier ids).
//
// It does not know what an object is nor where its file lives: the node
// tells it through Config (its object ids, its counts, what to do when a
// peer is gone or its own lease is lost). It imports nothing of the node's.
package cluster

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/abi"
)

// Defaults.
const (
	// DefaultLeaseTTL: a node that has not renewed its lease for this long
	// is gone for good; its id never returns. It must outlast a JetStream
	// leader election of the lease bucket (NATS elects within 4-9 s of
	// noticing a lost leader), or losing the node that led the bucket
	// would take every other node's lease with it.
	DefaultLeaseTTL = 15 * time.Second
	// DefaultHeartbeat renews the lease.
	DefaultHeartbeat = 1 * time.Second
)

// The JetStream buckets, shared by every node of a cluster.
const (
	// NodesBucket holds a key n.<id> per live node, with a TTL.
	NodesBucket = "host_nodes"
	// DirBucket holds each object's home node.
	DirBucket = "host_objects"
)

// loadWait bounds how long a starting node waits to read the live set.
const loadWait = 60 * time.Second

// Errors.
var (
	// ErrUnavailable: the leases or the directory cannot be read now.
	ErrUnavailable = abi.ErrUnavailable
	// ErrObjectUnavailable: the object's home node is gone and no replica
	// can serve it yet.
	ErrObjectUnavailable = errors.New("object unavailable")
)

// NodeInfo is what a node publishes about itself with each heartbeat.
type NodeInfo struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	Started     time.Time `json:"started"`
	Objects     int       `json:"objects"`
	Connections int       `json:"connections"`
}

// Config is what a Cluster uses. JetStream, Self and DB are required.
type Config struct {
	// JetStream holds the buckets.
	JetStream jetstream.JetStream
	// Self is this node's id: fresh, never used before in the cluster.
	Self string
	// DB keeps the identities table: the ids this data directory ran
	// under, whose objects are ours to reclaim.
	DB *sql.DB
	// LeaseTTL ends a lease not renewed for this long; Heartbeat renews
	// it. Zero means the defaults.
	LeaseTTL  time.Duration
	Heartbeat time.Duration
	// Replicas is the replication of the buckets; zero means 1.
	Replicas int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Info returns what the heartbeat publishes (its ID is set to Self).
	Info func() NodeInfo
	// NodeGone runs, once per id, when a peer's lease is gone for good.
	NodeGone func(id string)
	// LeaseLost runs, once, when this node's own lease is gone for good:
	// the node must stop and start again under a new id.
	LeaseLost func()
	// LocalObjects lists the objects whose files are in this data
	// directory, for Reclaim.
	LocalObjects func() []Object
	// Moved, when set, runs after this node took an object over from a
	// node that is gone (a reclaim): whoever waited for it to be served
	// again can go on now.
	Moved func(Object)
	// Takeover, when set, lets a live node take over an object whose home
	// is gone (its copies are current): the object's successor claims it
	// in the directory. Unset, such an object is unavailable.
	Takeover bool
	// BeforeWatch, when set, runs before each lease watch starts (tests:
	// a store slow to answer at start-up).
	BeforeWatch func()
}

// Cluster is this node's membership (a lease in JetStream KV, renewed by
// heartbeats) and the object directory (which node is each object's home,
// claimed with compare-and-set).
//
// The Config funcs are called without mu held; they may call the Cluster.
type Cluster struct {
	cfg  Config
	self string
	log  *slog.Logger
	// running is set once Start has launched run; fixed after Start.
	running bool
	nodes   jetstream.KeyValue
	dir     jetstream.KeyValue
	ttl     time.Duration
	beat    time.Duration

	// mu guards the view of other nodes, the lease revision and the
	// directory cache. It is the only lock, held for no I/O.
	mu       sync.Mutex
	seen     map[string]NodeInfo  // live nodes by id, from heartbeats
	lastSeen map[string]time.Time // when each was last heard
	dead     map[string]bool      // ids gone for good
	rev      uint64               // revision of our lease key
	renewed  time.Time            // last successful renewal
	homes    map[Object]string    // directory cache
	previous map[string]bool      // this data directory's earlier node ids

	paused bool // tests: stop renewing to lose the lease
	// mute (tests) drops what the current lease watch delivers after its
	// first read of the store, as a watch whose consumer was lost does.
	mute bool
	// The lease watch's liveness: every renewal of this node's own lease
	// must come back through the watch. watcher is the current one (nil
	// between two), selfRev the latest revision of this node's lease it
	// delivered, unseenRev/unseenSince the first renewal it has not
	// delivered yet (0: none waits).
	watcher     jetstream.KeyWatcher
	selfRev     uint64
	unseenRev   uint64
	unseenSince time.Time
	// watchStalls counts the watches stopped for falling silent.
	watchStalls int
	stop        chan struct{}
	done        chan struct{}
	// loaded is closed once the watch has read every lease in the store:
	// until then this node does not know who is alive, and prunes nothing.
	loaded     chan struct{}
	loadedOnce sync.Once
}

// New returns a Cluster for cfg. Open creates its buckets, Start joins.
func New(cfg Config) (*Cluster, error) {
	switch {
	case cfg.JetStream == nil:
		return nil, errors.New("cluster: no JetStream")
	case cfg.Self == "":
		return nil, errors.New("cluster: no node id")
	case cfg.DB == nil:
		return nil, errors.New("cluster: no database for identities")
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Heartbeat < 0 || cfg.LeaseTTL < 2*cfg.Heartbeat {
		return nil, errors.New("cluster: lease TTL must be at least two heartbeats")
	}
	cfg.Replicas = max(cfg.Replicas, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Info == nil {
		cfg.Info = func() NodeInfo { return NodeInfo{} }
	}
	if cfg.NodeGone == nil {
		cfg.NodeGone = func(string) {}
	}
	if cfg.LeaseLost == nil {
		cfg.LeaseLost = func() {}
	}
	if cfg.LocalObjects == nil {
		cfg.LocalObjects = func() []Object { return nil }
	}
	return &Cluster{
		cfg: cfg, self: cfg.Self, log: cfg.Logger, ttl: cfg.LeaseTTL, beat: cfg.Heartbeat,
		seen: map[string]NodeInfo{}, lastSeen: map[string]time.Time{}, dead: map[string]bool{},
		homes: map[Object]string{}, previous: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{}), loaded: make(chan struct{}),
	}, nil
}

// Self returns this node's id.
func (c *Cluster) Self() string { return c.self }

// Open creates (or finds) the node leases and the object directory.
func (c *Cluster) Open(ctx context.Context) error {
	js, replicas := c.cfg.JetStream, c.cfg.Replicas
	err := RetryJS(ctx, c.log, "node leases and object directory", func(ctx context.Context) error {
		var err error
		c.nodes, err = c.openLeases(ctx, js, replicas)
		if err != nil {
			return err
		}
		c.dir, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: DirBucket, Replicas: replicas, Storage: jetstream.FileStorage, History: 1,
			Description: "object directory: each object's home node",
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster storage (JetStream KV): %w", err)
	}
	return nil
}

// openLeases creates (or updates) the node leases' bucket. Leases are
// kept on file: a NATS server that restarts comes back with the bucket's
// raft log and catches up from where it stopped, where an in-memory copy
// came back empty and needed a full snapshot from the leader before the
// bucket had three current members again; a second failure in that window
// took the quorum (and with it every node's lease). A bucket made in
// memory by an older binary keeps its storage (JetStream cannot change a
// stream's storage in place, and recreating it would drop the live
// leases): it is used as it is, with a warning.
func (c *Cluster) openLeases(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket: NodesBucket, TTL: c.ttl, LimitMarkerTTL: c.ttl, Replicas: replicas, Storage: jetstream.FileStorage,
		Description: "node leases: a key per live node, renewed by heartbeats",
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err == nil {
		return kv, nil
	}
	old, oerr := js.KeyValue(ctx, NodesBucket)
	if oerr != nil {
		return nil, err
	}
	st, serr := old.Status(ctx)
	if serr != nil {
		return nil, err
	}
	info, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || info.StreamInfo().Config.Storage != jetstream.MemoryStorage {
		return nil, err
	}
	cfg.Storage = jetstream.MemoryStorage
	if kv, err = js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return nil, err
	}
	c.log.Warn("the node leases' bucket was made in memory by an earlier version and stays there; a restarted NATS server catches up more slowly from memory", "bucket", NodesBucket)
	return kv, nil
}

// Start joins the cluster under this node's fresh id and keeps its lease
// until Close. It returns once the live set is read: a node must not act on
// who is alive before then.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.loadPrevious(ctx); err != nil {
		return err
	}
	if err := c.join(ctx); err != nil {
		return err
	}
	// Renew from now on: the lease must not lapse while the node starts.
	c.running = true
	go c.run()
	// Nothing is pruned before the live set is read: a peer not yet seen
	// is not a dead one.
	t := time.NewTimer(loadWait)
	defer t.Stop()
	select {
	case <-c.loaded:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%w: could not read the cluster's node leases within %v", ErrUnavailable, loadWait)
	}
}

// Close stops renewing and leaves: the id is gone for good, and peers prune
// what lived here. Its entry is deleted so that peers see it gone at once;
// with leave false (no peer can be reached, so the delete has no quorum and
// could only wait out its timeout) the entry lapses with its lease.
func (c *Cluster) Close(leave bool) {
	if !c.running {
		return
	}
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	if !leave {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.nodes.Delete(ctx, "n."+c.self)
}

// loadPrevious reads the ids this data directory ran under before: objects
// whose home is one of them (and that id is gone) are ours to reclaim,
// because their files are here.
func (c *Cluster) loadPrevious(ctx context.Context) error {
	db := c.cfg.DB
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS identities (id TEXT PRIMARY KEY, started INTEGER NOT NULL)`); err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, `SELECT id FROM identities`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		c.previous[id] = true
	}
	return rows.Err()
}

func (c *Cluster) info() []byte {
	info := c.cfg.Info()
	info.ID = c.self
	b, _ := json.Marshal(info)
	return b
}

// join registers this node's id with a fresh lease. Create fails if the id
// exists: ids are never reused.
//
// A new cluster's bucket may not answer at first ("no response from
// stream"), so the create is tried again like the buckets' own; an
// attempt that landed unheard leaves the key, which is then this
// process's own (ids are fresh per process) and is taken as it is.
func (c *Cluster) join(ctx context.Context) error {
	var rev uint64
	tried, taken := false, false
	err := RetryJS(ctx, c.log, "register node", func(ctx context.Context) error {
		r, err := c.nodes.Create(ctx, "n."+c.self, c.info())
		switch {
		case errors.Is(err, jetstream.ErrKeyExists) && !tried:
			taken = true // not ours: the id was used before
			return nil
		case errors.Is(err, jetstream.ErrKeyExists):
			var e jetstream.KeyValueEntry
			if e, err = c.nodes.Get(ctx, "n."+c.self); err == nil {
				r = e.Revision()
			}
		}
		tried = true
		rev = r
		return err
	})
	if taken {
		err = jetstream.ErrKeyExists
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", c.self, err)
	}
	if _, err := c.cfg.DB.ExecContext(ctx, `INSERT OR IGNORE INTO identities (id, started) VALUES (?, ?)`, c.self, time.Now().UnixNano()); err != nil {
		return err
	}
	c.mu.Lock()
	c.rev, c.renewed = rev, time.Now()
	c.seen[c.self] = NodeInfo{ID: c.self}
	c.lastSeen[c.self] = time.Now()
	// This data directory's earlier ids are dead: this process replaced
	// them. Say so, so peers need not wait for their leases to lapse.
	var old []string
	for id := range c.previous {
		c.markDeadLocked(id)
		old = append(old, id)
	}
	c.mu.Unlock()
	for _, id := range old {
		if _, err := c.nodes.Get(ctx, "n."+id); err == nil {
			c.nodes.Delete(ctx, "n."+id)
		}
	}
	return nil
}

// run renews the lease and watches the other nodes until stopped.
func (c *Cluster) run() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	go c.watch(ctx)
	t := time.NewTicker(c.beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.sweep(ctx)
		c.mu.Lock()
		paused, rev := c.paused, c.rev
		c.mu.Unlock()
		if paused {
			continue
		}
		rctx, rcancel := context.WithTimeout(ctx, c.ttl/2)
		// The lease runs from before the renewal was sent: the store's TTL
		// starts later, so this node never believes in a lease the store
		// has already ended (a node taking its objects over waits for that).
		sent := time.Now()
		newRev, err := c.nodes.Update(rctx, "n."+c.self, c.info(), rev)
		if isWrongSequence(err) {
			// A renewal that timed out on our side may have landed: if the
			// lease is still ours, adopt its revision. Read through the
			// bucket's leader: a direct read may come from a replica that
			// has not seen the renewal yet.
			if rev, ok := c.leaseRevision(rctx); ok {
				newRev, err = c.nodes.Update(rctx, "n."+c.self, c.info(), rev)
			}
		}
		rcancel()
		if err == nil {
			c.mu.Lock()
			c.rev, c.renewed = newRev, sent
			stalled := c.checkWatchLocked(newRev, time.Now())
			c.mu.Unlock()
			if stalled != nil {
				c.log.Warn("the node leases' watch fell silent (this node's own renewals stopped coming through it): watching again")
				stalled.Stop()
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// Only proof ends the lease: the key expired or changed hands. An
		// unreachable store (a leader election after a peer died) is not
		// proof; meanwhile LeaseValid turns false and calls are refused.
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) || isWrongSequence(err) {
			c.log.Error("lease lost: this node's id is gone for good", slog.Any("err", err))
			c.cfg.LeaseLost()
			return
		}
		c.log.Warn("lease renewal failed", slog.Any("err", err))
	}
}

// checkWatchLocked is run after each renewal (revision rev, at now): it
// returns the lease watch to stop when the watch has not delivered a
// renewal of this node's own lease for half a TTL. A watch can fall silent
// without closing (its consumer lost when the bucket changes leader, or
// its server paused), and a node that sees no leases comes and goes would
// never learn of a node that joined, nor see one leave but through the
// sweep; its own renewals are what a live watch must show every beat.
// Called with mu held.
func (c *Cluster) checkWatchLocked(rev uint64, now time.Time) jetstream.KeyWatcher {
	switch {
	case c.selfRev >= c.unseenRev:
		// Everything waited for came through: wait for this one.
		c.unseenRev, c.unseenSince = rev, now
	case now.Sub(c.unseenSince) >= c.ttl/2 && c.watcher != nil:
		w := c.watcher
		c.watcher = nil
		c.unseenRev, c.watchStalls = 0, c.watchStalls+1
		return w
	}
	return nil
}

// leaseRevision reads this node's lease key through the bucket's leader:
// its revision, and whether it is still this node's live lease (a put of
// its own info, not an expiry or delete marker).
func (c *Cluster) leaseRevision(ctx context.Context) (uint64, bool) {
	m, err := c.leaderLease(ctx, c.self)
	if err != nil || m == nil || m.marker() {
		return 0, false
	}
	var info NodeInfo
	if json.Unmarshal(m.Data, &info) != nil || info.ID != c.self {
		return 0, false
	}
	return m.Seq, true
}

// leaseMsg is the last message of a lease key, as the bucket's stream
// stores it.
type leaseMsg struct {
	Seq  uint64 `json:"seq"`
	Hdrs []byte `json:"hdrs"`
	Data []byte `json:"data"`
}

// marker reports a delete or purge marker (an expired lease's among
// them): the lease ended.
func (m *leaseMsg) marker() bool { return bytes.Contains(m.Hdrs, []byte("KV-Operation")) }

// leaderLease reads the last message of node id's lease key through the
// bucket's leader, never a replica: a replica that lags (its server just
// restarted or resumed) may not have a lease created a moment ago. nil
// with no error: the key has no message at all. An error settles nothing
// (no leader, say).
func (c *Cluster) leaderLease(ctx context.Context, id string) (*leaseMsg, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + NodesBucket + ".n." + id})
	m, err := c.cfg.JetStream.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+NodesBucket, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *leaseMsg `json:"message"`
		Error   *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("lease of %s: %w", id, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("lease of %s: %s (%d)", id, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("lease of %s: empty answer", id)
	}
	return resp.Message, nil
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// watch keeps the view of live nodes from the leases bucket.
func (c *Cluster) watch(ctx context.Context) {
	if c.cfg.BeforeWatch != nil {
		c.cfg.BeforeWatch()
	}
	for ctx.Err() == nil {
		w, err := c.nodes.WatchAll(ctx)
		if err != nil {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		c.mu.Lock()
		c.watcher = w
		c.mu.Unlock()
		loaded := false
		for e := range w.Updates() {
			if e == nil {
				// Every lease in the store has been read.
				c.loadedOnce.Do(func() { close(c.loaded) })
				loaded = true
				continue
			}
			id := e.Key()[2:]
			c.mu.Lock()
			if loaded && c.mute {
				c.mu.Unlock()
				continue
			}
			died := false
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var info NodeInfo
				if json.Unmarshal(e.Value(), &info) == nil && !c.dead[id] {
					c.seen[id] = info
					c.lastSeen[id] = time.Now()
				}
				if id == c.self {
					c.selfRev = max(c.selfRev, e.Revision())
				}
			default:
				died = !c.dead[id] && id != c.self
				c.markDeadLocked(id)
			}
			c.mu.Unlock()
			if died {
				c.cfg.NodeGone(id)
			}
		}
		w.Stop()
		c.mu.Lock()
		if c.watcher == w {
			c.watcher = nil
		}
		c.mute = false
		c.mu.Unlock()
	}
}

// PauseRenewals stops (on) or resumes renewing the lease, for tests: the
// node keeps running while its lease runs out.
func (c *Cluster) PauseRenewals(on bool) {
	c.mu.Lock()
	c.paused = on
	c.mu.Unlock()
}

// WatchStalls counts the lease watches stopped and made again because
// they fell silent.
func (c *Cluster) WatchStalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watchStalls
}

func (c *Cluster) markDeadLocked(id string) {
	if id == c.self {
		return
	}
	c.dead[id] = true
	delete(c.seen, id)
	for o, h := range c.homes {
		if h == id {
			delete(c.homes, o)
		}
	}
}

// sweep declares dead the nodes not heard from for a lease TTL (and a
// heartbeat of slack), whether or not an expiry marker arrived. The store
// has the last word: a node whose lease key still exists is alive (our
// watch may lag on a busy machine), one whose key is gone is dead for good.
func (c *Cluster) sweep(ctx context.Context) {
	var suspects []string
	c.mu.Lock()
	for id, last := range c.lastSeen {
		if id != c.self && !c.dead[id] && time.Since(last) > c.ttl+c.beat {
			suspects = append(suspects, id)
		}
	}
	c.mu.Unlock()
	for _, id := range suspects {
		c.askStore(ctx, id)
	}
}

// askStore settles whether id is alive from its lease key, read through
// the bucket's leader: present, it was heard now; a marker or no message,
// id is dead for good (NodeGone runs once). An unreadable store settles
// nothing. A replica's answer is not enough: one that lags does not have
// a lease made a moment ago, and a live node declared dead never comes
// back (its objects taken over while it still serves them, and every
// node's list short of it).
func (c *Cluster) askStore(ctx context.Context, id string) {
	gctx, cancel := context.WithTimeout(ctx, c.ttl/2)
	defer cancel()
	m, err := c.leaderLease(gctx, id)
	switch {
	case err != nil:
	case m != nil && !m.marker():
		c.mu.Lock()
		if !c.dead[id] {
			c.lastSeen[id] = time.Now()
		}
		c.mu.Unlock()
	default:
		c.mu.Lock()
		died := !c.dead[id]
		c.markDeadLocked(id)
		c.mu.Unlock()
		if died {
			c.cfg.NodeGone(id)
		}
	}
}

// Live reports whether a node holds a lease. Node ids never return: once
// dead, always dead. Deaths come from the store (an expired or deleted
// lease), seen by the watch or the sweep.
func (c *Cluster) Live(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == c.self {
		return true
	}
	if c.dead[id] {
		return false
	}
	if _, ok := c.lastSeen[id]; !ok {
		// Not heard of: a node that joined after the watch read the
		// store, or one that was gone before this node started. Neither
		// is proof of death; the sweep asks the store on its next beat.
		c.lastSeen[id] = time.Time{}
	}
	return true
}

// alive is Live with the store's answer for a node not heard of, for
// callers that can wait for it (placing an object).
func (c *Cluster) alive(ctx context.Context, id string) bool {
	c.mu.Lock()
	_, heard := c.lastSeen[id]
	known := id == c.self || c.dead[id] || heard && !c.lastSeen[id].IsZero()
	c.mu.Unlock()
	if known {
		return c.Live(id)
	}
	c.askStore(ctx, id)
	return c.Live(id)
}

// Nodes lists the live nodes, this one with its current info.
func (c *Cluster) Nodes() []NodeInfo {
	c.mu.Lock()
	ids := make([]string, 0, len(c.seen))
	for id := range c.seen {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	var out []NodeInfo
	for _, id := range ids {
		if !c.Live(id) {
			continue
		}
		c.mu.Lock()
		info := c.seen[id]
		c.mu.Unlock()
		if id == c.self {
			if err := json.Unmarshal(c.info(), &info); err != nil {
				continue
			}
		}
		out = append(out, info)
	}
	return out
}

// LeaseValid reports whether this node may still act as a holder: its
// lease was renewed within the TTL less one heartbeat. The store ends a
// lease a TTL after it stored the renewal, which is after this node sent
// it (c.renewed); the heartbeat's margin covers the store's clock, a new
// leader's among them, running ahead of this node's.
func (c *Cluster) LeaseValid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.renewed) < c.ttl-c.beat
}
