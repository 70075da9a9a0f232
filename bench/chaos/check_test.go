package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/durable-host/host/host/client"
)

// The checkers are proved on histories built by hand: each bad one must be
// caught, each good one passed, or the soak's "0 violations" says nothing.

const obj = "counter/c000"

func add(id, c int, amount, value, call, ret int64) Op {
	return Op{ID: id, Client: c, Object: obj, Kind: Write, Amount: amount, Value: value, Call: call, Return: ret, Outcome: OK}
}

func get(id, c int, value, call, ret int64) Op {
	return Op{ID: id, Client: c, Object: obj, Kind: Read, Value: value, Call: call, Return: ret, Outcome: OK}
}

func ambiguous(o Op) Op {
	o.Outcome, o.Value, o.Err = Ambiguous, 0, "context deadline exceeded"
	return o
}

func TestCheckLinearizable(t *testing.T) {
	cases := []struct {
		name    string
		ops     []Op
		applied Applied
		want    porcupine.CheckResult
	}{
		{"sequential", []Op{add(1, 0, 5, 5, 0, 10), get(2, 1, 5, 20, 30), add(3, 1, 7, 12, 40, 50), get(4, 0, 12, 60, 70)},
			Applied{5: 5, 7: 12}, porcupine.Ok},
		{"a read concurrent with the write may miss it", []Op{add(1, 0, 5, 5, 0, 10), get(2, 1, 0, 5, 15)},
			Applied{5: 5}, porcupine.Ok},
		{"stale read after the write's reply", []Op{add(1, 0, 5, 5, 0, 10), get(2, 1, 0, 20, 30)},
			Applied{5: 5}, porcupine.Illegal},
		{"a read sees a value that went away", []Op{add(1, 0, 5, 5, 0, 10), get(2, 1, 5, 20, 30), get(3, 1, 0, 40, 50)},
			Applied{5: 5}, porcupine.Illegal},
		{"reply disagrees with the order of two writes", []Op{add(1, 0, 5, 5, 0, 10), add(2, 1, 7, 7, 20, 30)},
			Applied{5: 5, 7: 12}, porcupine.Illegal},
		{"an ambiguous write may land late", []Op{ambiguous(add(1, 0, 5, 0, 0, 10)), get(2, 1, 0, 20, 30), get(3, 1, 5, 40, 50)},
			Applied{5: 5}, porcupine.Ok},
		{"but not go away once seen", []Op{ambiguous(add(1, 0, 5, 0, 0, 10)), get(2, 1, 5, 20, 30), get(3, 1, 0, 40, 50)},
			Applied{5: 5}, porcupine.Illegal},
		{"nor be seen before it was sent", []Op{get(1, 1, 5, 0, 10), ambiguous(add(2, 0, 5, 0, 20, 30))},
			Applied{5: 5}, porcupine.Illegal},
		{"an ambiguous write the log lacks was never applied: reading it is a violation", []Op{ambiguous(add(1, 0, 5, 0, 0, 10)), get(2, 1, 5, 20, 30)},
			Applied{}, porcupine.Illegal},
		{"refused and unanswered reads are left out", []Op{add(1, 0, 5, 5, 0, 10), {ID: 2, Object: obj, Kind: Read, Outcome: Ambiguous, Call: 20, Return: 30}, {ID: 3, Object: obj, Kind: Write, Amount: 9, Outcome: Refused, Call: 20, Return: 30}, get(4, 1, 5, 40, 50)},
			Applied{5: 5}, porcupine.Ok},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := CheckLinearizable(c.ops, c.applied, 10*time.Second)
			if l.Result != c.want {
				t.Fatalf("porcupine says %s, want %s for\n%s", l.Result, c.want, formatOps(c.ops))
			}
			if c.want == porcupine.Illegal {
				stuck, around := l.Stuck()
				if stuck.ID == 0 || len(around) == 0 {
					t.Fatalf("no failing operation named: %v, %v", stuck, around)
				}
			}
		})
	}
}

