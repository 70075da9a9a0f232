package host

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/host/cluster"
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
func (n *Node) newCluster(js jetstream.JetStream, replicas int) (*cluster.Cluster, error) {
	return cluster.New(cluster.Config{
		JetStream: js, Self: n.id, DB: n.db, Replicas: replicas, Logger: n.log,
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
		Moved: func(o cluster.Object) { n.nats.nc.Publish(placedSubject, []byte(ObjectID(o).String())) },
		BeforeWatch: func() {
			if f := beforeLeaseWatch.Load(); f != nil {
				(*f)()
			}
		},
	})
}

// localObjects lists the objects whose file is in this data directory.
func (n *Node) localObjects() []cluster.Object {
	root := filepath.Join(n.cfg.DataDir, "objects")
	progs, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []cluster.Object
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
			out = append(out, cluster.Object(id))
		}
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
