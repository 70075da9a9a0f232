package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// Inter-node calls are NATS request/reply on per-node subjects:
// host.node.<id>.<op>. A request carries the time its caller still waits
// (a Timeout header, in ns): the handler's context ends then, so a
// forwarded call stops waiting for an object's lock when its caller has
// given up. Each reply carries a Status header (an HTTP status; 200 = ok)
// and, on failure, a Code header the caller branches on (never the error's
// text) and an Error header, the message for people.
const (
	opCall     = "call"
	opFollow   = "follow"
	opUnfollow = "unfollow"
	opEdges    = "edges"
	opRmEdge   = "rmedge"
	opPrune    = "prune"
	opConns    = "conns"
	opDeliver  = "deliver"
	opRange    = "range"
	opStream   = "stream"
	opReplica  = "replica"
)

func nodeSubject(node, op string) string { return "host.node." + node + "." + op }

// placedSubject carries, to every node, the id of an object that a node
// took over from a node that is gone: publishers waiting for it as an
// unplaced follower route its edges at once.
const placedSubject = "host.placed"

// remoteError is an error that crossed from another node, keeping its
// status and its code.
type remoteError struct {
	status int
	code   string
	msg    string
	reason string // a refused follow's reason, as the hook gave it
}

func (e *remoteError) Error() string { return e.msg }

// Unwrap is the sentinel the code names, so errors.Is holds across nodes.
func (e *remoteError) Unwrap() error { return codeErrors[e.code] }

// Error codes across nodes: each names one sentinel (or a refusal).
const (
	codeNotHome           = "not_home"
	codeRefused           = "refused"
	codeBadRequest        = "bad_request"
	codeTooLarge          = "too_large"
	codeUnavailable       = "unavailable"
	codeObjectUnavailable = "object_unavailable"
	codeUnknownProgram    = "unknown_program"
	codeUnknownObject     = "unknown_object"
	codeNotFound          = "not_found"
	codeConflict          = "conflict"
	codeShuttingDown      = "shutting_down"
	codeOther             = "error"
)

// codeErrors maps a code to its sentinel; most specific first in codeOf.
var codeErrors = map[string]error{
	codeNotHome: errNotHome, codeBadRequest: ErrBadRequest, codeTooLarge: ErrTooLarge,
	codeObjectUnavailable: ErrObjectUnavailable, codeUnavailable: ErrUnavailable,
	codeUnknownProgram: ErrUnknownProgram, codeUnknownObject: ErrUnknownObject,
	codeNotFound: ErrNotFound, codeConflict: ErrConflict, codeShuttingDown: ErrShuttingDown,
}

// codeOf is the code an error crosses with.
func codeOf(err error) string {
	var re *vm.RefusedError
	if errors.As(err, &re) {
		return codeRefused
	}
	for _, c := range []string{codeNotHome, codeObjectUnavailable, codeShuttingDown, codeUnknownProgram,
		codeUnknownObject, codeBadRequest, codeTooLarge, codeNotFound, codeConflict, codeUnavailable} {
		if errors.Is(err, codeErrors[c]) {
			return c
		}
	}
	return codeOther
}

// errNotHome: the node asked does not hold the object (a stale directory
// cache); the caller looks it up again.
var errNotHome = errors.New("not this object's home")

// ErrObjectUnavailable: the object's home node is gone and no replica can
// serve it yet.
var ErrObjectUnavailable = cluster.ErrObjectUnavailable

const (
	hdrStatus  = "Status"
	hdrCode    = "Code"
	hdrError   = "Error"
	hdrReason  = "Reason"
	hdrTimeout = "Timeout"
	hdrObject  = "Object"
	hdrMethod  = "Method"
	hdrArg     = "Arg"
)

// subscribe serves this node's inter-node subjects.
func (n *Node) subscribe() error {
	handlers := map[string]func(context.Context, *nats.Msg) (*nats.Msg, error){
		opCall: n.rpcCall, opFollow: n.rpcFollow, opUnfollow: n.rpcUnfollow,
		opEdges: n.rpcEdges, opRmEdge: n.rpcRemoveEdge, opPrune: n.rpcPrune,
		opConns: n.rpcConns, opDeliver: n.rpcDeliver, opRange: n.rpcRange, opStream: n.rpcStream,
		opReplica: n.rpcReplica,
	}
	placed, err := n.nats.nc.Subscribe(placedSubject, func(m *nats.Msg) {
		n.rpcs.Add(1)
		go func() {
			defer n.rpcs.Done()
			n.followerPlaced(n.bgContext, string(m.Data))
		}()
	})
	if err != nil {
		return err
	}
	n.subs = append(n.subs, placed)
	for op, h := range handlers {
		h := h
		sub, err := n.nats.nc.Subscribe(nodeSubject(n.id, op), func(m *nats.Msg) {
			// Each request runs on its own goroutine: a call may wait for
			// an object's lock, and must not hold up the others.
			n.rpcs.Add(1)
			go func() {
				defer n.rpcs.Done()
				ctx, cancel := n.requestContext(m)
				defer cancel()
				reply, err := h(ctx, m)
				if reply == nil {
					reply = nats.NewMsg(m.Reply)
				}
				reply.Subject = m.Reply
				if reply.Header == nil {
					reply.Header = nats.Header{}
				}
				if err != nil {
					reply.Header.Set(hdrStatus, strconv.Itoa(statusOf(err)))
					reply.Header.Set(hdrCode, codeOf(err))
					reply.Header.Set(hdrError, n.apiMessage(err))
					var re *vm.RefusedError
					if errors.As(err, &re) {
						reply.Header.Set(hdrReason, re.Reason)
					}
				} else {
					reply.Header.Set(hdrStatus, "200")
				}
				if m.Reply != "" {
					n.nats.nc.PublishMsg(reply)
				}
			}()
		})
		if err != nil {
			return err
		}
		sub.SetPendingLimits(-1, -1)
		n.subs = append(n.subs, sub)
	}
	return nil
}

