// Package delivery moves a publisher's events to its followers: the pump
// and its lanes, fan-out by node, slicing a connection batch into inboxes,
// filters, retries and backoff, the wire format between nodes, and stream
// subscriptions (seed 003).
//
// It does not own the object file: state, log, edges and cursors are
// store's, read and written through a store.Tx the publisher lends the
// pump between its calls. Transport, membership and the publisher itself
// are interfaces the host implements.
package delivery
