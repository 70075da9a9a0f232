package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/durable-host/host/bench"
)

// The kinds of fault.
const (
	Kill9   = "kill9"   // SIGKILL, a short time down, started again on its data
	Pause   = "pause"   // SIGSTOP past the lease TTL, then SIGCONT
	Restart = "restart" // SIGTERM (graceful), started again on its data
	// Exited is not scheduled: a node that exited on its own (a crash),
	// found and started again so the run goes on; each is a violation.
	Exited = "exited"
)

// Kinds are the fault kinds; each round of the schedule takes all of them
// in a seeded order.
var Kinds = []string{Kill9, Pause, Restart}

// Fault is one injected fault. Start and End are ns since the run's start:
// from the signal to the cluster being whole again (see waitHealed).
type Fault struct {
	Kind  string `json:"kind"`
	Node  int    `json:"node"`
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	Note  string `json:"note,omitempty"`
	// Overlaps says this fault took its node down while another fault
	// had one down: two nodes down at once.
	Overlaps bool `json:"overlaps,omitempty"`
}

func (f Fault) String() string {
	s := fmt.Sprintf("%-7s node %d  [%.1f s, %.1f s]", f.Kind, f.Node, sec(f.Start), sec(f.End))
	if f.Note != "" {
		// The first line, and a panic's, if any: the rest is in the
		// violation and the node's log.
		lines := strings.Split(f.Note, "\n")
		s += "  " + lines[0]
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "panic: ") {
				s += "; " + l
				break
			}
		}
	}
	return s
}

// schedule injects faults, one node at a time, until ctx ends, and lets the
// cluster heal after each: the fault in progress when ctx ends is
// finished. It returns the faults and the first error that left the
// cluster unhealed.
type schedule struct {
	cfg     Config
	cluster *bench.Cluster
	nodes   *nodes
	rec     *Recorder
	// writing says whether the clients still write; a heal waits for
	// every object's copies only then.
	writing func() bool
	faults  []Fault
}

func (s *schedule) run(ctx context.Context) ([]Fault, error) {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 1))
	n := len(s.cluster.Nodes)
	var round []int
	for {
		gap := time.Duration(float64(s.cfg.FaultGap) * (0.5 + rng.Float64()))
		if err := s.idle(ctx, gap); err != nil {
			return s.faults, err
		}
		if ctx.Err() != nil {
			return s.faults, nil
		}
		if len(round) == 0 {
			round = rng.Perm(len(Kinds))
		}
		kind := Kinds[round[0]]
		round = round[1:]
		f := Fault{Kind: kind, Node: rng.IntN(n)}
		// One fault in three (not a graceful restart: bench's Restart
		// waits for every node to list all, which a second node down
		// would fail) takes a second node down with it, from up to a
		// second later: a kill -9 or a pause of its own.
		var second *Fault
		var secondRng *rand.Rand
		var delay time.Duration
		if s.cfg.MaxDown >= 2 && kind != Restart && rng.IntN(3) == 0 {
			second = &Fault{Kind: []string{Kill9, Pause}[rng.IntN(2)], Node: (f.Node + 1 + rng.IntN(n-1)) % n, Overlaps: true}
			secondRng = rand.New(rand.NewPCG(s.cfg.Seed, rng.Uint64()))
			delay = time.Duration(rng.Int64N(int64(time.Second)))
		}
		var secondErr error
		secondDone := make(chan struct{})
		if second != nil {
			go func() {
				defer close(secondDone)
				time.Sleep(delay)
				second.Start = s.rec.Now()
				second.Note = "overlaps the " + kind + " of node " + fmt.Sprint(f.Node)
				secondErr = s.down(second, secondRng)
			}()
		} else {
			close(secondDone)
		}
		f.Start = s.rec.Now()
		err := s.down(&f, rng)
		<-secondDone
		if err == nil {
			err = secondErr
		}
		if err == nil {
			err = s.waitHealed(context.Background())
		}
		f.End = s.rec.Now()
		s.faults = append(s.faults, f)
		if second != nil {
			second.End = f.End
			s.faults = append(s.faults, *second)
		}
		if s.cfg.Progress != nil {
			s.cfg.Progress("fault: "+kind, len(s.faults), len(s.faults))
		}
		if err != nil {
			return s.faults, fmt.Errorf("%s of node %d at %.1f s: %w", kind, f.Node, sec(f.Start), err)
		}
	}
}

