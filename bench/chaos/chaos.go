// Package chaos is the chaos soak: it starts a cluster of `host serve`
// processes with replicas on, runs clients that add to and read counters
// (the counter example) through every node while a seeded schedule kills
// (SIGKILL), pauses (SIGSTOP past the lease) and gracefully restarts
// nodes, records every operation, and at the end checks that the history
// could have happened on one correct copy of each counter (porcupine),
// that the counters' logs hold every acknowledged write once and nothing
// else, and that node ids never return.
//
// Beside the clients, the counters' events are read the three ways the
// product offers, through the same faults: durable followers (tally
// objects) must count each event of their counter's log exactly once;
// stream subscribers, resuming from their checkpoint through another node
// whenever their stream breaks, must get every event in order with no
// gap; WebSocket watchers must never get an event twice on one connection,
// and what they miss is measured, not a violation. `host bench chaos` runs
// it by hand; its test runs it at a small size.
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/durable-host/host/bench"
	examples "github.com/durable-host/host/examples/wasm"
	"github.com/durable-host/host/host/client"
)

// Config is one soak. DefaultConfig gives the defaults; Validate checks it.
type Config struct {
	// Exe is the `host` executable the nodes run.
	Exe string
	// Nodes is how many node processes (5).
	Nodes int
	// Duration is how long the clients run (10 min).
	Duration time.Duration
	// Seed picks the clients' operations and the fault schedule.
	Seed uint64
	// Objects is how many counters the clients share (200).
	Objects int
	// Clients is how many clients (8), each in a closed loop.
	Clients int
	// Followers is how many counters have a durable follower (16): a
	// tally object, set up before the faults, following the
	// counter's "changes" topic.
	Followers int
	// Subscribers is how many stream subscribers (8), each reading one
	// counter's stream through a random live node from its start, and
	// resuming from its checkpoint through another when it breaks.
	Subscribers int
	// Watchers is how many WebSocket watchers (8), each following one
	// counter through a random live node, connecting again when dropped.
	Watchers int
	// Think is a client's pause between two calls (20 ms): the clients
	// load the cluster without saturating a small machine, where missed
	// heartbeats would add faults nobody scheduled.
	Think time.Duration
	// CallTimeout is how long a client waits for a reply (3 s); a call
	// given up on is ambiguous.
	CallTimeout time.Duration
	// LeaseTTL is the nodes' --lease-ttl (6 s): short, so takeovers happen
	// in the run.
	LeaseTTL time.Duration
	// Replicas is the nodes' --replicas (2).
	Replicas int
	// SnapshotEvery is the nodes' --snapshot-every (200), so snapshots and
	// purges happen under the faults too.
	SnapshotEvery int
	// FaultGap is the mean wait between one fault healing and the next
	// starting (8 s; each gap is uniform in [0.5, 1.5] × FaultGap).
	FaultGap time.Duration
	// MaxDown is how many nodes may be down at once (2): with 2, one
	// fault in three (a kill -9 or a pause) takes a second node down with
	// it. Two of five nodes down can leave a 3-way replicated JetStream
	// stream without a quorum: writes stall until one returns, a loss of
	// availability, not of safety.
	MaxDown int
	// HealTimeout bounds how long the cluster may take to list every node
	// again after a fault (2 min); past it the run fails.
	HealTimeout time.Duration
	// CheckTimeout bounds porcupine's search per object (60 s); a search
	// cut off is reported as undecided, a failure.
	CheckTimeout time.Duration
	// Dir keeps the nodes' data and logs ("" = a temporary directory,
	// removed after a clean run, kept after a violation or when objects
	// were left short of copies).
	Dir string
	// LogLevel is the nodes' --log-level (info).
	LogLevel string
	// Progress, if set, hears how far the run is.
	Progress bench.Progress
}

// DefaultConfig is a full-size soak (10 minutes).
func DefaultConfig() Config {
	return Config{
		Nodes: 5, Duration: 10 * time.Minute, Seed: 1, Objects: 200, Clients: 8, Followers: 16, Subscribers: 8, Watchers: 8,
		Think: 20 * time.Millisecond, CallTimeout: 3 * time.Second,
		LeaseTTL: 6 * time.Second, Replicas: 2, SnapshotEvery: 200,
		FaultGap: 8 * time.Second, MaxDown: 2, HealTimeout: 2 * time.Minute,
		CheckTimeout: 60 * time.Second, LogLevel: "info",
	}
}

