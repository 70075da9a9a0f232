package host

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// An error crosses nodes as a code and comes back as the same sentinel,
// whatever its text says; a refusal keeps the hook's reason as given.
func TestRemoteErrorsCrossByCode(t *testing.T) {
	for _, want := range []error{ErrBadRequest, ErrTooLarge, ErrUnavailable, ErrObjectUnavailable,
		ErrUnknownProgram, ErrUnknownObject, ErrNotFound, ErrConflict, ErrShuttingDown} {
		// A message that names another error must not matter.
		err := fmt.Errorf("%w: mentions %v and not home", want, ErrConflict)
		re := &remoteError{status: api.Status(err), code: codeOf(err), msg: err.Error()}
		if !errors.Is(re, want) {
			t.Errorf("%v crossed as code %q, which is not %v again", err, re.code, want)
		}
		if want != ErrConflict && errors.Is(re, ErrConflict) {
			t.Errorf("%v crossed as code %q and became a conflict by its text", err, re.code)
		}
	}
	if c := codeOf(fmt.Errorf("wrapped: %w", errNotHome)); c != codeNotHome {
		t.Errorf("not-home crossed as %q", c)
	}
	if c := codeOf(&vm.RefusedError{Reason: "follow refused: members only"}); c != codeRefused {
		t.Errorf("a refusal crossed as %q", c)
	}
	if c := codeOf(errors.New("disk on fire")); c != codeOther {
		t.Errorf("an unknown error crossed as %q", c)
	}
}

// layerNode is one real node for the layer's own tests: its ops are sent
// to its own subject, so each request and reply crosses its embedded NATS
// server and the codec both ways.
func layerNode(t *testing.T) *Node {
	t.Helper()
	return StartTestNode(t)
}

var testOps atomic.Int64

// testOp serves local on n under a fresh name.
func testOp[Req, Rep any](t *testing.T, n *Node, timeout time.Duration, local func(context.Context, Req) (Rep, error)) *op[Req, Rep] {
	t.Helper()
	o := nodeOp(fmt.Sprintf("test%d", testOps.Add(1)), timeout, func(_ *Node, ctx context.Context, req Req) (Rep, error) {
		return local(ctx, req)
	})
	if err := n.serve(o); err != nil {
		t.Fatal(err)
	}
	return o
}