func TestCheckObjectLog(t *testing.T) {
	ops := []Op{add(1, 0, 5, 5, 0, 10), add(2, 1, 7, 12, 20, 30), ambiguous(add(3, 0, 11, 0, 40, 50)), {ID: 4, Object: obj, Kind: Write, Amount: 13, Outcome: Refused}}
	cases := []struct {
		name  string
		log   []Change
		final int64
		want  []string // the checks that must fail; none = clean
	}{
		{"every acknowledged write once", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}}, 12, nil},
		{"with the ambiguous one applied", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 23}}, 23, nil},
		{"an acknowledged write missing", []Change{{Seq: 1, Value: 5}}, 5, []string{LostWrite}},
		{"an acknowledged write at another value than its reply", []Change{{Seq: 1, Value: 7}, {Seq: 2, Value: 12}}, 12, []string{LostWrite}},
		{"a write applied twice", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 17}}, 17, []string{AppliedTwice}},
		{"a change nobody sent", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 13}}, 13, []string{LogConsistency}},
		{"a refused write applied", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 25}}, 25, []string{LogConsistency}},
		{"a gap", []Change{{Seq: 1, Value: 5}, {Seq: 3, Value: 12}}, 12, []string{LogConsistency}},
		{"the final value past the log", []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}}, 23, []string{LogConsistency}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			applied, vs := CheckObjectLog(obj, ops, c.log, c.final)
			got := map[string]bool{}
			for _, v := range vs {
				got[v.Check] = true
			}
			for _, w := range c.want {
				if !got[w] {
					t.Errorf("%q not caught: %v", w, vs)
				}
			}
			if len(c.want) == 0 && len(vs) > 0 {
				t.Errorf("violations in a clean log: %v", vs)
			}
			if len(c.want) == 0 && applied[5] != 5 {
				t.Errorf("applied %v: want add 5 at 5", applied)
			}
		})
	}
}

func TestCheckIDs(t *testing.T) {
	clean := []IDSample{{0, 0, "a"}, {1, 0, "b"}, {0, 0, "a"}, {0, 1, "c"}, {1, 0, "d"}, {1, 0, "d"}}
	if vs := CheckIDs(clean); len(vs) != 0 {
		t.Fatalf("fresh ids flagged: %v", vs)
	}
	for name, s := range map[string][]IDSample{
		"an id on a restarted node":      {{0, 0, "a"}, {0, 1, "a"}},
		"an id on another node":          {{0, 0, "a"}, {1, 0, "a"}},
		"a node goes back to its old id": {{0, 0, "a"}, {0, 0, "b"}, {0, 0, "a"}},
	} {
		if vs := CheckIDs(s); len(vs) != 1 || vs[0].Check != NodeIDReuse {
			t.Errorf("%s: %v", name, vs)
		}
	}
}

func TestClassify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, refused := (&client.Client{Base: "http://" + addr}).Call(context.Background(), obj, "get", nil)
	for _, c := range []struct {
		err  error
		want Outcome
	}{
		{refused, Refused},
		{&client.APIError{Status: 404}, Refused},
		{fmt.Errorf("call: %w", &client.APIError{Status: 503}), Ambiguous},
		{&client.APIError{Status: 504}, Ambiguous},
		{ctx.Err(), Ambiguous},
		{errors.New("connection reset by peer"), Ambiguous},
	} {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %s, want %s", c.err, got, c.want)
		}
	}
	if !strings.Contains(refused.Error(), "refused") {
		t.Fatalf("not a refused connection: %v", refused)
	}
}

func TestCheckFollower(t *testing.T) {
	log := []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 23}}
	cases := []struct {
		name       string
		seen       []uint64
		duplicates int64
		bad        bool
	}{
		{"every event once", []uint64{1, 2, 3}, 0, false},
		{"a seq missing", []uint64{1, 3}, 0, true},
		{"the last seq missing", []uint64{1, 2}, 0, true},
		{"a seq twice", []uint64{1, 2, 2, 3}, 0, true},
		{"a seq the log lacks", []uint64{1, 2, 3, 4}, 0, true},
		{"a duplicate delivery the handler caught", []uint64{1, 2, 3}, 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, vs := CheckFollower("tally/t000", obj, c.seen, c.duplicates, log)
			if n != len(log) {
				t.Errorf("checked %d events, want %d", n, len(log))
			}
			if c.bad != (len(vs) > 0) {
				t.Fatalf("violations %v, want some: %v", vs, c.bad)
			}
			for _, v := range vs {
				if v.Check != FollowerOnce {
					t.Errorf("check %q, want %q", v.Check, FollowerOnce)
				}
			}
		})
	}
	if got := seqRanges([]uint64{3, 7, 8, 9, 12}); got != "3, 7-9, 12" {
		t.Errorf("seqRanges: %q", got)
	}
}