// Validate reports every field that is out of range.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Exe == "" {
		bad("no host executable")
	}
	if c.Nodes < 3 {
		bad("nodes %d: need at least 3 to lose one and keep a majority", c.Nodes)
	}
	if c.Replicas < 1 || c.Replicas >= c.Nodes {
		bad("replicas %d: need 1 to nodes-1 (%d)", c.Replicas, c.Nodes-1)
	}
	if c.Duration <= 0 || c.Objects < 1 || c.Clients < 1 {
		bad("duration, objects and clients must be positive")
	}
	if c.Followers < 0 || c.Followers > c.Objects {
		bad("followers %d: need 0 to objects (%d)", c.Followers, c.Objects)
	}
	if c.MaxDown < 1 || c.MaxDown > 2 || c.MaxDown > (c.Nodes-1)/2 {
		bad("max down %d: need 1 or 2, and fewer than half the nodes (%d)", c.MaxDown, c.Nodes)
	}
	if c.Subscribers < 0 || c.Watchers < 0 {
		bad("subscribers and watchers must not be negative")
	}
	if c.CallTimeout <= 0 || c.LeaseTTL <= 0 || c.FaultGap <= 0 || c.HealTimeout <= 0 || c.CheckTimeout <= 0 {
		bad("call timeout, lease TTL, fault gap, heal and check timeouts must be positive")
	}
	return errors.Join(errs...)
}

// copiesWait bounds the wait for every object's copies after the run: a
// little more than a copy's longest backoff.
const copiesWait = 40 * time.Second

// minimizeBudget bounds each search for a smallest failing history.
const minimizeBudget = 30 * time.Second

