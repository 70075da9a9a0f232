package host

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// Inter-node calls are NATS request/reply on per-node subjects,
// host.node.<id>.<op>, through one typed layer: each operation is an op
// value (its name, its request and reply types, its local function), one
// codec encodes every request and reply, subscribe serves every op, and
// onHome / on run one locally or send it. A request carries the time its
// caller still waits (a Timeout header, in ns): the handler's context ends
// then, so a forwarded call stops waiting for an object's lock when its
// caller has given up. Each reply carries a Status header (an HTTP status;
// 200 = ok) and, on failure, a Code header the caller branches on (never
// the error's text), an Error header, the message for people, and for a
// refusal the hook's Reason.

// An op is one inter-node operation. To add one, declare it beside its
// local function with objectOp or nodeOp, list it in ops, and call it with
// onHome or on.
type op[Req, Rep any] struct {
	name string // the last token of its subject, and its metrics label
	// home: the request names an object and is served only on its home,
	// which the serving node checks first. Otherwise the caller names the
	// node.
	home bool
	// timeout bounds a caller's wait; zero is remoteTimeout (time to
	// activate the object and run a handler).
	timeout time.Duration
	local   func(n *Node, ctx context.Context, obj ObjectID, req Req) (Rep, error)
}

// objectOp is an op served on the home of the object its request names.
func objectOp[Req, Rep any](name string, timeout time.Duration, local func(*Node, context.Context, ObjectID, Req) (Rep, error)) *op[Req, Rep] {
	return &op[Req, Rep]{name: name, home: true, timeout: timeout, local: local}
}

// nodeOp is an op served on the node its caller names.
func nodeOp[Req, Rep any](name string, timeout time.Duration, local func(*Node, context.Context, Req) (Rep, error)) *op[Req, Rep] {
	return &op[Req, Rep]{name: name, timeout: timeout, local: func(n *Node, ctx context.Context, _ ObjectID, req Req) (Rep, error) {
		return local(n, ctx, req)
	}}
}

// quickWait bounds an op that neither activates an object nor runs a
// handler.
const quickWait = 10 * time.Second

// ops is every inter-node operation; subscribe serves them all.
var ops = []handler{opCall, opFollow, opUnfollow, opEdges, opRemoveEdge, opPrune, opStream, opConns, opDeliver, opRange, opReplica, opCopies, opObjects, opState, opLog, opNewVersion}

// handler is an op as its subscription sees it, whatever its types.
type handler interface {
	opName() string
	serve(ctx context.Context, n *Node, m *nats.Msg) (*nats.Msg, error)
}

func (o *op[Req, Rep]) opName() string { return o.name }

// serve answers one request on this node: check the home, decode, run
// local, encode.
func (o *op[Req, Rep]) serve(ctx context.Context, n *Node, m *nats.Msg) (*nats.Msg, error) {
	var obj ObjectID
	if o.home {
		var err error
		if obj, err = ParseObjectID(m.Header.Get(hdrObject)); err != nil {
			return nil, err
		}
		if err := n.ensureHome(ctx, obj); err != nil {
			return nil, err
		}
	}
	var req Req
	if err := decode(m, &req); err != nil {
		return nil, fmt.Errorf("%w: %s request: %v", ErrBadRequest, o.name, err)
	}
	// An object's op says which node ran it (a call's reply names its
	// home); a node op, a delivery say, is not asked.
	var none string
	servedBy := &none
	if o.home {
		ctx, servedBy = api.WithServedBy(ctx)
	}
	rep, err := o.local(n, ctx, obj, req)
	if err != nil {
		return nil, err
	}
	out := &nats.Msg{Header: nats.Header{}}
	if *servedBy != "" {
		out.Header.Set(hdrServedBy, *servedBy)
	}
	if err := encode(out, rep); err != nil {
		return nil, fmt.Errorf("%s reply: %w", o.name, err)
	}
	return out, nil
}

// onHome runs o on obj's home: here, or sent over NATS. A stale directory
// answer is retried once after a fresh lookup.
func (o *op[Req, Rep]) onHome(ctx context.Context, n *Node, obj ObjectID, req Req) (Rep, error) {
	for attempt := 0; ; attempt++ {
		if n.objects.isActive(obj) {
			return o.local(n, ctx, obj, req)
		}
		h, err := n.cluster.Home(ctx, cluster.Object(obj))
		if err != nil {
			var zero Rep
			return zero, err
		}
		if h == n.id {
			return o.local(n, ctx, obj, req)
		}
		rep, err := o.send(ctx, n, h, obj, req)
		if errors.Is(err, errNotHome) {
			n.cluster.Forget(cluster.Object(obj))
			if attempt == 0 {
				continue
			}
			// The object is moving (a takeover the nodes do not all see
			// yet): the caller may retry.
			err = fmt.Errorf("%w: %s is moving to another node; retry", ErrUnavailable, obj)
		}
		return rep, err
	}
}

