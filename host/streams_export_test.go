package host

import "github.com/nats-io/nats.go"

// NATSConn is the node's own NATS connection, for tests that watch the
// hint subjects.
func (n *Node) NATSConn() *nats.Conn { return n.nats.nc }