// idle waits d (or until ctx ends), starting again any node that exited
// on its own meanwhile.
func (s *schedule) idle(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		if err := s.revive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(250*time.Millisecond, time.Until(end))):
		}
	}
	return nil
}

// revive finds the nodes that exited though no fault stopped them,
// records each (with its log's tail: a panic's trace) and starts it again
// on its data directory.
func (s *schedule) revive() error {
	for i := range s.cluster.Nodes {
		if s.nodes.isDown(i) || s.cluster.Running(i) {
			continue
		}
		f := Fault{Kind: Exited, Node: i, Start: s.rec.Now(), Note: s.cluster.Exited()}
		s.nodes.setDown(i, true)
		s.nodes.restarted(i)
		if err := s.cluster.Start(i); err != nil {
			return err
		}
		err := s.waitHealthy(context.Background(), i)
		s.nodes.setDown(i, false)
		f.End = s.rec.Now()
		s.faults = append(s.faults, f)
		if err != nil {
			return fmt.Errorf("node %d exited on its own and did not come back: %w", i, err)
		}
	}
	return nil
}

// down runs one fault until its node answers again; the caller then waits
// for the cluster to be whole again (waitHealed), its objects' copies too
// while the clients still write (an object the clients left idle may stay
// a copy short, which the run reports at its end).
func (s *schedule) down(f *Fault, rng *rand.Rand) error {
	i := f.Node
	// A fault is not cut short by the run's end: the cluster is healed
	// before the final reads.
	ctx := context.Background()
	s.nodes.setDown(i, true)
	switch f.Kind {
	case Kill9:
		if err := s.cluster.Kill9(i); err != nil {
			return err
		}
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second))))
		s.nodes.restarted(i)
		if err := s.cluster.Start(i); err != nil {
			return err
		}
	case Pause:
		if err := s.cluster.Pause(i); err != nil {
			return err
		}
		time.Sleep(s.cfg.LeaseTTL + time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		if err := s.cluster.Resume(i); err != nil && s.cluster.Running(i) {
			return err
		}
		// A node that finds its lease gone may leave; it is started again.
		// (A stopped process can only die of SIGKILL: from outside.)
		time.Sleep(500 * time.Millisecond)
		if !s.cluster.Running(i) {
			f.Note = strings.TrimPrefix(f.Note+"; exited while paused or after SIGCONT; started again: "+s.cluster.Exited(), "; ")
			s.nodes.restarted(i)
			if err := s.cluster.Start(i); err != nil {
				return err
			}
		}
	case Restart:
		s.nodes.restarted(i)
		if err := s.cluster.Restart(ctx, i); err != nil {
			return err
		}
	}
	if err := s.waitHealthy(ctx, i); err != nil {
		return err
	}
	s.nodes.setDown(i, false)
	return nil
}

// waitHealed waits until the cluster is whole again, so that the next
// fault is the only one: every node lists exactly the live nodes' ids (a
// killed node's old id lingers until its lease lapses, and its objects are
// taken over only then), every object has a live home and, while the
// clients write, its copies again, none far behind. A node that exited on
// its own meanwhile is started again.
func (s *schedule) waitHealed(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.HealTimeout)
	for {
		if err := s.revive(); err != nil {
			return err
		}
		why, short := s.unhealed(ctx)
		if why == "" && (!s.writing() || len(short) == 0) {
			return nil
		}
		if why == "" {
			why = short[0]
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not whole %v after the fault: %s", s.cfg.HealTimeout, why)
		}
		// A pass asks every object's replicas report, which asks every
		// node: passes a second apart leave the nodes to their catching up.
		time.Sleep(time.Second)
	}
}