// on runs o on node: directly when it is this node, else over NATS.
func (o *op[Req, Rep]) on(ctx context.Context, n *Node, node string, req Req) (Rep, error) {
	if node == n.id {
		return o.local(n, ctx, ObjectID{}, req)
	}
	return o.send(ctx, n, node, ObjectID{}, req)
}

// send asks node to run o, whichever node that is, and decodes its reply.
func (o *op[Req, Rep]) send(ctx context.Context, n *Node, node string, obj ObjectID, req Req) (Rep, error) {
	var rep Rep
	m := &nats.Msg{Header: nats.Header{}}
	if o.home {
		m.Header.Set(hdrObject, obj.String())
	}
	if err := encode(m, req); err != nil {
		return rep, fmt.Errorf("%s request: %w", o.name, err)
	}
	reply, err := n.request(ctx, node, o.name, m, cmp.Or(o.timeout, n.remoteTimeout()))
	if err != nil {
		return rep, err
	}
	if s := reply.Header.Get(hdrServedBy); s != "" {
		api.SetServedBy(ctx, s)
	}
	if err := decode(reply, &rep); err != nil {
		return rep, fmt.Errorf("%s reply from node %s: %w", o.name, node, err)
	}
	return rep, nil
}

// encode is the codec, one encoding for every request and reply, chosen
// by type in this one place. Bytes stay as they are: a []byte (a call's
// reply) or a string is the body itself, and a call's payload is the body
// beside its method in a header, so a call is not copied into an envelope.
// What has a compact length-prefixed form already (follow requests,
// connection batches, object deliveries, events) keeps it. Anything else
// is JSON; struct{} is an empty body. The bodies are the ones the
// per-operation handlers used before this layer, so nodes of either
// version understand each other.
func encode(m *nats.Msg, v any) error {
	switch v := v.(type) {
	case struct{}:
	case []byte:
		m.Data = v
	case string:
		m.Data = []byte(v)
	case callRequest:
		m.Header.Set(hdrMethod, v.Method)
		if v.Key != "" {
			// Quoted: a guest's key may hold any byte, a line break too.
			m.Header.Set(hdrKey, strconv.Quote(v.Key))
		}
		if len(v.Chain) > 0 {
			m.Header.Set(hdrChain, strings.Join(v.Chain, ","))
		}
		m.Data = v.Payload
	case followRequest:
		m.Header.Set(hdrArg, v.Node)
		m.Data = abi.AppendFollowRequest(nil, &v.FollowRequest)
	case abi.FollowRequest:
		m.Data = abi.AppendFollowRequest(nil, &v)
	case *delivery.ConnBatch:
		m.Data = delivery.AppendConnBatch(nil, v)
	case *delivery.ObjectDelivery:
		m.Data = delivery.AppendObjectDelivery(nil, v)
	case []abi.Event:
		m.Data = delivery.AppendEvents(nil, v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		m.Data = b
	}
	return nil
}

// decode is encode's inverse; v points to the value to fill. Events come
// without a publisher: the caller knows it.
func decode(m *nats.Msg, v any) error {
	var err error
	switch v := v.(type) {
	case *struct{}:
	case *[]byte:
		*v = m.Data
	case *string:
		*v = string(m.Data)
	case *callRequest:
		*v = callRequest{Method: m.Header.Get(hdrMethod), Payload: m.Data}
		if k := m.Header.Get(hdrKey); k != "" {
			if v.Key, err = strconv.Unquote(k); err != nil {
				return err
			}
		}
		if c := m.Header.Get(hdrChain); c != "" {
			// Object names hold no commas.
			v.Chain = strings.Split(c, ",")
		}
	case *followRequest:
		v.Node = m.Header.Get(hdrArg)
		v.FollowRequest, err = abi.DecodeFollowRequest(m.Data)
	case *abi.FollowRequest:
		*v, err = abi.DecodeFollowRequest(m.Data)
	case **delivery.ConnBatch:
		*v, err = delivery.DecodeConnBatch(m.Data)
	case **delivery.ObjectDelivery:
		*v, err = delivery.DecodeObjectDelivery(m.Data)
	case *[]abi.Event:
		*v, err = delivery.DecodeEvents(m.Data, "")
	default:
		err = json.Unmarshal(m.Data, v)
	}
	return err
}

func nodeSubject(node, op string) string { return "host.node." + node + "." + op }

// placedSubject carries, to every node, the id of an object that a node
// took over from a node that is gone, and after a line break that node's
// id: publishers waiting for it as an unplaced follower route its edges at
// once, to that node (the directory read through a replica that has not
// seen the move yet would still name the gone node).
const placedSubject = "host.placed"

// remoteError is an error that crossed from another node, keeping its
// status and its code.
type remoteError struct {
	status int
	code   string
	msg    string
}

func (e *remoteError) Error() string { return e.msg }

// HTTPStatus is the status the other node answered, so the API answers
// with it too; a reply without one has its code's.
func (e *remoteError) HTTPStatus() int {
	if e.status >= 400 {
		return e.status
	}
	if err := e.Unwrap(); err != nil {
		return api.Status(err)
	}
	return http.StatusInternalServerError
}

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
	codeCallCycle         = "call_cycle"
	codeKeyReused         = "key_reused"
	codeOther             = "error"
)

