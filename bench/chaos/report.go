package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// Result is what a soak did and found.
type Result struct {
	Seed     uint64 `json:"seed"`
	Nodes    int    `json:"nodes"`
	Objects  int    `json:"objects"`
	Clients  int    `json:"clients"`
	Duration string `json:"duration"`
	LeaseTTL string `json:"lease_ttl"`
	// Dir holds the nodes' data and logs and the failing histories ("" when
	// a clean run's temporary directory was removed).
	Dir  string   `json:"dir,omitempty"`
	Logs []string `json:"logs,omitempty"`

	Ops       int            `json:"ops"`
	Writes    int            `json:"writes"`
	Reads     int            `json:"reads"`
	Outcomes  map[string]int `json:"outcomes"`
	Faults    []Fault        `json:"faults"`
	FaultKind map[string]int `json:"faults_by_kind"`
	IDs       int            `json:"node_ids"` // distinct node ids seen
	// LeasesLost counts the nodes' "lease lost" log lines: a paused node
	// loses its lease by design; any more are leases that lapsed on their
	// own (a missed heartbeat, a leader election), faults nobody scheduled.
	LeasesLost int `json:"leases_lost"`

	// Followers is what the durable followers' check covered.
	Followers EventCheck `json:"followers"`
	// Subscribers and Watchers are the stream subscribers' and the
	// WebSocket watchers' checks; WatchLost of WatchTotal events published
	// while a watcher's connection was open did not reach it.
	Subscribers EventCheck `json:"subscribers"`
	Watchers    EventCheck `json:"watchers"`
	WatchLost   int        `json:"watch_lost"`
	WatchTotal  int        `json:"watch_total"`

	// Linearizable is how many objects porcupine found linearizable.
	Linearizable int `json:"linearizable"`
	// Availability is per object, worst first.
	Availability []Availability `json:"availability"`
	// Latency of acknowledged calls, ms: overlapping a fault or not.
	P50Fault   float64     `json:"p50_fault_ms"`
	P99Fault   float64     `json:"p99_fault_ms"`
	P50Calm    float64     `json:"p50_calm_ms"`
	P99Calm    float64     `json:"p99_calm_ms"`
	Violations []Violation `json:"violations"`
	// CopiesShort lists the objects with fewer current copies than they
	// want once the cluster healed after the run (40 s after every home
	// was live, a copy's longest backoff and more): not a broken guarantee
	// the checks test, but a margin lost.
	CopiesShort []string `json:"copies_short,omitempty"`
	// Error is why the run could not finish as planned (the cluster did
	// not heal), if it did not.
	Error string `json:"error,omitempty"`
}

// EventCheck is what one check of the counters' event readers covered:
// how many readers, the log events checked against them, and the
// violations found.
type EventCheck struct {
	Objects     int `json:"objects"`
	Events      int `json:"events"`
	Connections int `json:"connections,omitempty"`
	// Ends counts why the connections ended: "node down 4, idle 2".
	Ends       string `json:"ends,omitempty"`
	Violations int    `json:"violations"`
}

// Availability is one object's: the longest time between two acknowledged
// calls with failed calls between them, and the share of its calls that
// failed.
type Availability struct {
	Object        string  `json:"object"`
	LongestDownMs float64 `json:"longest_down_ms"`
	Failed        float64 `json:"failed_share"`
	Calls         int     `json:"calls"`
}

