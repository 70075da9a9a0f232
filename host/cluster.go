package host

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Cluster defaults.
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

const (
	nodesBucket = "host_nodes"
	dirBucket   = "host_objects"
)

// nodeInfo is what a node publishes about itself with each heartbeat.
type nodeInfo struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	Started     time.Time `json:"started"`
	Objects     int       `json:"objects"`
	Connections int       `json:"connections"`
}

// cluster is this node's membership (a lease in JetStream KV, renewed by
// heartbeats) and the object directory (which node is each object's home,
// claimed with compare-and-set).
type cluster struct {
	n  *Node
	js jetstream.JetStream
	// running is set once start has launched run; fixed after New.
	running bool
	nodes   jetstream.KeyValue
	dir     jetstream.KeyValue
	ttl     time.Duration
	beat    time.Duration
	// replicas is the replication of the cluster's buckets.
	replicas int

	// mu guards the view of other nodes, the lease revision and the
	// directory cache.
	mu       sync.Mutex
	seen     map[string]nodeInfo  // live nodes by id, from heartbeats
	lastSeen map[string]time.Time // when each was last heard
	dead     map[string]bool      // ids gone for good
	rev      uint64               // revision of our lease key
	renewed  time.Time            // last successful renewal
	homes    map[ObjectID]string  // directory cache
	previous map[string]bool      // this data directory's earlier node ids

	paused bool // tests: stop renewing to lose the lease
	stop   chan struct{}
	done   chan struct{}
	// loaded is closed once the watch has read every lease in the store:
	// until then this node does not know who is alive, and prunes nothing.
	loaded     chan struct{}
	loadedOnce sync.Once
}

// loadWait bounds how long a starting node waits to read the live set.
const loadWait = 60 * time.Second

// ErrLeaseLost: this node's lease lapsed; it must rejoin under a new id.
var ErrLeaseLost = errors.New("node lease lost")

