package chaos

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Change is one event of a counter's log, topic "changes": the value after
// one applied add, at its position in the object's log.
type Change struct {
	Seq   uint64 `json:"seq"`
	Value int64  `json:"value"`
	// Time is the event's publish time (Unix ns), when known.
	Time int64 `json:"time,omitempty"`
}

// Violation is one broken guarantee.
type Violation struct {
	Check  string `json:"check"`
	Object string `json:"object,omitempty"`
	Detail string `json:"detail"`
	// History is the operations around the violation, one a line.
	History string `json:"history,omitempty"`
	// File holds more (the object's whole history, a porcupine
	// visualization), when written.
	File string `json:"file,omitempty"`
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s: %s: %s", v.Check, v.Object, v.Detail)
	if v.History != "" {
		s += "\n" + v.History
	}
	if v.File != "" {
		s += "\n  see " + v.File
	}
	return s
}

// The names of the checks.
const (
	Linearizability = "linearizable"
	LostWrite       = "acknowledged write lost"
	AppliedTwice    = "write applied twice"
	LogConsistency  = "log consistent"
	NodeIDReuse     = "node ids never reused"
	OneHome         = "one home at a time"
	NodeExited      = "no node exits on its own"
	FollowerOnce    = "durable follower counts each event once"
	SubscriberGap   = "stream subscriber gets every event in order from its checkpoint"
	WatcherOnce     = "watcher gets no event twice on one connection"
)

// Applied maps each write's amount to the value its add produced, as the
// object's log records it.
type Applied map[int64]int64

// CheckObjectLog checks one counter's log against the operations sent to
// it and the value it ended with: positions contiguous from 1; each change
// is one add some client sent (the amounts are unique, so the difference
// between two values names the write); no write applied twice; every
// acknowledged write is there, at the value its reply gave; no refused
// write is there; the log ends at final. It returns what the log says was
// applied, which the linearizability check uses.
func CheckObjectLog(object string, ops []Op, log []Change, final int64) (Applied, []Violation) {
	var vs []Violation
	bad := func(check, format string, args ...any) {
		vs = append(vs, Violation{Check: check, Object: object, Detail: fmt.Sprintf(format, args...)})
	}
	writes := map[int64]Op{}
	for _, o := range ops {
		if o.Kind == Write {
			writes[o.Amount] = o
		}
	}
	applied := Applied{}
	prev := int64(0)
	for i, c := range log {
		if c.Seq != uint64(i+1) {
			bad(LogConsistency, "log position %d holds seq %d: a gap or a reorder", i+1, c.Seq)
			break
		}
		amount := c.Value - prev
		prev = c.Value
		w, ok := writes[amount]
		switch {
		case !ok:
			bad(LogConsistency, "seq %d: value %d is %+d from the one before, an add no client sent", c.Seq, c.Value, amount)
		case applied[amount] != 0:
			bad(AppliedTwice, "write #%d (add %d) is in the log twice: values %d and %d\n  %s", w.ID, amount, applied[amount], c.Value, w)
		case w.Outcome == Refused:
			bad(LogConsistency, "write #%d was refused but is in the log at seq %d\n  %s", w.ID, c.Seq, w)
		}
		if ok && applied[amount] == 0 {
			applied[amount] = c.Value
		}
	}
	if prev != final {
		bad(LogConsistency, "the log ends at %d, the object's final value is %d", prev, final)
	}
	var ids []int
	lost := map[int]Op{}
	for _, w := range writes {
		if w.Outcome != OK {
			continue
		}
		v, ok := applied[w.Amount]
		switch {
		case !ok:
			lost[w.ID] = w
			ids = append(ids, w.ID)
		case v != w.Value:
			bad(LostWrite, "write #%d was acknowledged with %d but the log applied it as %d\n  %s", w.ID, w.Value, v, w)
		}
	}
	sort.Ints(ids)
	for _, id := range ids {
		bad(LostWrite, "write #%d was acknowledged and is not in the final state\n  %s", id, lost[id])
	}
	return applied, vs
}

