package host

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// Cluster defaults (package cluster documents them).
const (
	DefaultLeaseTTL  = cluster.DefaultLeaseTTL
	DefaultHeartbeat = cluster.DefaultHeartbeat
)

// beforeLeaseWatch, when set (by tests), runs before the lease watch
// starts: a slow store at startup.
var beforeLeaseWatch atomic.Pointer[func()]

// replicasFor is the KV replication for a cluster: 3 copies once there are
// enough servers for a quorum to survive one loss.
func replicasFor(peers int) int {
	if peers >= 3 {
		return 3
	}
	return 1
}

// jetStream is the node's JetStream and the replication of the cluster's
// buckets (leases, directory, programs, tenants).
func (n *Node) jetStream() (jetstream.JetStream, int, error) {
	// Replicated writes (a module to the object store) can take a while
	// on a busy machine; the default 5 s is too tight.
	js, err := jetstream.New(n.nats.nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		return nil, 0, err
	}
	replicas := replicasFor(len(n.cfg.NATS.Routes) + 1)
	if n.cfg.NATS.URL != "" {
		replicas = n.cfg.KVReplicas
	}
	return js, replicas, nil
}

// newCluster wires the node's membership and object directory.
func (n *Node) newCluster(js jetstream.JetStream, replicas int, takeover bool) (*cluster.Cluster, error) {
	return cluster.New(cluster.Config{
		JetStream: js, Self: n.id, DB: n.db, Replicas: replicas, Logger: n.log, Takeover: takeover,
		LeaseTTL: n.cfg.LeaseTTL, Heartbeat: n.cfg.Heartbeat,
		Info: func() cluster.NodeInfo {
			return cluster.NodeInfo{
				URL: n.advertisedURL(), Started: n.started,
				Objects: n.objects.count(), Connections: n.conns.count(),
			}
		},
		NodeGone:     n.nodeGone,
		LeaseLost:    n.leaseLost,
		LocalObjects: n.localObjects,
		// A follower taken over here is served again: publishers anywhere
		// whose edges wait for it route them now.
		Moved: func(o cluster.Object) { n.nats.nc.Publish(placedSubject, []byte(ObjectID(o).String()+"\n"+n.id)) },
		BeforeWatch: func() {
			if f := beforeLeaseWatch.Load(); f != nil {
				(*f)()
			}
		},
	})
}

// localObjects lists the objects whose file is in this data directory.
func (n *Node) localObjects() []cluster.Object {
	var out []cluster.Object
	for _, id := range objectFiles(filepath.Join(n.cfg.DataDir, "objects")) {
		out = append(out, cluster.Object(id))
	}
	return out
}

// clusterMembership answers the pump's questions from the cluster view.
type clusterMembership struct{ c *cluster.Cluster }

func (m clusterMembership) Self() string        { return m.c.Self() }
func (m clusterMembership) Live(id string) bool { return m.c.Live(id) }
func (m clusterMembership) Locate(ctx context.Context, object string) (string, error) {
	id, err := ParseObjectID(object)
	if err != nil {
		return "", err
	}
	return m.c.Home(ctx, cluster.Object(id))
}

// newReplicas wires replication: the change stream (replicated like the
// buckets) and this node's copies.
func (n *Node) newReplicas(ctx context.Context, js jetstream.JetStream, streamReplicas, copies int) (*replicas, error) {
	var log *replica.Log
	err := cluster.RetryJS(ctx, n.log, "change stream", func(ctx context.Context) error {
		var err error
		log, err = replica.Open(ctx, replica.Config{JetStream: js, Replicas: streamReplicas, MaxPayload: int(n.nats.nc.MaxPayload())})
		return err
	})
	if err != nil {
		return nil, err
	}
	r := &replicas{
		log: log, self: n.id, copies: copies, dir: filepath.Join(n.cfg.DataDir, "replicas"), snapEvery: n.cfg.SnapshotEvery,
		cl: n.cluster, fenced: n.fenced, homePath: n.objectPath, logger: n.log,
		async: n.cfg.ReplicaAck == ReplicaAsync, ctx: n.bgContext,
		// The registry is made once the buckets are open, after this.
		active: func(id ObjectID) bool { return n.objects.isActive(id) },
		open:   map[ObjectID]*store.File{},
		// As many copies open as active objects: a node that keeps a
		// copy of half the cluster's objects (one with no homes, after a
		// rejoin) applies to all of them.
		maxOpen: n.cfg.MaxActiveObjects,
	}
	n.metrics.replicaCounters(log.Stats, r.opens.Load)
	return r, nil
}

// fenced drops an object this node can no longer write (another node took
// it over, or a change set's fate is unknown): the next call finds its
// home in the directory again, and if that is here, catches the file up.
func (n *Node) fenced(id ObjectID) {
	n.cluster.Forget(cluster.Object(id))
	go func() {
		n.objects.evict(id)
		n.retire(id)
	}()
}

