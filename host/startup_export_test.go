package host

// Hooks for the restart test in startup_test.go (package host_test).

// SlowLeaseWatch makes every node built until restore is called run f
// before its lease watch starts: a store slow to answer at startup.
func SlowLeaseWatch(f func()) (restore func()) {
	beforeLeaseWatch.Store(&f)
	return func() { beforeLeaseWatch.Store(nil) }
}

// KnowsNode reports whether n's view of the cluster holds the live node
// id; it can be asked between New and Start.
func KnowsNode(n *Node, id string) bool {
	for _, info := range n.cluster.Nodes() {
		if info.ID == id {
			return true
		}
	}
	return false
}

// PooledInstances is how many instances n's engine holds made ahead.
func PooledInstances(n *Node) int { return n.engine.Pooled() }