// CheckFollower checks, by identity, what a durable follower (a tally)
// received from one publisher against the publisher's log: the seqs it
// committed (its seen/ keys) are exactly the log's, none missing, none
// extra, and its handler never saw one twice (duplicates). It returns how
// many events it checked.
func CheckFollower(tally, publisher string, seen []uint64, duplicates int64, log []Change) (int, []Violation) {
	var vs []Violation
	bad := func(format string, args ...any) {
		vs = append(vs, Violation{Check: FollowerOnce, Object: tally, Detail: fmt.Sprintf("following %s: ", publisher) + fmt.Sprintf(format, args...)})
	}
	if duplicates != 0 {
		bad("its handler was given %d events it had already committed", duplicates)
	}
	inLog := map[uint64]bool{}
	for _, c := range log {
		inLog[c.Seq] = true
	}
	got := map[uint64]bool{}
	for _, s := range seen {
		switch {
		case got[s]:
			bad("seq %d counted twice", s)
		case !inLog[s]:
			bad("seq %d counted, and the log has no such event", s)
		}
		got[s] = true
	}
	var missing []uint64
	for _, c := range log {
		if !got[c.Seq] {
			missing = append(missing, c.Seq)
		}
	}
	if len(missing) > 0 {
		bad("%d of the log's %d events never counted: seqs %s", len(missing), len(log), seqRanges(missing))
	}
	return len(log), vs
}

// CheckSubscriber checks one stream subscriber of object against its log:
// each session (a connection, resumed after the checkpoint After) got
// seqs strictly increasing from After+1 with no gap, each with the log's
// payload, and the sessions together got every event of the log. It
// returns how many events the sessions got.
func CheckSubscriber(name, object string, sessions []SubSession, log []Change) (int, []Violation) {
	var vs []Violation
	bad := func(format string, args ...any) {
		vs = append(vs, Violation{Check: SubscriberGap, Object: object, Detail: name + ": " + fmt.Sprintf(format, args...)})
	}
	value := map[uint64]int64{}
	for _, c := range log {
		value[c.Seq] = c.Value
	}
	got := map[uint64]bool{}
	events := 0
	for k, s := range sessions {
		prev := s.After
		for _, e := range s.Events {
			events++
			if e.Seq != prev+1 {
				bad("connection %d (through node %d, after %d): seq %d follows %d", k, s.Node, s.After, e.Seq, prev)
				break
			}
			prev = e.Seq
			got[e.Seq] = true
			if v, ok := value[e.Seq]; !ok {
				bad("connection %d (through node %d): seq %d is past the log's end (%d events)", k, s.Node, e.Seq, len(log))
			} else if v != e.Value {
				bad("connection %d (through node %d): seq %d holds value %d, the log %d", k, s.Node, e.Seq, e.Value, v)
			}
		}
	}
	var missing []uint64
	for _, c := range log {
		if !got[c.Seq] {
			missing = append(missing, c.Seq)
		}
	}
	if len(missing) > 0 {
		bad("%d of the log's %d events never got (after %d connections): seqs %s", len(missing), len(log), len(sessions), seqRanges(missing))
	}
	return events, vs
}

// WatchLoss is what a watcher's connections missed: the log's events
// published while a connection was open that it did not get, of all
// events published while one was open.
type WatchLoss struct {
	Lost, Total int
}