// request sends an inter-node request and turns a failure reply into an
// error that keeps its status.
func (n *Node) request(ctx context.Context, node, op string, m *nats.Msg, timeout time.Duration) (*nats.Msg, error) {
	m.Subject = nodeSubject(node, op)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	if d, ok := rctx.Deadline(); ok {
		m.Header.Set(hdrTimeout, strconv.FormatInt(int64(time.Until(d)), 10))
	}
	// Counted before sending: a socket may have the event before the reply.
	n.metrics.observeRemote(op, len(m.Data))
	reply, err := n.nats.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w: node %s does not answer", ErrUnavailable, node)
		}
		return nil, fmt.Errorf("%w: node %s: %v", ErrUnavailable, node, err)
	}
	if st := reply.Header.Get(hdrStatus); st != "200" {
		status, _ := strconv.Atoi(st)
		code := reply.Header.Get(hdrCode)
		if code == codeNotHome {
			return nil, errNotHome
		}
		return nil, &remoteError{status: status, code: code, msg: reply.Header.Get(hdrError), reason: reply.Header.Get(hdrReason)}
	}
	return reply, nil
}

// requestContext is the context an inter-node request is served under: it
// ends when the caller stops waiting (the Timeout it sent), or at shutdown.
func (n *Node) requestContext(m *nats.Msg) (context.Context, context.CancelFunc) {
	if v, err := strconv.ParseInt(m.Header.Get(hdrTimeout), 10, 64); err == nil && v > 0 {
		return context.WithTimeout(n.bgContext, time.Duration(v))
	}
	return context.WithCancel(n.bgContext)
}

// remoteTimeout bounds a forwarded call: the home may have to activate the
// object (its _initialize) before running the handler.
func (n *Node) remoteTimeout() time.Duration {
	return max(n.cfg.VM.Budget, n.cfg.VM.InitBudget) + n.cfg.VM.Budget + 5*time.Second
}

func objectHeader(m *nats.Msg, id ObjectID) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header.Set(hdrObject, id.String())
}

func msgObject(m *nats.Msg) (ObjectID, error) { return ParseObjectID(m.Header.Get(hdrObject)) }

// ensureHome fails with errNotHome unless this node is obj's home.
func (n *Node) ensureHome(ctx context.Context, obj ObjectID) error {
	h, err := n.cluster.Home(ctx, cluster.Object(obj))
	if err != nil {
		return err
	}
	if h != n.id {
		n.cluster.Forget(cluster.Object(obj))
		return errNotHome
	}
	return nil
}

// atHome reads the object of an inter-node request and checks that this
// node is its home.
func (n *Node) atHome(ctx context.Context, m *nats.Msg) (ObjectID, error) {
	id, err := msgObject(m)
	if err != nil {
		return id, err
	}
	return id, n.ensureHome(ctx, id)
}

// onHome runs local on obj's home: here, or forwarded over NATS by remote.
// A stale directory answer is retried once after a fresh lookup.
func (n *Node) onHome(ctx context.Context, obj ObjectID, local func() error, remote func(node string) error) error {
	for attempt := 0; ; attempt++ {
		if n.objects.isActive(obj) {
			return local()
		}
		h, err := n.cluster.Home(ctx, cluster.Object(obj))
		if err != nil {
			return err
		}
		if h == n.id {
			return local()
		}
		err = remote(h)
		if errors.Is(err, errNotHome) && attempt == 0 {
			n.cluster.Forget(cluster.Object(obj))
			continue
		}
		return err
	}
}

func (n *Node) rpcCall(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	out, err := n.callLocal(ctx, id, m.Header.Get(hdrMethod), m.Data)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Data: out}, nil
}