// unhealed says what is not whole yet ("" when the nodes and homes are),
// and which objects have fewer current copies than they want.
func (s *schedule) unhealed(ctx context.Context) (why string, short []string) {
	// Each request has its own time: a pass asks hundreds, and a bound
	// on the whole pass failed it on a busy cluster whose every answer
	// came in time.
	ctx0 := ctx
	ctx, cancel := context.WithTimeout(ctx0, 5*time.Second)
	defer cancel()
	live := map[string]bool{}
	for i := range s.cluster.Nodes {
		id, err := s.cluster.NodeID(ctx, i)
		if err != nil {
			return fmt.Sprintf("node %d: %v", i, err), nil
		}
		live[id] = true
	}
	for i, n := range s.cluster.Nodes {
		var v struct {
			Nodes []struct {
				ID string `json:"id"`
			} `json:"nodes"`
		}
		if err := n.Client.Cluster(ctx, &v); err != nil {
			return fmt.Sprintf("node %d: %v", i, err), nil
		}
		if len(v.Nodes) != len(live) {
			var ids []string
			for _, m := range v.Nodes {
				ids = append(ids, m.ID)
			}
			var want []string
			for id := range live {
				want = append(want, id)
			}
			sort.Strings(ids)
			sort.Strings(want)
			return fmt.Sprintf("node %d lists %d nodes (%s), %d are live (%s)", i, len(v.Nodes), strings.Join(ids, " "), len(live), strings.Join(want, " ")), nil
		}
		for _, m := range v.Nodes {
			if !live[m.ID] {
				return fmt.Sprintf("node %d lists %s, which is gone", i, m.ID), nil
			}
		}
	}
	for k := range s.cfg.Objects {
		obj := objectName(k)
		var rep struct {
			Home   string `json:"home"`
			Want   int    `json:"want"`
			Copies []struct {
				Node string `json:"node"`
				Home bool   `json:"home"`
				Lag  uint64 `json:"lag"`
			} `json:"copies"`
			Unanswered []string `json:"unanswered"`
		}
		rctx, rcancel := context.WithTimeout(ctx0, 10*time.Second)
		err := s.cluster.Nodes[k%len(s.cluster.Nodes)].Client.Replicas(rctx, obj, &rep)
		rcancel()
		if err != nil {
			return fmt.Sprintf("%s: %v", obj, err), nil
		}
		if rep.Home == "" {
			continue // not used yet
		}
		if !live[rep.Home] {
			return fmt.Sprintf("%s's home %s is gone", obj, rep.Home), nil
		}
		copies := 0
		for _, c := range rep.Copies {
			// A few change sets behind is a copy applying the clients'
			// writes as they come.
			if !c.Home && live[c.Node] && c.Lag <= 16 {
				copies++
			}
		}
		if copies < rep.Want {
			why := fmt.Sprintf("%s has %d current copies of %d", obj, copies, rep.Want)
			if len(rep.Unanswered) > 0 {
				why += " (unanswered: " + strings.Join(rep.Unanswered, "; ") + ")"
			}
			short = append(short, why)
		}
	}
	return "", short
}

// waitHealthy waits for node i to answer /healthz.
func (s *schedule) waitHealthy(ctx context.Context, i int) error {
	deadline := time.Now().Add(s.cfg.HealTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := s.cluster.NodeID(cctx, i)
		cancel()
		if err == nil {
			return nil
		}
		if !s.cluster.Running(i) {
			return fmt.Errorf("node %d exited: %s", i, s.cluster.Exited())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d does not answer /healthz after %v: %w", i, s.cfg.HealTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