// retire takes the home file of an object another node holds now out of
// this node's objects: kept as this node's copy when it keeps one (it is
// a prefix of the stream, or found diverged and made again, never
// skipped), else deleted. A stale home file would otherwise count against
// its tenant's storage here and be taken for a home's. An object this
// node holds again, or whose holder is unknown, keeps its file.
func (n *Node) retire(id ObjectID) {
	if n.replicas == nil || n.objects.isActive(id) {
		return
	}
	h, err := n.cluster.Holder(n.bgContext, cluster.Object(id))
	if err != nil || h == "" || h == n.id {
		return
	}
	path := n.objectPath(id)
	if _, err := os.Stat(path); err != nil {
		return
	}
	kept, err := n.replicas.keepAsCopy(id, h, path)
	if err != nil {
		n.log.Warn("retire a taken-over object's file", slog.String("object", id.String()), slog.Any("err", err))
		return
	}
	n.log.Info("object taken over elsewhere: its file here is retired", slog.String("object", id.String()), slog.String("home", h), slog.Bool("kept_as_copy", kept))
}

// takeOver claims, after a node is gone, the objects this node keeps a
// copy of whose home it was and whose successor this node is, and starts
// them: their deliveries go on without waiting for a call.
func (n *Node) takeOver(gone string) {
	ctx := n.bgContext
	want := map[string][]string{}
	for _, id := range n.replicas.copyIDs() {
		if h, err := n.cluster.Holder(ctx, cluster.Object(id)); err != nil || h != gone {
			continue
		}
		if h, err := n.cluster.Home(ctx, cluster.Object(id)); err == nil && h == n.id {
			n.takeHome(id)
			// Its copies are on the nodes next in its order now: this
			// node's copy became the home file, and one more node keeps
			// one. An idle object would otherwise wait for its next
			// write to have them again.
			for _, c := range n.cluster.Copies(cluster.Object(id), n.id, n.replicas.copies) {
				want[c] = append(want[c], id.String())
			}
		}
	}
	n.askCopies(ctx, want)
}

// takeHome opens, in the background, the file of an object this node
// took over as its home, then starts its deliveries. Opening it writes the
// takeover mark, which fences the old home (paused, not dead, it may come
// back); so a failed opening (the change stream electing a leader after
// a node died) is tried again, backing off as copies do, rather than left
// for the object's next call, which an idle object may never get. It stops
// when the object is held elsewhere, the node stops, or the attempts run
// out.
func (n *Node) takeHome(id ObjectID) {
	n.goCounted(func() {
		ctx := n.bgContext
		wait := copyRetryBase
		for attempt := 1; ; attempt++ {
			err := n.openAsHome(ctx, id)
			if err == nil {
				n.kick(id)
				return
			}
			if errors.Is(err, ErrShuttingDown) || errors.Is(err, errDeactivated) || ctx.Err() != nil {
				return
			}
			if attempt == copyRetryAttempts {
				n.log.Error("open a taken-over object: giving up until its next call", slog.String("object", id.String()), slog.Int("attempts", attempt), slog.Any("err", err))
				return
			}
			n.log.Warn("open a taken-over object", slog.String("object", id.String()), slog.Duration("again_after", wait), slog.Any("err", err))
			t := time.NewTimer(wait)
			select {
			case <-n.stop:
				t.Stop()
				return
			case <-t.C:
			}
			if h, err := n.cluster.Holder(ctx, cluster.Object(id)); err == nil && h != n.id {
				return
			}
			wait = min(2*wait, 32*time.Second)
		}
	})
}

// openAsHome opens id's file on this node, as a call would.
func (n *Node) openAsHome(ctx context.Context, id ObjectID) error {
	o, err := n.objects.acquire(id)
	if err != nil {
		return err
	}
	defer n.objects.release(o)
	if err := o.lock(ctx); err != nil {
		return err
	}
	defer o.unlock()
	return o.readyFile(ctx)
}

// recopy, after node gone left, asks the nodes that keep copies of the
// objects homed here in its place to make them now: an idle object would
// otherwise have one copy fewer until its next write. The same runs when a
// node is stopped gracefully (its lease is deleted, so it is gone at once).
func (n *Node) recopy(gone string) {
	ctx := n.bgContext
	want := map[string][]string{}
	for _, id := range objectFiles(filepath.Join(n.cfg.DataDir, "objects")) {
		obj := cluster.Object(id)
		if !n.cluster.WasCopy(obj, n.id, gone, n.replicas.copies) {
			continue
		}
		if h, err := n.cluster.Holder(ctx, obj); err != nil || h != n.id {
			continue
		}
		for _, c := range n.cluster.Copies(obj, n.id, n.replicas.copies) {
			want[c] = append(want[c], id.String())
		}
	}
	n.askCopies(ctx, want)
}

