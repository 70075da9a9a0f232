package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/durable-host/host/bench"
	"github.com/durable-host/host/host/client"
)

// nodes is what the clients, the fault schedule and the id monitor share
// about the node processes: which are down, how many times each was
// started, and its id as last seen.
type nodes struct {
	mu    sync.Mutex // guards the slices
	down  []bool
	start []int
	id    []string
}

func newNodes(n int) *nodes {
	return &nodes{down: make([]bool, n), start: make([]int, n), id: make([]string, n)}
}

func (s *nodes) setDown(i int, down bool) {
	s.mu.Lock()
	s.down[i] = down
	s.mu.Unlock()
}

func (s *nodes) isDown(i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[i]
}

func (s *nodes) restarted(i int) {
	s.mu.Lock()
	s.start[i]++
	s.mu.Unlock()
}

// up returns the nodes not down, with their incarnations.
func (s *nodes) up() (idx, starts []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, d := range s.down {
		if !d {
			idx = append(idx, i)
			starts = append(starts, s.start[i])
		}
	}
	return idx, starts
}

func (s *nodes) seen(i, start int, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.start[i] != start {
		return false
	}
	s.id[i] = id
	return true
}

func (s *nodes) idOf(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id[i]
}

// objectName is the counter object number i.
func objectName(i int) string { return fmt.Sprintf("counter/c%03d", i) }

// workload is the clients: each, in a closed loop, picks an object and a
// live node at random and sends an add of an amount no other write in the
// run uses, or a get.
type workload struct {
	cfg     Config
	cluster *bench.Cluster
	nodes   *nodes
	rec     *Recorder
	amounts atomic.Int64
}

func (w *workload) run(ctx context.Context, c int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(c)+100))
	for ctx.Err() == nil {
		up, _ := w.nodes.up()
		if len(up) == 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		node := up[rng.IntN(len(up))]
		object := objectName(rng.IntN(w.cfg.Objects))
		kind := Read
		if rng.IntN(2) == 0 {
			kind = Write
		}
		o := w.call(ctx, c, node, object, kind)
		w.rec.Add(o)
		pause := w.cfg.Think
		if o.Outcome != OK {
			// Back off: fewer calls in flight against a down object
			// keeps the ambiguous writes, and porcupine's search, small.
			pause = 200 * time.Millisecond
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// call sends one operation and records its outcome. It is not cut short
// by ctx (a write the run's end cut off would be one more ambiguous
// write): each call has its own timeout.
func (w *workload) call(ctx context.Context, c, node int, object string, kind Kind) Op {
	o := Op{Client: c, Object: object, Kind: kind, Node: node, NodeID: w.nodes.idOf(node)}
	var payload []byte
	if kind == Write {
		o.Amount = w.amounts.Add(1)
		payload = fmt.Appendf(nil, `{"amount":%d}`, o.Amount)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.CallTimeout)
	defer cancel()
	o.Call = w.rec.Now()
	out, home, err := w.cluster.Nodes[node].Client.CallAt(cctx, object, string(kind), payload)
	o.Return = w.rec.Now()
	if err == nil {
		v, perr := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if perr == nil {
			o.Outcome, o.Value, o.Home = OK, v, home
			return o
		}
		err = fmt.Errorf("reply %q: %w", out, perr)
	}
	o.Outcome, o.Err = classify(err), err.Error()
	return o
}

// classify says whether a failed call may have been applied. Only a call
// that reached no node (connection refused) or that a node rejected
// before running it (4xx) certainly was not; anything else (a timeout, a
// reset, a 5xx from a node that may have forwarded it to a home that
// committed it) may have been.
func classify(err error) Outcome {
	var ae *client.APIError
	if errors.As(err, &ae) {
		if ae.Status < 500 {
			return Refused
		}
		return Ambiguous
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Refused
	}
	return Ambiguous
}

// monitor samples every live node's id once a second until ctx ends.
func (w *workload) monitor(ctx context.Context, samples *[]IDSample, mu *sync.Mutex) {
	for {
		w.sampleIDs(ctx, samples, mu)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (w *workload) sampleIDs(ctx context.Context, samples *[]IDSample, mu *sync.Mutex) {
	up, starts := w.nodes.up()
	for k, i := range up {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		id, err := w.cluster.NodeID(cctx, i)
		cancel()
		if err != nil || !w.nodes.seen(i, starts[k], id) {
			continue
		}
		mu.Lock()
		*samples = append(*samples, IDSample{Node: i, Start: starts[k], ID: id})
		mu.Unlock()
	}
}