// Run runs one soak. It returns an error when the run could not be done
// (the cluster did not start or did not heal); violations of the
// guarantees are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	dir, temp := cfg.Dir, cfg.Dir == ""
	if temp {
		d, err := os.MkdirTemp("", "host-chaos-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	res := &Result{Seed: cfg.Seed, Dir: dir, Nodes: cfg.Nodes, Objects: cfg.Objects, Clients: cfg.Clients, Duration: cfg.Duration.String(), LeaseTTL: cfg.LeaseTTL.String()}
	err := run(ctx, cfg, dir, res)
	if err != nil {
		res.Error = err.Error()
	}
	if temp && err == nil && len(res.Violations) == 0 && len(res.CopiesShort) == 0 {
		os.RemoveAll(dir)
		res.Dir = ""
	}
	return res, err
}

func run(ctx context.Context, cfg Config, dir string, res *Result) error {
	built, err := examples.Build(ctx, filepath.Join(dir, "wasm"), examples.Options{Only: []string{"counter", "tally"}, SkipRust: true})
	if err != nil {
		return fmt.Errorf("build the counter and tally examples: %w", err)
	}
	cluster, err := bench.StartCluster(ctx, bench.ClusterConfig{
		Exe: cfg.Exe, Nodes: cfg.Nodes, Mode: bench.ModeNode, LeaseTTL: cfg.LeaseTTL,
		LogLevel: cfg.LogLevel, Dir: dir, Progress: cfg.Progress,
		Args: []string{"--replicas", strconv.Itoa(cfg.Replicas), "--snapshot-every", strconv.Itoa(cfg.SnapshotEvery)},
	})
	if err != nil {
		return err
	}
	defer cluster.Close()
	for _, n := range cluster.Nodes {
		res.Logs = append(res.Logs, n.LogPath)
	}
	for _, b := range built {
		wasm, err := os.ReadFile(b.Path)
		if err != nil {
			return err
		}
		if _, err := cluster.Nodes[0].Client.Upload(ctx, b.Name, wasm); err != nil {
			return fmt.Errorf("upload %s: %w", b.Name, err)
		}
	}
	if err := setupFollowers(ctx, cfg, cluster); err != nil {
		return err
	}

	rec := NewRecorder()
	ns := newNodes(cfg.Nodes)
	w := &workload{cfg: cfg, cluster: cluster, nodes: ns, rec: rec}
	var samplesMu sync.Mutex
	var samples []IDSample
	w.sampleIDs(ctx, &samples, &samplesMu)

	// The readers start before the faults and the writes, and stop once
	// they caught up with the final logs.
	readCtx, stopReaders := context.WithCancel(ctx)
	var readers sync.WaitGroup
	defer func() { stopReaders(); readers.Wait() }()
	subs := make([]*subscriber, cfg.Subscribers)
	for k := range subs {
		subs[k] = &subscriber{object: objectName((4*k + 1) % cfg.Objects)}
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(k)+300))
		readers.Go(func() { subs[k].run(readCtx, w, rng) })
	}
	watchers := make([]*watcher, cfg.Watchers)
	for k := range watchers {
		watchers[k] = &watcher{object: objectName((4*k + 2) % cfg.Objects)}
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(k)+400))
		readers.Go(func() { watchers[k].run(readCtx, w, rng) })
	}

	monCtx, stopMon := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		w.monitor(monCtx, &samples, &samplesMu)
	}()
	defer func() { stopMon(); <-monDone }()

	// Faults start for cfg.Duration; the clients write until the last
	// fault has healed, so every takeover and the copies made after it
	// happen under the workload (an object taken over once every client
	// stopped may stay a copy short while idle: the README's gap, not
	// what this soak checks).
	runCtx, stopRun := context.WithTimeout(ctx, cfg.Duration)
	defer stopRun()
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	sched := &schedule{cfg: cfg, cluster: cluster, nodes: ns, rec: rec, writing: func() bool { return clientCtx.Err() == nil }}
	var faultErr error
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		_, faultErr = sched.run(runCtx)
	}()
	var clients sync.WaitGroup
	for c := range cfg.Clients {
		clients.Add(1)
		go func() {
			defer clients.Done()
			w.run(clientCtx, c)
		}()
	}
	if cfg.Progress != nil {
		go func() {
			for runCtx.Err() == nil {
				cfg.Progress("chaos workload (s)", int(sec(rec.Now())), int(cfg.Duration.Seconds()))
				select {
				case <-runCtx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	<-faultsDone
	stopClients()
	clients.Wait()
	// A cluster that did not heal is a finding too, but the checks still
	// run on what the clients saw: they say whether anything was lost.
	var healErr error
	if faultErr != nil {
		healErr = fmt.Errorf("the cluster did not heal: %w (seed %d, logs in %s)", faultErr, cfg.Seed, dir)
	} else {
		// The final reads need live homes, not copies: an object taken
		// over after the clients stopped may stay a copy short while idle
		// (reported, below), and nothing the checks read depends on it.
		if err := sched.waitHealed(ctx); err != nil {
			healErr = fmt.Errorf("the cluster did not heal after the run: %w (seed %d, logs in %s)", err, cfg.Seed, dir)
		} else {
			// A copy whose making failed while a node was down is tried
			// again with a backoff (500 ms doubling, 32 s at most): wait
			// for the copies as long as that, not a fixed moment.
			deadline := time.Now().Add(copiesWait)
			for {
				_, res.CopiesShort = sched.unhealed(ctx)
				if len(res.CopiesShort) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
	}
	faults := sched.faults
	res.Faults = faults
	for _, f := range faults {
		if f.Kind == Exited {
			res.Violations = append(res.Violations, Violation{Check: NodeExited, Detail: fmt.Sprintf("node %d exited on its own (found at %.1f s); started again:\n%s", f.Node, sec(f.Start), f.Note)})
		}
	}

	// Final state and logs, read through the nodes in turn; the final get
	// is part of each object's history.
	final := map[string]int64{}
	logs := map[string][]Change{}
	for i := range cfg.Objects {
		obj := objectName(i)
		v, err := finalValue(ctx, w, i%cfg.Nodes, obj)
		if err != nil {
			res.Violations = append(res.Violations, Violation{Check: LogConsistency, Object: obj, Detail: fmt.Sprintf("no final value: %v", err)})
			continue
		}
		// Through the next node, else any other: a log no node will
		// read is one violation, and leaves the object unchecked (its
		// writes are not all "lost" because a read failed).
		var errs []error
		for k := range cfg.Nodes {
			l, err := readLog(ctx, cluster.Nodes[(i+1+k)%cfg.Nodes].Client, obj, v)
			if err == nil {
				final[obj], logs[obj] = v, l
				break
			}
			errs = append(errs, err)
		}
		if _, ok := final[obj]; !ok {
			res.Violations = append(res.Violations, Violation{Check: LogConsistency, Object: obj, Detail: fmt.Sprintf("no node reads the log to its final value %d: %v", v, errors.Join(errs...))})
		}
	}
	stopMon()
	<-monDone
	samplesMu.Lock()
	res.Violations = append(res.Violations, CheckIDs(samples)...)
	res.IDs = distinctIDs(samples)
	samplesMu.Unlock()

	// Each tally must catch up with its counter's whole log; one deadline
	// for all of them, past which what they hold is checked.
	followDeadline := time.Now().Add(cfg.HealTimeout)
	for i := range cfg.Objects {
		obj := objectName(i)
		l, ok := logs[obj]
		if !cfg.followed(i) || !ok {
			continue
		}
		counts, seen, err := readTally(ctx, cluster, i+2, tallyName(i), obj, len(l), max(0, time.Until(followDeadline)))
		if err != nil {
			res.Violations = append(res.Violations, Violation{Check: FollowerOnce, Object: tallyName(i), Detail: err.Error()})
			continue
		}
		n, vs := CheckFollower(tallyName(i), obj, seen, counts.Duplicates, l)
		res.Followers.Objects++
		res.Followers.Events += n
		res.Followers.Violations += len(vs)
		res.Violations = append(res.Violations, vs...)
	}

	// Each subscriber must reach its counter's last event; one deadline
	// for all, past which what they got is checked.
	for _, sub := range subs {
		want := uint64(len(logs[sub.object]))
		for sub.last.Load() < want && time.Now().Before(followDeadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	stopReaders()
	readers.Wait()
	var subEnds, watchEnds []string
	for k, sub := range subs {
		l, ok := logs[sub.object]
		if !ok {
			continue
		}
		sessions := sub.Sessions()
		n, vs := CheckSubscriber(fmt.Sprintf("subscriber %d", k), sub.object, sessions, l)
		res.Subscribers.Objects++
		res.Subscribers.Events += n
		res.Subscribers.Violations += len(vs)
		res.Subscribers.Connections += len(sessions)
		for _, s := range sessions {
			subEnds = append(subEnds, s.End)
		}
		res.Violations = append(res.Violations, vs...)
	}
	for k, wt := range watchers {
		l, ok := logs[wt.object]
		if !ok {
			continue
		}
		conns := wt.Conns()
		loss, vs := CheckWatcher(fmt.Sprintf("watcher %d", k), wt.object, conns, l)
		res.Watchers.Objects++
		res.Watchers.Connections += len(conns)
		for _, c := range conns {
			watchEnds = append(watchEnds, c.End)
			res.Watchers.Events += len(c.Events)
		}
		res.Watchers.Violations += len(vs)
		res.WatchLost += loss.Lost
		res.WatchTotal += loss.Total
		res.Violations = append(res.Violations, vs...)
	}

	res.Subscribers.Ends, res.Watchers.Ends = ends(subEnds), ends(watchEnds)

	ops := rec.Ops()
	byObj := ByObject(ops)
	for i := range cfg.Objects {
		obj := objectName(i)
		v, ok := final[obj]
		if !ok {
			continue
		}
		res.Violations = append(res.Violations, CheckOneHome(obj, byObj[obj])...)
		applied, vs := CheckObjectLog(obj, byObj[obj], logs[obj], v)
		for k := range vs {
			vs[k].File = writeHistory(dir, obj, byObj[obj])
		}
		res.Violations = append(res.Violations, vs...)
		l := CheckLinearizable(byObj[obj], applied, cfg.CheckTimeout)
		switch l.Result {
		case "Ok":
			res.Linearizable++
		case "Illegal":
			res.Violations = append(res.Violations, illegal(dir, obj, byObj[obj], applied, l))
		default:
			res.Violations = append(res.Violations, Violation{Check: Linearizability, Object: obj, Detail: fmt.Sprintf("undecided: porcupine's search ran past %v over %d operations", cfg.CheckTimeout, len(l.Ops)), File: writeHistory(dir, obj, byObj[obj])})
		}
	}
	res.summarize(ops, faults, cfg.Clients)
	for _, l := range res.Logs {
		if b, err := os.ReadFile(l); err == nil {
			res.LeasesLost += bytes.Count(b, []byte(`msg="lease lost`))
		}
	}
	return healErr
}

// illegal is the violation of an object's history porcupine found illegal
// (l): the operation no single-copy order explains, the smallest failing
// history found, the operations around the stuck one, and files in dir
// with the whole history and porcupine's view of it.
func illegal(dir, obj string, ops []Op, applied Applied, l Linearization) Violation {
	stuck, around := l.Stuck()
	v := Violation{Check: Linearizability, Object: obj, Detail: "no single-copy order explains op #" + strconv.Itoa(stuck.ID), History: formatOps(around)}
	// From the operations around the stuck one when they fail alone,
	// else from all.
	m := MinimizeHistory(around, applied, minimizeBudget)
	if !m.Illegal {
		m = MinimizeHistory(ops, applied, minimizeBudget)
	}
	if m.Illegal {
		state := "1-minimal"
		if !m.Done {
			state = "not minimal: the search ran out of time"
		}
		v.History = fmt.Sprintf("  smallest failing history found (%d operations, %s; %d more writes kept as values, each at any time):\n%s\n  around op #%d:\n%s",
			len(m.Ops), state, m.Relaxed, formatOps(m.Ops), stuck.ID, formatOps(around))
	}
	if dir == "" {
		return v
	}
	v.File = writeHistory(dir, obj, ops)
	html := filepath.Join(dir, "linearizability-"+filepath.Base(obj)+".html")
	if l.Visualize(html) == nil {
		v.File += ", " + html
	}
	return v
}

// finalValue gets obj's value through node i (the next node on failure),
// recorded as one more read of its history.
func finalValue(ctx context.Context, w *workload, i int, obj string) (int64, error) {
	deadline := time.Now().Add(w.cfg.HealTimeout)
	for {
		o := w.call(ctx, w.cfg.Clients, i, obj, Read)
		w.rec.Add(o)
		if o.Outcome == OK {
			return o.Value, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s after %v", o.Err, w.cfg.HealTimeout)
		}
		i = (i + 1) % w.cfg.Nodes
		time.Sleep(200 * time.Millisecond)
	}
}

// readLog reads obj's "changes" events from its start until one holds
// final (the values only grow, so that is the last).
func readLog(ctx context.Context, c *client.Client, obj string, final int64) ([]Change, error) {
	var log []Change
	if final == 0 {
		return nil, nil
	}
	zero := uint64(0)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var bad error
	err := c.Subscribe(sctx, obj, client.SubscribeOptions{Topic: "changes", After: &zero}, func(data []byte) bool {
		var ev envelope
		if err := json.Unmarshal(data, &ev); err != nil {
			bad = fmt.Errorf("stream event %q: %w", data, err)
			return false
		}
		log = append(log, Change{Seq: ev.Seq, Value: ev.Payload.Value, Time: ev.Time})
		return ev.Payload.Value < final
	})
	if bad != nil {
		return log, bad
	}
	if n := len(log); n == 0 || log[n-1].Value != final {
		return log, fmt.Errorf("the log read through %s stops after %d changes short of the final value %d (%v)", c.Base, n, final, err)
	}
	return log, nil
}

// writeHistory writes obj's whole history to a file in dir and returns its
// path ("" if it could not).
func writeHistory(dir, obj string, ops []Op) string {
	path := filepath.Join(dir, "history-"+filepath.Base(obj)+".txt")
	if err := os.WriteFile(path, []byte(formatOps(ops)+"\n"), 0o644); err != nil {
		return ""
	}
	return path
}

func distinctIDs(samples []IDSample) int {
	ids := map[string]bool{}
	for _, s := range samples {
		ids[s.ID] = true
	}
	return len(ids)
}
