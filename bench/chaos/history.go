package chaos

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Kind is what an operation did to a counter.
type Kind string

// The operations of the workload on the counter example.
const (
	Write Kind = "add" // add {"amount": A}: replies with the value after it
	Read  Kind = "get" // replies with the current value
)

// Outcome is what a client can tell about an operation from its reply.
type Outcome string

// Outcomes, from the client's side.
const (
	// OK: the node replied with a value.
	OK Outcome = "ok"
	// Ambiguous: no reply (timeout, reset) or a 5xx: a write may have been
	// applied, and may show up in the object's state at any time later.
	Ambiguous Outcome = "ambiguous"
	// Refused: the call never reached a node (connection refused) or a node
	// rejected it before running it (4xx): nothing was applied.
	Refused Outcome = "refused"
)

// Op is one recorded operation. Times are nanoseconds since the run's
// start.
type Op struct {
	ID      int     `json:"id"`
	Client  int     `json:"client"`
	Object  string  `json:"object"`
	Kind    Kind    `json:"kind"`
	Amount  int64   `json:"amount,omitempty"` // writes: unique in the run, so the object's log names the write
	Value   int64   `json:"value"`            // the reply's value (OK only)
	Call    int64   `json:"call"`
	Return  int64   `json:"return"`
	Outcome Outcome `json:"outcome"`
	Err     string  `json:"err,omitempty"`
	Node    int     `json:"node"`           // the node the client called
	NodeID  string  `json:"node_id"`        // its id when the call was sent, as last seen
	Home    string  `json:"home,omitempty"` // the node that ran it (OK only): the object's home then
}

func (o Op) String() string {
	in := ""
	if o.Kind == Write {
		in = fmt.Sprintf("(%d)", o.Amount)
	}
	out := fmt.Sprint(o.Value)
	if o.Outcome != OK {
		out = fmt.Sprintf("%s: %s", o.Outcome, o.Err)
	}
	home := ""
	if o.Home != "" {
		home = ", ran on " + o.Home
	}
	return fmt.Sprintf("#%d c%d %s%s → %s  [%.3f s, %.3f s] via node %d (%s%s)",
		o.ID, o.Client, o.Kind, in, out, sec(o.Call), sec(o.Return), o.Node, o.NodeID, home)
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

// Recorder keeps every operation of a run. Safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex // guards ops
	ops   []Op
}

// NewRecorder starts the run's clock.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the time since the run's start, in ns.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records a completed (or given up) operation and returns its id.
func (r *Recorder) Add(o Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	o.ID = len(r.ops) + 1
	r.ops = append(r.ops, o)
	return o.ID
}

// Ops returns a copy of every operation, in invocation order.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	out := append([]Op(nil), r.ops...)
	r.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Call < out[j].Call })
	return out
}

// ByObject splits ops by object, each in invocation order.
func ByObject(ops []Op) map[string][]Op {
	m := map[string][]Op{}
	for _, o := range ops {
		m[o.Object] = append(m[o.Object], o)
	}
	return m
}
