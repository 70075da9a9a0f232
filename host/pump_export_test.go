package host

// PumpLanes reports how many follower lanes the node's pump runs: tests of
// head-of-line blocking (pump_hol_test.go) check that a slow follower's
// delivery is in flight while they measure.
func PumpLanes(n *Node) int { return n.pump.Lanes() }