// echo sends v to an op that answers it back, over NATS.
func echo[T any](t *testing.T, n *Node, v T) {
	t.Helper()
	o := testOp(t, n, quickWait, func(_ context.Context, v T) (T, error) { return v, nil })
	got, err := o.send(context.Background(), n, n.id, ObjectID{}, v)
	if err != nil {
		t.Fatalf("%T: %v", v, err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Errorf("%T crossed as\n%#v\nwant\n%#v", v, got, v)
	}
}

// Every kind of request and reply the ops use crosses intact, as request
// and as reply, non-UTF-8 bytes included.
func TestInternodeCodecRoundTrip(t *testing.T) {
	t.Parallel()
	n := layerNode(t)
	ev := abi.Event{Publisher: "chat/r", Topic: "m\xff", Seq: 3, Time: 42, Payload: []byte{0, 0xff, '\n'}}
	echo(t, n, []byte{0, 1, 0xff, '\r', '\n'})
	echo(t, n, "n-1.7\xff")
	echo(t, n, struct{}{})
	echo(t, n, int64(-7))
	echo(t, n, true)
	echo(t, n, callRequest{Method: "inc", Payload: []byte{0, 0xff}})
	echo(t, n, callRequest{Method: "add", Payload: []byte("x"), Key: "call:ledger/a:key:k\xff\r\nStatus: 200", Chain: []string{"acme.ledger/a", "acme.ledger/b-1.x"}})
	echo(t, n, followRequest{FollowRequest: abi.FollowRequest{Publisher: "chat/r", Topic: "t\xff", Filter: "a=1",
		Kind: abi.FollowerObject, Follower: "tally/t1", Tenant: "acme", Params: []byte{0, 'k'}}, Node: "n-abc"})
	echo(t, n, abi.FollowRequest{Kind: abi.FollowerConnection, Follower: "n-1.7", Topic: "t\xff", Params: []byte("key")})
	echo(t, n, &delivery.ConnBatch{Publisher: "chat/r", Events: []abi.Event{ev},
		Edges: []delivery.ConnEdge{{Edge: 1, Conn: "n-1.2", Topic: "m", Cursor: 2, Filter: "a=1"}}})
	echo(t, n, &delivery.ObjectDelivery{Publisher: "chat/r", Follower: "tally/t1", Topic: "m", Events: []abi.Event{ev}, Through: 3})
	echo(t, n, &delivery.ObjectDelivery{Publisher: "chat/r", Follower: "tally/t1", Topic: "m", Filter: "a=1",
		Range: &delivery.Range{After: 3, Through: 9}, Through: 9})
	ev.Publisher = "" // a list of events names its publisher once, outside
	echo(t, n, []abi.Event{ev, {Topic: "m", Seq: 4, Payload: []byte("x")}})
	echo(t, n, streamQuery{Topic: "m", Filter: "a=1", After: 3, Limit: 10, MaxBytes: 1 << 20, Latest: true})
	echo(t, n, []store.Edge{{ID: 1, KindName: "object", Follower: "tally/t1", Node: "n-abc", Topic: "m", Cursor: 3}})
	echo(t, n, delivery.ConnResult{Refused: []string{"n-1.2"}, Gone: []string{"n-1.3"}})
	echo(t, n, delivery.ObjectResult{Done: 9, Err: "handler failed"})
	echo(t, n, replicaRequest{Object: "chat/r", Home: true})
	echo(t, n, &CopyInfo{Node: "n-abc", Home: true, Position: store.Position{Applied: 7}, Lag: 2})
	echo(t, n, (*CopyInfo)(nil))
	// The real op, to a node that keeps no copies: nothing, not an error.
	if info, err := opReplica.send(context.Background(), n, n.id, ObjectID{}, replicaRequest{Object: "chat/r"}); info != nil || err != nil {
		t.Errorf("a node without copies answered %v, %v", info, err)
	}
}

// A call's payload and reply are the message body itself, not a copy, and
// the bodies are the ones the per-operation handlers used before the
// layer, so nodes of either version talk.
func TestInternodeCodecKeepsBytesAndTheOldBodies(t *testing.T) {
	payload := []byte("payload")
	m := &nats.Msg{Header: nats.Header{}}
	if err := encode(m, callRequest{Method: "inc", Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if &m.Data[0] != &payload[0] || m.Header.Get(hdrMethod) != "inc" {
		t.Fatalf("a call's payload was copied into its request (method %q)", m.Header.Get(hdrMethod))
	}
	var reply []byte
	if err := decode(m, &reply); err != nil || &reply[0] != &m.Data[0] {
		t.Fatalf("a call's reply was copied out of its message (%v)", err)
	}
	fr := abi.FollowRequest{Publisher: "chat/r", Topic: "m", Kind: abi.FollowerObject, Follower: "tally/t1"}
	for _, c := range []struct {
		v      any
		body   string
		header string // Arg
	}{
		{int64(12), "12", ""},  // rmedge's id
		{true, "true", ""},     // unfollow's and rmedge's reply
		{"n-1.7", "n-1.7", ""}, // prune's connection
		{struct{}{}, "", ""},   // edges' request, prune's reply
		{fr, string(abi.AppendFollowRequest(nil, &fr)), ""},
		{followRequest{FollowRequest: fr, Node: "n-abc"}, string(abi.AppendFollowRequest(nil, &fr)), "n-abc"},
	} {
		m := &nats.Msg{Header: nats.Header{}}
		if err := encode(m, c.v); err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != c.body || m.Header.Get(hdrArg) != c.header {
			t.Errorf("%T encodes as %q (Arg %q), want %q (Arg %q)", c.v, m.Data, m.Header.Get(hdrArg), c.body, c.header)
		}
	}
}

// An error crosses by its code: the caller gets the same sentinel, the
// same refusal with its reason, the same status, whatever the text says.
func TestInternodeErrorsCrossByCode(t *testing.T) {
	t.Parallel()
	n := layerNode(t)
	sentinels := []error{errNotHome, ErrBadRequest, ErrTooLarge, ErrUnavailable, ErrObjectUnavailable,
		ErrUnknownProgram, ErrUnknownObject, ErrNotFound, ErrConflict, ErrShuttingDown}
	o := testOp(t, n, quickWait, func(_ context.Context, i int) (struct{}, error) {
		switch {
		case i < len(sentinels):
			// The text names other errors: it must not matter.
			return struct{}{}, fmt.Errorf("%w: mentions %v and %v", sentinels[i], ErrConflict, errNotHome)
		case i == len(sentinels):
			return struct{}{}, &vm.RefusedError{Reason: "members only: conflict"}
		}
		return struct{}{}, errors.New("disk on fire")
	})
	ctx := context.Background()
	for i, want := range sentinels {
		_, err := o.send(ctx, n, n.id, ObjectID{}, i)
		if !errors.Is(err, want) {
			t.Errorf("%v crossed as %v (%T), which is not %v", want, err, err, want)
		}
		if want != ErrConflict && errors.Is(err, ErrConflict) {
			t.Errorf("%v crossed as a conflict, by its text", want)
		}
		if want != errNotHome && errors.Is(err, errNotHome) {
			t.Errorf("%v crossed as not-home, by its text", want)
		}
		if got, local := api.Status(err), api.Status(want); got != local {
			t.Errorf("%v crossed with status %d, %d here", want, got, local)
		}
	}
	_, err := o.send(ctx, n, n.id, ObjectID{}, len(sentinels))
	var re *vm.RefusedError
	if !errors.As(err, &re) || re.Reason != "members only: conflict" || api.Status(err) != http.StatusForbidden {
		t.Errorf("a refusal crossed as %v (%T)", err, err)
	}
	_, err = o.send(ctx, n, n.id, ObjectID{}, len(sentinels)+1)
	for _, s := range sentinels {
		if errors.Is(err, s) {
			t.Errorf("an unknown error crossed as %v", s)
		}
	}
	if err == nil || err.Error() != "disk on fire" || api.Status(err) != http.StatusInternalServerError {
		t.Errorf("an unknown error crossed as %v, status %d", err, api.Status(err))
	}
	// A body the op cannot decode is the caller's bad request.
	reply, err := n.nats.nc.Request(nodeSubject(n.id, o.name), []byte("{"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c := reply.Header.Get(hdrCode); c != codeBadRequest {
		t.Errorf("an undecodable request answered code %q", c)
	}
}

// The home serves a request under the caller's deadline, or the op's own
// bound when the caller has none: it stops when the caller stops waiting.
func TestInternodeDeadlineReachesTheHome(t *testing.T) {
	t.Parallel()
	n := layerNode(t)
	type served struct {
		left  time.Duration // the deadline as the home saw it, from its start
		ended time.Time
	}
	seen := make(chan served, 1)
	o := testOp(t, n, 800*time.Millisecond, func(ctx context.Context, _ struct{}) (struct{}, error) {
		s := served{left: -1}
		if d, ok := ctx.Deadline(); ok {
			s.left = time.Until(d)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		s.ended = time.Now()
		seen <- s
		return struct{}{}, ctx.Err()
	})
	for _, c := range []struct {
		name   string
		caller time.Duration // 0: no deadline
		want   time.Duration
	}{{"the caller's deadline", 300 * time.Millisecond, 300 * time.Millisecond}, {"the op's bound", 0, 800 * time.Millisecond}} {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if c.caller > 0 {
			ctx, cancel = context.WithTimeout(ctx, c.caller)
		}
		start := time.Now()
		_, err := o.send(ctx, n, n.id, ObjectID{}, struct{}{})
		cancel()
		// Whichever gives up first answers: the caller's wait or the
		// home's context.
		if err == nil {
			t.Errorf("%s: a request past its deadline succeeded", c.name)
		}
		s := <-seen
		if s.left <= 0 || s.left > c.want {
			t.Errorf("%s: the home's deadline was %v away, want at most %v", c.name, s.left, c.want)
		}
		// The home's context ends at its deadline (checked above), not
		// after the handler's 20 s: the slack is the wake-up of a
		// goroutine on a loaded machine under the race detector (1.9 s
		// once for an 800 ms deadline in a full suite).
		if took := s.ended.Sub(start); took > c.want+5*time.Second {
			t.Errorf("%s: the home served %v, the caller waited %v", c.name, took, c.want)
		}
	}
}

// An object op runs on the home directly, without a message, when this
// node is the home; sent, it runs under the request's context.
func TestInternodeOnHomeRunsHereWhenHome(t *testing.T) {
	t.Parallel()
	n := layerNode(t)
	type key struct{}
	o := objectOp(fmt.Sprintf("test%d", testOps.Add(1)), quickWait, func(_ *Node, ctx context.Context, _ ObjectID, _ struct{}) (bool, error) {
		return ctx.Value(key{}) != nil, nil
	})
	if err := n.serve(o); err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(context.Background(), key{}, true)
	obj := ObjectID{Program: "chat", ID: "here"}
	if here, err := o.onHome(ctx, n, obj, struct{}{}); err != nil || !here {
		t.Fatalf("an op on an object homed here went over NATS (%v)", err)
	}
	if here, err := o.send(ctx, n, n.id, obj, struct{}{}); err != nil || here {
		t.Fatalf("a sent op ran in its caller's context (%v)", err)
	}
}

// Each op has a subject of its own: two ops under one name would both
// answer, and the first reply would win.
func TestInternodeOpsHaveDistinctNames(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range ops {
		if seen[o.opName()] {
			t.Errorf("two ops are named %q", o.opName())
		}
		seen[o.opName()] = true
	}
}

// A delivery that failed because of where the follower is crosses to the
// pump as delivery.ErrUnplaced (backed off, never counted toward the drop);
// a timeout, a handler's failure or any other error does not.
//
// conformance: D19 D20
func TestPlacementErrorsAreUnplaced(t *testing.T) {
	remote := func(err error) error {
		return &remoteError{status: api.Status(err), code: codeOf(err), msg: err.Error()}
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errNotHome, true},
		{remote(fmt.Errorf("%w: tally/1 is being taken over", ErrObjectUnavailable)), true},
		{fmt.Errorf("%w: node n2 does not answer", ErrUnavailable), true},
		{remote(ErrShuttingDown), true},
		{fmt.Errorf("%w: node n2: %w", ErrUnavailable, context.DeadlineExceeded), false},
		{&vm.GuestError{Message: "unavailable"}, false},
		{remote(ErrBadRequest), false},
		{errors.New("object unavailable"), false},
	} {
		if got := placementError(c.err); got != c.want {
			t.Errorf("placementError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