func (n *Node) forwardCall(ctx context.Context, node string, id ObjectID, method string, payload []byte) ([]byte, error) {
	m := nats.NewMsg("")
	objectHeader(m, id)
	m.Header.Set(hdrMethod, method)
	m.Data = payload
	reply, err := n.request(ctx, node, opCall, m, n.remoteTimeout())
	if err != nil {
		return nil, err
	}
	return reply.Data, nil
}

func (n *Node) rpcFollow(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	req, err := abi.DecodeFollowRequest(m.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: follow request: %v", ErrBadRequest, err)
	}
	e, err := n.followLocal(ctx, id, req, m.Header.Get(hdrArg))
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(e)
	return &nats.Msg{Data: b}, nil
}

func (n *Node) rpcUnfollow(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	req, err := abi.DecodeFollowRequest(m.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: unfollow request: %v", ErrBadRequest, err)
	}
	ok, err := n.unfollowLocal(ctx, id, req.Kind, req.Follower, req.Topic)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Data: []byte(strconv.FormatBool(ok))}, nil
}

func (n *Node) rpcEdges(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	edges, err := n.edgesLocal(ctx, id)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(edges)
	return &nats.Msg{Data: b}, nil
}

func (n *Node) rpcRemoveEdge(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	edge, err := strconv.ParseInt(string(m.Data), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: edge id", ErrBadRequest)
	}
	ok, err := n.removeEdgeLocal(ctx, id, edge)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Data: []byte(strconv.FormatBool(ok))}, nil
}

func (n *Node) rpcPrune(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	id, err := n.atHome(ctx, m)
	if err != nil {
		return nil, err
	}
	n.pruneLocal(ctx, id, string(m.Data))
	return nil, nil
}

// rpcConns is the receiving node's half of a connection batch: decode once,
// slice into this node's inboxes, report refusals and missing sockets.
func (n *Node) rpcConns(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	b, err := delivery.DecodeConnBatch(m.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	res := delivery.Slice(b, n.conns.lookup)
	out, _ := json.Marshal(res)
	return &nats.Msg{Data: out}, nil
}

func (n *Node) rpcDeliver(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	d, err := delivery.DecodeObjectDelivery(m.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	res, err := n.receive(ctx, d)
	if err != nil {
		return nil, err
	}
	out, _ := json.Marshal(res)
	return &nats.Msg{Data: out}, nil
}

// rpcRange serves a range of this node's copy of a publisher's log: the
// holder's part of the read path.
func (n *Node) rpcRange(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	d, err := delivery.DecodeObjectDelivery(m.Data)
	if err != nil || d.Range == nil {
		return nil, fmt.Errorf("%w: range request", ErrBadRequest)
	}
	pub, err := ParseObjectID(d.Publisher)
	if err != nil {
		return nil, err
	}
	evs, err := store.Read(ctx, n.objectPath(pub), d.RangeQuery())
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Data: delivery.AppendEvents(nil, evs)}, nil
}

// remoteTransport carries deliveries to other nodes; the local node is
// served directly.
type remoteTransport struct{ n *Node }

func (t remoteTransport) Connections(ctx context.Context, node string, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	if node == t.n.id {
		return delivery.Slice(b, t.n.conns.lookup), nil
	}
	m := nats.NewMsg("")
	m.Data = delivery.AppendConnBatch(nil, b)
	reply, err := t.n.request(ctx, node, opConns, m, 10*time.Second)
	if err != nil {
		return delivery.ConnResult{}, err
	}
	var res delivery.ConnResult
	return res, json.Unmarshal(reply.Data, &res)
}

func (t remoteTransport) Object(ctx context.Context, node string, d *delivery.ObjectDelivery) (delivery.ObjectResult, error) {
	if node == t.n.id {
		return t.n.receive(ctx, d)
	}
	m := nats.NewMsg("")
	m.Data = delivery.AppendObjectDelivery(nil, d)
	reply, err := t.n.request(ctx, node, opDeliver, m, t.n.remoteTimeout())
	if err != nil {
		return delivery.ObjectResult{}, err
	}
	var res delivery.ObjectResult
	return res, json.Unmarshal(reply.Data, &res)
}

// materializeRemote asks the publisher's home for a range of its log.
func (n *Node) materializeRemote(ctx context.Context, pub ObjectID, d *delivery.ObjectDelivery) ([]abi.Event, error) {
	h, err := n.cluster.Home(ctx, cluster.Object(pub))
	if err != nil {
		return nil, err
	}
	if h == n.id {
		return nil, fmt.Errorf("%w: no local copy of %s", store.ErrNoLog, pub)
	}
	q := *d
	q.Events = nil
	m := nats.NewMsg("")
	m.Data = delivery.AppendObjectDelivery(nil, &q)
	reply, err := n.request(ctx, h, opRange, m, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return delivery.DecodeEvents(reply.Data, d.Publisher)
}

func (n *Node) handleCluster(w http.ResponseWriter, r *http.Request, _ principal) {
	writeJSON(w, http.StatusOK, map[string]any{"self": n.id, "nodes": n.cluster.Nodes()})
}