// retryJS retries f while JetStream is not ready yet: a fresh cluster needs
// a moment to elect its meta leader and to learn its peers. It says so in
// the log every few seconds, so a node waiting for peers that never come
// (a wrong route, another --nats-cluster-name) does not look hung.
func retryJS(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	lastLog := start
	// Until the cluster has a meta leader its API does not answer at all,
	// so a short first timeout finds it ready sooner; a busy but working
	// cluster gets more time on each attempt.
	timeout := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		timeout = min(2*timeout, 10*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			log.Warn("waiting for the NATS cluster's JetStream", "for", what, "waited", time.Since(start).Round(time.Second), "error", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func dirKey(id ObjectID) string {
	return "o." + id.Program + "." + hex.EncodeToString([]byte(id.ID))
}

// replicasFor is the KV replication for a cluster: 3 copies once there are
// enough servers for a quorum to survive one loss.
func replicasFor(peers int) int {
	if peers >= 3 {
		return 3
	}
	return 1
}

func newCluster(ctx context.Context, n *Node) (*cluster, error) {
	// Replicated writes (a module to the object store) can take a while
	// on a busy machine; the default 5 s is too tight.
	js, err := jetstream.New(n.nats.nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		return nil, err
	}
	c := &cluster{
		n: n, js: js, ttl: n.cfg.LeaseTTL, beat: n.cfg.Heartbeat,
		seen: map[string]nodeInfo{}, lastSeen: map[string]time.Time{}, dead: map[string]bool{},
		homes: map[ObjectID]string{}, previous: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{}), loaded: make(chan struct{}),
	}
	replicas := replicasFor(len(n.cfg.NATS.Routes) + 1)
	if n.cfg.NATS.URL != "" {
		replicas = n.cfg.KVReplicas
	}
	c.replicas = replicas
	return c, nil
}

// openBuckets creates (or finds) the node leases and the object directory.
func (c *cluster) openBuckets(ctx context.Context) error {
	js, replicas := c.js, c.replicas
	err := retryJS(ctx, c.n.log, "node leases and object directory", func(ctx context.Context) error {
		var err error
		c.nodes, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: nodesBucket, TTL: c.ttl, LimitMarkerTTL: c.ttl, Replicas: replicas, Storage: jetstream.MemoryStorage,
			Description: "node leases: a key per live node, renewed by heartbeats",
		})
		if err != nil {
			return err
		}
		c.dir, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: dirBucket, Replicas: replicas, Storage: jetstream.FileStorage, History: 1,
			Description: "object directory: each object's home node",
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster storage (JetStream KV): %w", err)
	}
	return nil
}

// start joins the cluster under this node's fresh id and keeps its lease.
func (c *cluster) start(ctx context.Context) error {
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

// loadPrevious reads the ids this data directory ran under before: objects
// whose home is one of them (and that id is gone) are ours to reclaim,
// because their files are here.
func (c *cluster) loadPrevious(ctx context.Context) error {
	db := c.n.db
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

func (c *cluster) info() []byte {
	b, _ := json.Marshal(nodeInfo{
		ID: c.n.id, URL: c.n.advertisedURL(), Started: c.n.started,
		Objects: c.n.objects.count(), Connections: c.n.conns.count(),
	})
	return b
}

// join registers this node's id with a fresh lease. Create fails if the id
// exists: ids are never reused.
func (c *cluster) join(ctx context.Context) error {
	rev, err := c.nodes.Create(ctx, "n."+c.n.id, c.info())
	if err != nil {
		return fmt.Errorf("register node %s: %w", c.n.id, err)
	}
	if _, err := c.n.db.ExecContext(ctx, `INSERT OR IGNORE INTO identities (id, started) VALUES (?, ?)`, c.n.id, time.Now().UnixNano()); err != nil {
		return err
	}
	c.mu.Lock()
	c.rev, c.renewed = rev, time.Now()
	c.seen[c.n.id] = nodeInfo{ID: c.n.id}
	c.lastSeen[c.n.id] = time.Now()
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
func (c *cluster) run() {
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
		select {
		case <-c.n.lost:
			return
		default:
		}
		if paused {
			continue
		}
		rctx, rcancel := context.WithTimeout(ctx, c.ttl/2)
		newRev, err := c.nodes.Update(rctx, "n."+c.n.id, c.info(), rev)
		if isWrongSequence(err) {
			// A renewal that timed out on our side may have landed: if the
			// lease is still ours, adopt its revision.
			if e, gerr := c.nodes.Get(rctx, "n."+c.n.id); gerr == nil {
				var info nodeInfo
				if json.Unmarshal(e.Value(), &info) == nil && info.ID == c.n.id {
					newRev, err = c.nodes.Update(rctx, "n."+c.n.id, c.info(), e.Revision())
				}
			}
		}
		rcancel()
		if err == nil {
			c.mu.Lock()
			c.rev, c.renewed = newRev, time.Now()
			c.mu.Unlock()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// Only proof ends the lease: the key expired or changed hands. An
		// unreachable store (a leader election after a peer died) is not
		// proof; meanwhile leaseValid turns false and calls are refused.
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) || isWrongSequence(err) {
			c.n.log.Error("lease lost: this node's id is gone for good", slog.Any("err", err))
			c.n.leaseLost()
			return
		}
		c.n.log.Warn("lease renewal failed", slog.Any("err", err))
	}
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// beforeLeaseWatch, when set (by tests), runs before the lease watch
// starts: a slow store at startup.
var beforeLeaseWatch atomic.Pointer[func()]

// watch keeps the view of live nodes from the leases bucket.
func (c *cluster) watch(ctx context.Context) {
	if f := beforeLeaseWatch.Load(); f != nil {
		(*f)()
	}
	for ctx.Err() == nil {
		w, err := c.nodes.WatchAll(ctx)
		if err != nil {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		for e := range w.Updates() {
			if e == nil {
				// Every lease in the store has been read.
				c.loadedOnce.Do(func() { close(c.loaded) })
				continue
			}
			id := e.Key()[2:]
			c.mu.Lock()
			died := false
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var info nodeInfo
				if json.Unmarshal(e.Value(), &info) == nil && !c.dead[id] {
					c.seen[id] = info
					c.lastSeen[id] = time.Now()
				}
			default:
				died = !c.dead[id] && id != c.n.id
				c.markDeadLocked(id)
			}
			c.mu.Unlock()
			if died {
				c.n.nodeGone(id)
			}
		}
		w.Stop()
	}
}

func (c *cluster) markDeadLocked(id string) {
	if id == c.n.id {
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
func (c *cluster) sweep(ctx context.Context) {
	var suspects []string
	c.mu.Lock()
	for id, last := range c.lastSeen {
		if id != c.n.id && !c.dead[id] && time.Since(last) > c.ttl+c.beat {
			suspects = append(suspects, id)
		}
	}
	c.mu.Unlock()
	for _, id := range suspects {
		gctx, cancel := context.WithTimeout(ctx, c.ttl/2)
		_, err := c.nodes.Get(gctx, "n."+id)
		cancel()
		switch {
		case err == nil:
			c.mu.Lock()
			c.lastSeen[id] = time.Now()
			c.mu.Unlock()
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			c.mu.Lock()
			died := !c.dead[id]
			c.markDeadLocked(id)
			c.mu.Unlock()
			if died {
				c.n.nodeGone(id)
			}
		}
	}
}

// Live reports whether a node holds a lease. Node ids never return: once
// dead, always dead. Deaths come from the store (an expired or deleted
// lease), seen by the watch or the sweep.
func (c *cluster) Live(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == c.n.id {
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
func (c *cluster) alive(ctx context.Context, id string) bool {
	c.mu.Lock()
	_, heard := c.lastSeen[id]
	known := id == c.n.id || c.dead[id] || heard && !c.lastSeen[id].IsZero()
	c.mu.Unlock()
	if known {
		return c.Live(id)
	}
	gctx, cancel := context.WithTimeout(ctx, c.ttl/2)
	defer cancel()
	_, err := c.nodes.Get(gctx, "n."+id)
	switch {
	case err == nil:
		c.mu.Lock()
		if !c.dead[id] {
			c.lastSeen[id] = time.Now()
		}
		c.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		c.mu.Lock()
		died := !c.dead[id]
		c.markDeadLocked(id)
		c.mu.Unlock()
		if died {
			c.n.nodeGone(id)
		}
	}
	return c.Live(id)
}

// nodes lists the live nodes.
func (c *cluster) liveNodes() []nodeInfo {
	c.mu.Lock()
	ids := make([]string, 0, len(c.seen))
	for id := range c.seen {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	var out []nodeInfo
	for _, id := range ids {
		if !c.Live(id) {
			continue
		}
		c.mu.Lock()
		info := c.seen[id]
		c.mu.Unlock()
		if id == c.n.id {
			var err error
			if err = json.Unmarshal(c.info(), &info); err != nil {
				continue
			}
		}
		out = append(out, info)
	}
	return out
}

// home returns the node that is obj's home, claiming it for this node if it
// has none. An object whose home is one of this data directory's earlier ids
// is reclaimed (its file is here). An object whose home is another node
// that is gone is unavailable until replicas can move it.
func (c *cluster) home(ctx context.Context, obj ObjectID) (string, error) {
	c.mu.Lock()
	h, ok := c.homes[obj]
	c.mu.Unlock()
	if ok && (h == c.n.id || c.Live(h)) {
		return h, nil
	}
	key := dirKey(obj)
	for attempt := 0; attempt < 5; attempt++ {
		e, err := c.dir.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err := c.dir.Create(ctx, key, []byte(c.n.id)); err == nil {
				return c.cache(obj, c.n.id), nil
			}
			continue // someone else claimed it first: read again
		case err != nil:
			return "", fmt.Errorf("%w: object directory: %v", ErrUnavailable, err)
		}
		holder := string(e.Value())
		if holder == c.n.id || c.alive(ctx, holder) {
			return c.cache(obj, holder), nil
		}
		c.mu.Lock()
		mine := c.previous[holder]
		c.mu.Unlock()
		if mine {
			// Fencing: the compare-and-set fails if anyone moved it meanwhile.
			if _, err := c.dir.Update(ctx, key, []byte(c.n.id), e.Revision()); err == nil {
				return c.cache(obj, c.n.id), nil
			}
			continue
		}
		return "", fmt.Errorf("%w: %s lived on node %s, which is gone; it is served again once its replica is taken over", ErrObjectUnavailable, obj, holder)
	}
	return "", fmt.Errorf("%w: %s: directory contention", ErrUnavailable, obj)
}

func (c *cluster) cache(obj ObjectID, node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.homes[obj] = node
	return node
}

// forget drops a cached home (a forward found it stale).
func (c *cluster) forget(obj ObjectID) {
	c.mu.Lock()
	delete(c.homes, obj)
	c.mu.Unlock()
}

// leaseValid reports whether this node may still act as a holder: its lease
// was renewed within the TTL.
func (c *cluster) leaseValid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.renewed) < c.ttl
}

func (c *cluster) close() {
	if !c.running {
		return
	}
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Leaving: the id is gone for good; peers prune its connections.
	c.nodes.Delete(ctx, "n."+c.n.id)
}

// reclaim takes back, in the directory, every object whose file is in this
// data directory and whose home is one of its earlier ids: after a restart
// its followers and callers find it here again.
func (c *cluster) reclaim(ctx context.Context) {
	root := filepath.Join(c.n.cfg.DataDir, "objects")
	progs, err := os.ReadDir(root)
	if err != nil {
		return
	}
	n := 0
	for _, p := range progs {
		files, _ := os.ReadDir(filepath.Join(root, p.Name()))
		for _, f := range files {
			name, ok := strings.CutSuffix(f.Name(), ".db")
			if !ok {
				continue
			}
			id := ObjectID{p.Name(), name}
			if id.Validate() != nil {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if h, err := c.home(ctx, id); err == nil && h == c.n.id {
				n++
			}
		}
	}
	if n > 0 {
		c.n.log.Info("objects home here", slog.Int("count", n))
	}
}
