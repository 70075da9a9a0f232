package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
)

// IdempotencyKeyHeader names the header that makes a method call once in
// effect: a repeat with the same key, method and payload gets the first
// call's reply without the method running again; the same key with
// another method or payload is refused with 422.
const IdempotencyKeyHeader = "Idempotency-Key"

// ServedByHeader, on a call's reply, is the id of the node that ran the
// call: the object's home when it ran. A client that reaches the object
// through several nodes can tell from it which home answered each call.
const ServedByHeader = "Host-Served-By"

type servedByKey struct{}

// WithServedBy returns ctx with a place for the id of the node that runs
// the call made with it, and that place.
func WithServedBy(ctx context.Context) (context.Context, *string) {
	var node string
	return context.WithValue(ctx, servedByKey{}, &node), &node
}

// SetServedBy records node as the one that ran the call ctx belongs to;
// nothing when ctx has no place for it.
func SetServedBy(ctx context.Context, node string) {
	if p, ok := ctx.Value(servedByKey{}).(*string); ok {
		*p = node
	}
}

func (s *server) handleCall(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	payload, err := readBody(w, r, s.cfg.MaxPayload)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	ctx, servedBy := WithServedBy(r.Context())
	reply, err := s.b.CallWithKey(ctx, id, r.PathValue("method"), payload, r.Header.Get(IdempotencyKeyHeader))
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	if *servedBy != "" {
		w.Header().Set(ServedByHeader, *servedBy)
	}
	if json.Valid(reply) && len(reply) > 0 {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Write(reply)
}

func (s *server) handleEdges(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	edges, err := s.b.Edges(r.Context(), id)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": names.Show(p, id), "edges": edges})
}

// ReplicaReport is where an object's file and its copies are, and how far
// each is along its change stream: what `host replicas` shows.
type ReplicaReport struct {
	Object string `json:"object"`
	// Home is the directory's holder ("" before the object's first use).
	Home string `json:"home"`
	// Want is the copies each object keeps besides its home (--replicas).
	Want int `json:"want"`
	// Stream is the change stream's last change set.
	Stream replica.Tail `json:"stream"`
	// Copies lists the home's file first, then every copy on a live node.
	Copies []CopyInfo `json:"copies"`
	// Unanswered lists the live nodes that did not say in time whether
	// they keep a copy ("ID: why"); none when every node answered.
	Unanswered []string `json:"unanswered,omitempty"`
}

// CopyInfo is one node's copy of an object, for `host replicas`.
type CopyInfo struct {
	Node     string         `json:"node"`
	Home     bool           `json:"home,omitempty"`
	Position store.Position `json:"position"`
	Lag      uint64         `json:"lag"` // change sets behind the stream's end
	// Unshipped is, on the home under async acknowledgement, how many
	// change sets it committed that are not in the stream yet.
	Unshipped int `json:"unshipped,omitempty"`
}

func (s *server) handleReplicas(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	rep, err := s.b.Replicas(r.Context(), id)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	rep.Object = names.Show(p, id)
	writeJSON(w, http.StatusOK, rep)
}

func (s *server) handleDeleteEdge(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	edge, err := strconv.ParseInt(r.PathValue("edge"), 10, 64)
	if err != nil {
		s.failAs(w, p, fmt.Errorf("%w: edge must be a number", abi.ErrBadRequest))
		return
	}
	ok, err := s.b.RemoveEdge(r.Context(), id, edge)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	if !ok {
		s.failAs(w, p, fmt.Errorf("%w: %s has no edge %d", names.ErrUnknownObject, names.Show(p, id), edge))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": names.Show(p, id), "removed": edge})
}
