package host

// PumpLanes reports how many follower lanes the node's pump runs: tests of
// head-of-line blocking (pump_hol_test.go) check that a slow follower's
// delivery is in flight while they measure.
func PumpLanes(n *Node) int { return n.pump.Lanes() }

// PumpIdle reports whether id is active on n with no pump round running:
// a resumed pump has ended its round.
func PumpIdle(n *Node, id ObjectID) bool {
	n.objects.mu.Lock()
	o := n.objects.active[id]
	n.objects.mu.Unlock()
	return o != nil && !o.pump.running.Load()
}