// CheckWatcher checks one watcher of object against its log: no
// connection got an event twice (at-most-once), and every event it got is
// the log's (a watcher never sees what the object did not commit). What
// each connection missed of the events published while it was open is
// counted, not a violation: connections are at-most-once. Events
// published as a connection was still following count as missed, so the
// loss is an upper bound.
func CheckWatcher(name, object string, conns []WatchConn, log []Change) (WatchLoss, []Violation) {
	var vs []Violation
	var loss WatchLoss
	value := map[uint64]int64{}
	for _, c := range log {
		value[c.Seq] = c.Value
	}
	for k, c := range conns {
		got := map[uint64]bool{}
		for _, e := range c.Events {
			if got[e.Seq] {
				vs = append(vs, Violation{Check: WatcherOnce, Object: object, Detail: fmt.Sprintf("%s: connection %d (through node %d) got seq %d twice", name, k, c.Node, e.Seq)})
			}
			got[e.Seq] = true
			if v, ok := value[e.Seq]; !ok || v != e.Value {
				vs = append(vs, Violation{Check: WatcherOnce, Object: object, Detail: fmt.Sprintf("%s: connection %d (through node %d) got seq %d with value %d, which the log does not hold", name, k, c.Node, e.Seq, e.Value)})
			}
		}
		for _, e := range log {
			if e.Time >= c.Opened && e.Time <= c.Closed {
				loss.Total++
				if !got[e.Seq] {
					loss.Lost++
				}
			}
		}
	}
	return loss, vs
}

// seqRanges shows sorted seqs as ranges: "3, 7-9".
func seqRanges(seqs []uint64) string {
	var parts []string
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.FormatUint(seqs[i], 10))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", seqs[i], seqs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// counterInput is a porcupine input: an add of Amount, or a get.
type counterInput struct {
	kind   Kind
	amount int64
}

// counterModel is one counter, a single correct copy: add returns the sum
// after it, get the current sum.
var counterModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(int64), input.(counterInput), output.(int64)
		if in.kind == Write {
			return out == s+in.amount, s + in.amount
		}
		return out == s, s
	},
	Hash: func(state any) uint64 { return uint64(state.(int64)) },
	DescribeOperation: func(input, output any) string {
		in := input.(counterInput)
		if in.kind == Write {
			return fmt.Sprintf("add(%d) → %d", in.amount, output)
		}
		return fmt.Sprintf("get() → %d", output)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state) },
}

// Linearization is the porcupine check of one object's history.
type Linearization struct {
	Result porcupine.CheckResult
	// Ops is the history checked, in porcupine's operation order.
	Ops  []Op
	info porcupine.LinearizationInfo
}

// CheckLinearizable decides whether one counter's history could have
// happened on a single correct copy. An acknowledged call counts from its
// invocation to its reply. An ambiguous write counts as possibly applied:
// it has no return time (porcupine may place it anywhere after its
// invocation); when the object's log holds it, its output is the value the
// log gives it; when the log does not, it never took effect and is left
// out (reading its value would be the violation). Refused calls and reads
// without a reply are left out: they changed nothing.
func CheckLinearizable(ops []Op, applied Applied, timeout time.Duration) Linearization {
	var l Linearization
	var hist []porcupine.Operation
	for _, o := range ops {
		p := porcupine.Operation{ClientId: o.Client, Input: counterInput{o.Kind, o.Amount}, Call: o.Call, Output: o.Value, Return: o.Return}
		switch {
		case o.Outcome == OK:
		case o.Kind == Write && o.Outcome == Ambiguous:
			v, ok := applied[o.Amount]
			if !ok {
				continue
			}
			p.Output, p.Return = v, math.MaxInt64
		default:
			continue
		}
		hist = append(hist, p)
		l.Ops = append(l.Ops, o)
	}
	l.Result, l.info = porcupine.CheckOperationsVerbose(counterModel, hist, timeout)
	return l
}

// Stuck returns the first operation of the history (by invocation) that is
// in none of porcupine's longest partial linearizations, and those
// operations overlapping it in time: the smallest window that shows the
// violation.
func (l Linearization) Stuck() (Op, []Op) {
	in := map[int]bool{}
	for _, part := range l.info.PartialLinearizations() {
		longest := 0
		for _, seq := range part {
			longest = max(longest, len(seq))
		}
		for _, seq := range part {
			if len(seq) == longest {
				for _, id := range seq {
					in[id] = true
				}
			}
		}
	}
	for i, o := range l.Ops {
		if in[i] {
			continue
		}
		var around []Op
		for _, p := range l.Ops {
			// What overlaps it, and what completed in the second before
			// it (a stale read needs the write it missed).
			if p.Call <= o.Return && p.Return >= o.Call-int64(time.Second) && len(around) < 60 {
				around = append(around, p)
			}
		}
		return o, around
	}
	return Op{}, nil
}