func TestCheckSubscriber(t *testing.T) {
	log := []Change{{Seq: 1, Value: 5}, {Seq: 2, Value: 12}, {Seq: 3, Value: 23}, {Seq: 4, Value: 30}}
	ev := func(seq uint64) Change { return log[seq-1] }
	cases := []struct {
		name     string
		sessions []SubSession
		bad      bool
	}{
		{"one connection, every event", []SubSession{{After: 0, Events: []Change{ev(1), ev(2), ev(3), ev(4)}}}, false},
		{"resumed from its checkpoint", []SubSession{{After: 0, Events: []Change{ev(1), ev(2)}}, {After: 2, Events: []Change{ev(3), ev(4)}}}, false},
		{"resumed with nothing new, then the rest", []SubSession{{After: 0, Events: []Change{ev(1)}}, {After: 1, Err: "reset"}, {After: 1, Events: []Change{ev(2), ev(3), ev(4)}}}, false},
		{"a gap in one connection", []SubSession{{After: 0, Events: []Change{ev(1), ev(3), ev(4)}}}, true},
		{"a gap another connection covers", []SubSession{{After: 0, Events: []Change{ev(1), ev(3), ev(4)}}, {After: 0, Events: []Change{ev(1), ev(2), ev(3), ev(4)}}}, true},
		{"a gap at the checkpoint", []SubSession{{After: 0, Events: []Change{ev(1), ev(2)}}, {After: 2, Events: []Change{ev(4)}}}, true},
		{"a seq twice in one connection", []SubSession{{After: 0, Events: []Change{ev(1), ev(2), ev(2), ev(3), ev(4)}}}, true},
		{"out of order", []SubSession{{After: 0, Events: []Change{ev(2), ev(1), ev(3), ev(4)}}}, true},
		{"stopped short of the log's end", []SubSession{{After: 0, Events: []Change{ev(1), ev(2), ev(3)}}}, true},
		{"a payload the log does not hold", []SubSession{{After: 0, Events: []Change{ev(1), {Seq: 2, Value: 13}, ev(3), ev(4)}}}, true},
		{"an event past the log", []SubSession{{After: 0, Events: []Change{ev(1), ev(2), ev(3), ev(4), {Seq: 5, Value: 31}}}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, vs := CheckSubscriber("subscriber 0", obj, c.sessions, log)
			if c.bad != (len(vs) > 0) {
				t.Fatalf("violations %v, want some: %v", vs, c.bad)
			}
			for _, v := range vs {
				if v.Check != SubscriberGap {
					t.Errorf("check %q, want %q", v.Check, SubscriberGap)
				}
			}
		})
	}
}

func TestCheckWatcher(t *testing.T) {
	// Published at 10, 20, 30, 40 (ns).
	log := []Change{{Seq: 1, Value: 5, Time: 10}, {Seq: 2, Value: 12, Time: 20}, {Seq: 3, Value: 23, Time: 30}, {Seq: 4, Value: 30, Time: 40}}
	ev := func(seq uint64) Change { return log[seq-1] }
	cases := []struct {
		name        string
		conns       []WatchConn
		bad         bool
		lost, total int
	}{
		{"every event once", []WatchConn{{Opened: 0, Closed: 50, Events: []Change{ev(1), ev(2), ev(3), ev(4)}}}, false, 0, 4},
		{"a drop loses what it missed, not a violation", []WatchConn{{Opened: 0, Closed: 25, Events: []Change{ev(1)}}, {Opened: 35, Closed: 50, Events: []Change{ev(4)}}}, false, 1, 3},
		{"the same event on two connections is fine", []WatchConn{{Opened: 0, Closed: 25, Events: []Change{ev(1), ev(2)}}, {Opened: 15, Closed: 50, Events: []Change{ev(2), ev(3), ev(4)}}}, false, 0, 5},
		{"an event twice on one connection", []WatchConn{{Opened: 0, Closed: 50, Events: []Change{ev(1), ev(2), ev(2), ev(3), ev(4)}}}, true, 0, 4},
		{"an event the log does not hold", []WatchConn{{Opened: 0, Closed: 50, Events: []Change{ev(1), {Seq: 2, Value: 13}, ev(3), ev(4)}}}, true, 0, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			loss, vs := CheckWatcher("watcher 0", obj, c.conns, log)
			if c.bad != (len(vs) > 0) {
				t.Fatalf("violations %v, want some: %v", vs, c.bad)
			}
			if loss.Lost != c.lost || loss.Total != c.total {
				t.Errorf("lost %d of %d, want %d of %d", loss.Lost, loss.Total, c.lost, c.total)
			}
			for _, v := range vs {
				if v.Check != WatcherOnce {
					t.Errorf("check %q, want %q", v.Check, WatcherOnce)
				}
			}
		})
	}
}