// askCopies asks each node to make its copies of the objects (homed here)
// listed for it, 1,000 per request.
func (n *Node) askCopies(ctx context.Context, want map[string][]string) {
	for node, objs := range want {
		for len(objs) > 0 {
			k := min(len(objs), 1000)
			if _, err := opCopies.on(ctx, n, node, copiesRequest{Home: n.id, Objects: objs[:k]}); err != nil {
				n.log.Warn("ask a node to make copies", slog.String("node", node), slog.Int("objects", k), slog.Any("err", err))
			}
			objs = objs[k:]
		}
	}
}

var opCopies = nodeOp("copies", quickWait, (*Node).copiesLocal)

// copiesRequest names objects homed on Home whose copies the receiving
// node now keeps.
type copiesRequest struct {
	Home    string   `json:"home"`
	Objects []string `json:"objects"`
}

// copiesLocal makes, in the background, this node's copies of the objects
// named (those Home, which holds them, says this node keeps), caught up to
// their streams' ends.
func (n *Node) copiesLocal(_ context.Context, req copiesRequest) (*struct{}, error) {
	if n.replicas == nil {
		return nil, nil
	}
	go func() {
		for _, s := range req.Objects {
			id, err := ParseObjectID(s)
			// The home's view of who keeps a copy is the one to follow:
			// this node may not have seen the node that left go yet, and
			// would think itself no copy. A copy it keeps for nothing is
			// dropped at the object's next change set.
			if err != nil || n.objects.isActive(id) {
				continue
			}
			if err := n.replicas.ensure(n.bgContext, id); err != nil {
				n.log.Warn("make a copy", slog.String("object", s), slog.Any("err", err))
				n.replicas.retry(n.bgContext, id, "")
			}
		}
	}()
	return nil, nil
}

// ReplicaReport is where an object's file and its copies are, and how far
// each is along its change stream: what `host replicas` shows.
type ReplicaReport = api.ReplicaReport

// Nodes lists the cluster's live nodes.
func (n *Node) Nodes() []cluster.NodeInfo { return n.cluster.Nodes() }

// Replicas reports where id's file and its copies are.
func (n *Node) Replicas(ctx context.Context, id ObjectID) (ReplicaReport, error) {
	rep := ReplicaReport{Object: id.String(), Copies: []CopyInfo{}}
	home, err := n.cluster.Holder(ctx, cluster.Object(id))
	if err != nil {
		return rep, err
	}
	rep.Home = home
	if n.replicas == nil {
		if home == n.id {
			p, _ := store.ReadPosition(ctx, n.objectPath(id))
			rep.Copies = append(rep.Copies, CopyInfo{Node: n.id, Home: true, Position: p})
		}
		return rep, nil
	}
	rep.Want = n.replicas.copies
	if rep.Stream, err = n.replicas.log.Last(ctx, subjectOf(id)); err != nil {
		return rep, err
	}
	// Every node is asked at once: one that is slow to answer (busy
	// restoring copies after a restart, or gone and not yet known to be)
	// costs the report one timeout, not one per node.
	nodes := n.cluster.Nodes()
	infos := make([]*CopyInfo, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() {
			infos[i], errs[i] = opReplica.on(ctx, n, node.ID, replicaRequest{Object: id.String(), Home: home == node.ID})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			rep.Unanswered = append(rep.Unanswered, nodes[i].ID+": "+err.Error())
		}
	}
	for _, info := range infos {
		if info == nil {
			continue
		}
		if rep.Stream.Applied > info.Position.Applied {
			info.Lag = rep.Stream.Applied - info.Position.Applied
		}
		rep.Copies = append(rep.Copies, *info)
	}
	sort.SliceStable(rep.Copies, func(i, j int) bool { return rep.Copies[i].Home && !rep.Copies[j].Home })
	return rep, nil
}

// opReplica asks a node about its copy of an object, or its file when it
// is the object's home.
var opReplica = nodeOp("replica", 5*time.Second, (*Node).replicaLocal)

type replicaRequest struct {
	Object string `json:"object"`
	Home   bool   `json:"home,omitempty"` // the node asked is the home
}

// replicaLocal describes this node's copy (or home file) of an object; nil
// when it has neither.
func (n *Node) replicaLocal(ctx context.Context, req replicaRequest) (*CopyInfo, error) {
	id, err := ParseObjectID(req.Object)
	if err != nil || n.replicas == nil {
		return nil, err
	}
	info, ok, err := n.replicas.info(ctx, id, n.objectPath(id), req.Home)
	if err != nil || !ok {
		return nil, err
	}
	return &info, nil
}

// ReplicaStats reports what this node shipped and applied (zero without
// copies).
func (n *Node) ReplicaStats() replica.Stats {
	if n.replicas == nil {
		return replica.Stats{}
	}
	return n.replicas.log.Stats()
}