// summarize counts every operation; availability and latency are the
// workload's clients' only (the final reads after the run are checked but
// not timed).
func (r *Result) summarize(ops []Op, faults []Fault, clients int) {
	r.Ops = len(ops)
	r.Outcomes = map[string]int{}
	r.FaultKind = map[string]int{}
	for _, f := range faults {
		r.FaultKind[f.Kind]++
	}
	var calm, faulty []float64
	for _, o := range ops {
		r.Outcomes[string(o.Outcome)]++
		if o.Kind == Write {
			r.Writes++
		} else {
			r.Reads++
		}
		if o.Outcome != OK || o.Client >= clients {
			continue
		}
		ms := float64(o.Return-o.Call) / 1e6
		during := false
		for _, f := range faults {
			if o.Call <= f.End && o.Return >= f.Start {
				during = true
				break
			}
		}
		if during {
			faulty = append(faulty, ms)
		} else {
			calm = append(calm, ms)
		}
	}
	r.P50Fault, r.P99Fault = quantile(faulty, 0.5), quantile(faulty, 0.99)
	r.P50Calm, r.P99Calm = quantile(calm, 0.5), quantile(calm, 0.99)
	var workload []Op
	for _, o := range ops {
		if o.Client < clients {
			workload = append(workload, o)
		}
	}
	for obj, hist := range ByObject(workload) {
		a := Availability{Object: obj, Calls: len(hist)}
		byReturn := slices.Clone(hist)
		sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
		failed, lastOK, failedSince := 0, int64(-1), false
		for _, o := range byReturn {
			if o.Outcome != OK {
				failed++
				failedSince = true
				continue
			}
			if failedSince && lastOK >= 0 {
				a.LongestDownMs = max(a.LongestDownMs, float64(o.Return-lastOK)/1e6)
			}
			lastOK, failedSince = o.Return, false
		}
		a.Failed = float64(failed) / float64(len(hist))
		r.Availability = append(r.Availability, a)
	}
	sort.Slice(r.Availability, func(i, j int) bool { return r.Availability[i].LongestDownMs > r.Availability[j].LongestDownMs })
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// WriteTable prints the summary, and every violation with what repeats it.
func (r *Result) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "chaos soak: %d nodes, %d objects, %d clients, %s, lease TTL %s, seed %d\n", r.Nodes, r.Objects, r.Clients, r.Duration, r.LeaseTTL, r.Seed)
	fmt.Fprintf(w, "operations   %d (%d adds, %d gets): %d ok, %d ambiguous, %d refused\n", r.Ops, r.Writes, r.Reads, r.Outcomes[string(OK)], r.Outcomes[string(Ambiguous)], r.Outcomes[string(Refused)])
	var kinds []string
	for _, k := range append(Kinds, Exited) {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.FaultKind[k]))
	}
	overlaps := 0
	for _, f := range r.Faults {
		if f.Overlaps {
			overlaps++
		}
	}
	fmt.Fprintf(w, "faults       %d (%s), %d with a second node down at once; node ids seen %d; leases lost %d (%d by pauses)\n", len(r.Faults), strings.Join(kinds, ", "), overlaps, r.IDs, r.LeasesLost, r.FaultKind[Pause])
	for _, f := range r.Faults {
		fmt.Fprintf(w, "  %s\n", f)
	}
	fmt.Fprintf(w, "latency      ms p50/p99: during faults %.1f/%.1f, without %.1f/%.1f\n", r.P50Fault, r.P99Fault, r.P50Calm, r.P99Calm)
	if len(r.Availability) > 0 {
		worst := r.Availability[0]
		var failed, longest float64
		for _, a := range r.Availability {
			failed += a.Failed
			longest += a.LongestDownMs
		}
		n := float64(len(r.Availability))
		fmt.Fprintf(w, "availability longest unavailable window: worst %s %.1f s, mean %.1f s; failed calls: mean %.1f%% per object\n",
			worst.Object, worst.LongestDownMs/1e3, longest/n/1e3, 100*failed/n)
	}
	fmt.Fprintf(w, "checks       linearizable %d/%d objects; violations %d\n", r.Linearizable, r.Objects, len(r.Violations))
	fmt.Fprintf(w, "followers    %d tallies, %d events checked exactly once by identity; violations %d\n", r.Followers.Objects, r.Followers.Events, r.Followers.Violations)
	fmt.Fprintf(w, "subscribers  %d, %d events got over %d connections, each resumed after its checkpoint with no gap; violations %d\n", r.Subscribers.Objects, r.Subscribers.Events, r.Subscribers.Connections, r.Subscribers.Violations)
	if r.Subscribers.Ends != "" {
		fmt.Fprintf(w, "             connections ended: %s\n", r.Subscribers.Ends)
	}
	loss := 0.0
	if r.WatchTotal > 0 {
		loss = 100 * float64(r.WatchLost) / float64(r.WatchTotal)
	}
	fmt.Fprintf(w, "watchers     %d, %d events got over %d connections, none twice; violations %d; lost %d of %d published while connected (%.1f%%)\n", r.Watchers.Objects, r.Watchers.Events, r.Watchers.Connections, r.Watchers.Violations, r.WatchLost, r.WatchTotal, loss)
	if r.Watchers.Ends != "" {
		fmt.Fprintf(w, "             connections ended: %s\n", r.Watchers.Ends)
	}
	// A few of each kind per object: a lost log makes thousands alike.
	shown := map[[2]string]int{}
	for _, v := range r.Violations {
		k := [2]string{v.Check, v.Object}
		if shown[k]++; shown[k] <= 5 {
			fmt.Fprintf(w, "VIOLATION %s\n", v)
		}
	}
	for k, n := range shown {
		if n > 5 {
			fmt.Fprintf(w, "VIOLATION %s: %s: %d more like these (--json lists all)\n", k[0], k[1], n-5)
		}
	}
	for _, c := range r.CopiesShort {
		fmt.Fprintf(w, "COPIES SHORT after the run: %s\n", c)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "ERROR %s\n", r.Error)
	}
	if len(r.Violations) > 0 || r.Error != "" {
		fmt.Fprintf(w, "repeat with --seed %d; node logs:\n", r.Seed)
		for _, l := range r.Logs {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}