func TestMinimizeHistory(t *testing.T) {
	// A stale read in a busy history: client 1's get at 500 reads 0 after
	// add(5) was acknowledged at 10 and read by others; the rest is
	// writes and reads that chain correctly.
	ops := []Op{add(1, 0, 5, 5, 0, 10)}
	sum, id := int64(5), 2
	for k := range 20 {
		at := int64(20 + 20*k)
		if k%2 == 0 {
			sum += int64(100 + k)
			ops = append(ops, add(id, 2, int64(100+k), sum, at, at+5))
		} else {
			ops = append(ops, get(id, 3, sum, at, at+5))
		}
		id++
	}
	stale := get(id, 1, 0, 500, 510)
	ops = append(ops, stale, get(id+1, 3, sum, 520, 530))
	applied := Applied{}
	for _, o := range ops {
		if o.Kind == Write {
			applied[o.Amount] = o.Value
		}
	}
	if l := CheckLinearizable(ops, applied, 10*time.Second); l.Result != porcupine.Illegal {
		t.Fatalf("the history is %s, want illegal", l.Result)
	}
	m := MinimizeHistory(ops, applied, 30*time.Second)
	t.Logf("%d checks; %d operations and %d relaxed writes of %d:\n%s", m.Checks, len(m.Ops), m.Relaxed, len(ops), formatOps(m.Ops))
	if !m.Illegal || !m.Done {
		t.Fatalf("illegal %v, done %v: want both in 30 s", m.Illegal, m.Done)
	}
	// Still the violation: the stale read, and one operation that shows
	// the value it missed; nothing else.
	if len(m.Ops) != 2 || !slices.ContainsFunc(m.Ops, func(o Op) bool { return o.ID == stale.ID }) {
		t.Fatalf("minimal history of %d operations, want the stale read and one before it:\n%s", len(m.Ops), formatOps(m.Ops))
	}
	// The soak's violation prints it, with the operations around.
	v := illegal("", obj, ops, applied, CheckLinearizable(ops, applied, 10*time.Second))
	if v.Check != Linearizability || !strings.Contains(v.History, "smallest failing history found (2 operations, 1-minimal") || !strings.Contains(v.History, stale.String()) {
		t.Fatalf("violation without the smallest history:\n%s", v)
	}

	// A legal history comes back whole, no search.
	good := ops[:len(ops)-2]
	if m := MinimizeHistory(good, applied, 10*time.Second); len(m.Ops) != len(good) || m.Illegal || m.Done {
		t.Fatalf("legal history: %d of %d operations, done %v", len(m.Ops), len(good), m.Done)
	}
	// Out of budget: what it has, still illegal.
	if m := MinimizeHistory(ops, applied, time.Nanosecond); m.Done || len(m.Ops) == 0 {
		t.Fatalf("no budget: %d operations, done %v", len(m.Ops), m.Done)
	}
}

func TestEnded(t *testing.T) {
	run, stop := context.WithCancel(context.Background())
	conn := func(cause error) context.Context {
		c, cancel := context.WithCancelCause(run)
		if cause != nil {
			cancel(cause)
		}
		t.Cleanup(func() { cancel(nil) })
		return c
	}
	for _, c := range []struct {
		cctx context.Context
		err  error
		want string
	}{
		{conn(errNodeDown), nil, "node down"},
		{conn(errIdle), nil, "idle"},
		{conn(nil), &client.APIError{Status: 503}, "refused 503"},
		{conn(nil), errors.New("connection closed: EOF"), "dropped"},
		{conn(nil), nil, "dropped"},
	} {
		if got := ended(run, c.cctx, c.err); got != c.want {
			t.Errorf("ended(%v, %v) = %q, want %q", context.Cause(c.cctx), c.err, got, c.want)
		}
	}
	stop()
	if got := ended(run, conn(errIdle), nil); got != "run end" {
		t.Errorf("after the run: %q", got)
	}
	if got := ends([]string{"idle", "node down", "idle", "dropped"}); got != "idle 2, dropped 1, node down 1" {
		t.Errorf("ends: %q", got)
	}
}

func TestCheckOneHome(t *testing.T) {
	on := func(o Op, home string) Op { o.Home = home; return o }
	// A takeover: a answers, then b. a's last reply may come back after
	// b's first call was sent (it ran before the takeover, its reply was
	// slow), which is no overlap.
	handover := []Op{
		on(add(1, 0, 5, 5, 0, 10), "a"),
		on(get(2, 1, 5, 12, 40), "a"),
		on(add(3, 2, 7, 12, 30, 50), "b"),
		on(get(4, 0, 12, 60, 70), "b"),
		{ID: 5, Kind: Read, Call: 65, Return: 90, Outcome: Ambiguous}, // no home: not counted
	}
	if vs := CheckOneHome(obj, handover); len(vs) != 0 {
		t.Fatalf("a handover flagged: %v", vs)
	}
	// The old home answers a read sent after the new home had answered a
	// write: two homes at once (the stale read CI's soak once saw).
	stale := append(slices.Clone(handover[:4]), on(get(6, 1, 5, 80, 85), "a"))
	vs := CheckOneHome(obj, stale)
	if len(vs) != 1 || vs[0].Check != OneHome || !strings.Contains(vs[0].Detail, "#6") {
		t.Fatalf("the old home answering after the new one: %v", vs)
	}
	// Calls with no home named (an older node) say nothing either way.
	if vs := CheckOneHome(obj, []Op{add(1, 0, 5, 5, 0, 10), get(2, 0, 5, 20, 30)}); len(vs) != 0 {
		t.Fatalf("calls without a home flagged: %v", vs)
	}
}