// codeErrors maps a code to its sentinel; most specific first in codeOf.
var codeErrors = map[string]error{
	codeNotHome: errNotHome, codeBadRequest: ErrBadRequest, codeTooLarge: ErrTooLarge,
	codeObjectUnavailable: ErrObjectUnavailable, codeUnavailable: ErrUnavailable,
	codeUnknownProgram: ErrUnknownProgram, codeUnknownObject: ErrUnknownObject,
	codeNotFound: ErrNotFound, codeConflict: ErrConflict, codeShuttingDown: ErrShuttingDown,
	codeCallCycle: ErrCallCycle, codeKeyReused: ErrKeyReused,
}

// codeOf is the code an error crosses with.
func codeOf(err error) string {
	var re *vm.RefusedError
	if errors.As(err, &re) {
		return codeRefused
	}
	for _, c := range []string{codeNotHome, codeObjectUnavailable, codeShuttingDown, codeCallCycle, codeKeyReused, codeUnknownProgram,
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
	hdrMethod  = "Method" // a call's method
	hdrKey     = "Key"    // a call's idempotency key
	hdrChain   = "Chain"  // the objects waiting for a call
	hdrArg     = "Arg"    // a follow's follower node
	// hdrServedBy, on a reply, is the node that ran the call.
	hdrServedBy = "Served-By"
)

// subscribe serves this node's inter-node subjects.
func (n *Node) subscribe() error {
	placed, err := n.nats.nc.Subscribe(placedSubject, func(m *nats.Msg) {
		n.rpcs.Add(1)
		go func() {
			defer n.rpcs.Done()
			object, home, _ := strings.Cut(string(m.Data), "\n")
			if id, err := ParseObjectID(object); err == nil && home != "" {
				n.cluster.Learn(cluster.Object(id), home)
			}
			n.followerPlaced(n.bgContext, object)
		}()
	})
	if err != nil {
		return err
	}
	n.subs = append(n.subs, placed)
	return n.serve(ops...)
}

// serve subscribes each op on this node's subject for it.
func (n *Node) serve(hs ...handler) error {
	for _, h := range hs {
		sub, err := n.nats.nc.Subscribe(nodeSubject(n.id, h.opName()), func(m *nats.Msg) {
			// Each request runs on its own goroutine: a call may wait for
			// an object's lock, and must not hold up the others.
			n.rpcs.Add(1)
			go func() {
				defer n.rpcs.Done()
				ctx, cancel := n.requestContext(m)
				defer cancel()
				reply, err := h.serve(ctx, n, m)
				if reply == nil {
					reply = nats.NewMsg(m.Reply)
				}
				reply.Subject = m.Reply
				if reply.Header == nil {
					reply.Header = nats.Header{}
				}
				if err != nil {
					code := codeOf(err)
					reply.Header.Set(hdrStatus, strconv.Itoa(api.Status(err)))
					reply.Header.Set(hdrCode, code)
					// Never an empty body: nats.go takes an empty reply
					// with Status 503 for "no responders", and the code
					// of a 503 (unavailable, shutting down) would be lost.
					reply.Data = []byte(code)
					reply.Header.Set(hdrError, api.Message(err, n.cfg.VM.Budget))
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

// request sends an inter-node request with the caller's deadline and turns
// a failure reply into its code's error: the same sentinel (errNotHome, a
// refusal with its reason) or a remoteError that keeps the status.
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
		// %w: a timeout stays a timeout (placementError tells it from a
		// node that is gone).
		return nil, fmt.Errorf("%w: node %s: %w", ErrUnavailable, node, err)
	}
	if st := reply.Header.Get(hdrStatus); st != "200" {
		status, _ := strconv.Atoi(st)
		code := reply.Header.Get(hdrCode)
		switch code {
		case codeNotHome:
			return nil, errNotHome
		case codeRefused:
			return nil, &vm.RefusedError{Reason: reply.Header.Get(hdrReason)}
		}
		return nil, &remoteError{status: status, code: code, msg: reply.Header.Get(hdrError)}
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

// The node ops: deliveries between nodes, addressed by node.

// opConns carries a connection batch to the node of its sockets.
var opConns = nodeOp("conns", quickWait, (*Node).sliceConns)

// sliceConns is the receiving node's half of a connection batch: resolve
// its edge set against the copy this node holds, slice it into this
// node's inboxes, report refusals and missing sockets (or that the set's
// base version is unknown here).
func (n *Node) sliceConns(_ context.Context, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	return n.conns.copies.Slice(b, n.conns.lookup), nil
}

// opDeliver carries an object delivery to the follower's home.
var opDeliver = nodeOp("deliver", 0, (*Node).receive)

// opRange asks the node holding a publisher's log for a range of it.
var opRange = nodeOp("range", quickWait, (*Node).rangeLocal)

// rangeLocal serves a range of this node's copy of a publisher's log: the
// holder's part of the read path.
func (n *Node) rangeLocal(ctx context.Context, d *delivery.ObjectDelivery) ([]abi.Event, error) {
	if d.Range == nil {
		return nil, fmt.Errorf("%w: range request without a range", ErrBadRequest)
	}
	pub, err := ParseObjectID(d.Publisher)
	if err != nil {
		return nil, err
	}
	return store.Read(ctx, n.objectPath(pub), d.RangeQuery())
}

// remoteTransport carries deliveries to other nodes; the local node is
// served directly.
type remoteTransport struct{ n *Node }

func (t remoteTransport) Connections(ctx context.Context, node string, b *delivery.ConnBatch) (delivery.ConnResult, error) {
	res, err := opConns.on(ctx, t.n, node, b)
	if errors.Is(err, ErrBadRequest) && (b.Set != delivery.SetVersion{} || b.Cursor != 0) {
		// A node of an earlier version cannot decode what follows the
		// edges: it is sent the unversioned form.
		err = fmt.Errorf("%w: %w", delivery.ErrUnversioned, err)
	}
	return res, err
}

func (t remoteTransport) Object(ctx context.Context, node string, d *delivery.ObjectDelivery) (delivery.ObjectResult, error) {
	res, err := opDeliver.on(ctx, t.n, node, d)
	if err != nil && ctx.Err() == nil && placementError(err) {
		if errors.Is(err, errNotHome) {
			if id, perr := ParseObjectID(d.Follower); perr == nil {
				t.n.cluster.Forget(cluster.Object(id))
			}
		}
		err = fmt.Errorf("%w: %w", delivery.ErrUnplaced, err)
	}
	return res, err
}

// placementError reports whether a delivery failed because of where the
// follower is (the node asked is not its home, is gone or stopping, or the
// follower is being taken over), not because of its handler.
// A timeout is not: a node that does not answer in time may be running the
// handler, and a paused node's lease ends within its TTL, after which the
// follower is located again.
func placementError(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return errors.Is(err, errNotHome) || errors.Is(err, ErrObjectUnavailable) ||
		errors.Is(err, ErrUnavailable) || errors.Is(err, ErrShuttingDown)
}

// materializeRemote asks the publisher's home for a range of its log.
func (n *Node) materializeRemote(ctx context.Context, pub ObjectID, d *delivery.ObjectDelivery) ([]abi.Event, error) {
	// The directory's holder, not claimed: a reader is not a home.
	h, err := n.cluster.Holder(ctx, cluster.Object(pub))
	if err != nil {
		return nil, err
	}
	switch {
	case h == "" || h == n.id:
		return nil, fmt.Errorf("%w: no local copy of %s", store.ErrNoLog, pub)
	case !n.cluster.Live(h):
		return nil, fmt.Errorf("%w: %s's holder %s is gone", ErrUnavailable, pub, h)
	}
	q := *d
	q.Events = nil
	return opRange.send(ctx, n, h, ObjectID{}, &q)
}