// Visualize writes porcupine's HTML view of the check to path.
func (l Linearization) Visualize(path string) error {
	return porcupine.VisualizePath(counterModel, l.info, path)
}

// IDSample is one node id seen on one incarnation of a node: its index and
// how many times it had been started before.
type IDSample struct {
	Node, Start int
	ID          string
}

// CheckIDs checks that node ids never return: an id belongs to one
// incarnation of one node, and once that incarnation has moved on to a new
// id (a restart, or a lost lease) the old one is never seen again.
func CheckIDs(samples []IDSample) []Violation {
	type inc struct{ node, start int }
	owner := map[string]inc{}
	current := map[inc]string{}
	retired := map[string]bool{}
	var vs []Violation
	for _, s := range samples {
		k := inc{s.Node, s.Start}
		if o, ok := owner[s.ID]; ok && o != k {
			vs = append(vs, Violation{Check: NodeIDReuse, Detail: fmt.Sprintf("id %s was node %d (start %d) and came back on node %d (start %d)", s.ID, o.node, o.start, s.Node, s.Start)})
			continue
		}
		if retired[s.ID] && current[k] != s.ID {
			vs = append(vs, Violation{Check: NodeIDReuse, Detail: fmt.Sprintf("node %d (start %d) went back to its old id %s", s.Node, s.Start, s.ID)})
			continue
		}
		owner[s.ID] = k
		if cur, ok := current[k]; ok && cur != s.ID {
			retired[cur] = true
		}
		current[k] = s.ID
	}
	return vs
}

// formatOps is ops one a line, indented.
func formatOps(ops []Op) string {
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "  %s\n", o)
	}
	return strings.TrimRight(b.String(), "\n")
}

// CheckOneHome checks that an object was answered by one home at a time,
// from the node each acknowledged call ran on. A home gives its object up
// only for good (its id never returns), so homes follow one another: when
// a call that home A ran had returned before a call that home B ran was
// sent, A came before B. If B also came before A, the two answered
// overlapping stretches of time: two homes at once, whatever the values
// read (a stale read would be one symptom, a lost write another).
func CheckOneHome(object string, ops []Op) []Violation {
	// For each home, its first return and its last call: A came before B
	// exactly when A's first return precedes B's last call.
	type span struct {
		firstReturn, lastCall int64
		first, last           Op
	}
	spans := map[string]*span{}
	var homes []string
	for _, o := range ops {
		if o.Outcome != OK || o.Home == "" {
			continue
		}
		s, ok := spans[o.Home]
		if !ok {
			s = &span{firstReturn: o.Return, lastCall: o.Call, first: o, last: o}
			spans[o.Home] = s
			homes = append(homes, o.Home)
		}
		if o.Return < s.firstReturn {
			s.firstReturn, s.first = o.Return, o
		}
		if o.Call > s.lastCall {
			s.lastCall, s.last = o.Call, o
		}
	}
	sort.Strings(homes)
	var vs []Violation
	for i, a := range homes {
		for _, b := range homes[i+1:] {
			sa, sb := spans[a], spans[b]
			if sa.firstReturn < sb.lastCall && sb.firstReturn < sa.lastCall {
				vs = append(vs, Violation{Check: OneHome, Object: object, Detail: fmt.Sprintf(
					"%s and %s each answered after the other had: %s returned before %s was sent, and %s returned before %s was sent",
					a, b, sa.first, sb.last, sb.first, sa.last)})
			}
		}
	}
	return vs
}
