package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// ConnsConfig describes an idle-connection memory run: one node process,
// then sockets added in steps up to each of Counts, each following
// Publisher and warmed by one event, the node's memory read after each
// step.
type ConnsConfig struct {
	Exe    string
	Counts []int
	// Dir holds the node's data and log ("" = a temporary directory).
	Dir      string
	Timeout  time.Duration
	Progress Progress
}

// ConnsStep is the node's memory with Conns warm, idle connections.
type ConnsStep struct {
	Conns int `json:"conns"`
	// RSSMB is the node's resident set (VmRSS); the per-connection figures
	// are the growth over the node with no connection, divided by Conns.
	RSSMB        float64 `json:"rss_mb"`
	RSSKBPerConn float64 `json:"rss_kb_per_conn"`
	// HeapKBPerConn and StackKBPerConn split it: the Go heap in use and
	// the goroutine stacks (go_memstats_*_inuse_bytes).
	HeapKBPerConn  float64 `json:"heap_kb_per_conn"`
	StackKBPerConn float64 `json:"stack_kb_per_conn"`
	// GoroutinesPerConn is the node's goroutines per connection.
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
}

// RunConns measures what an idle, warm WebSocket connection costs the node
// that holds it.
func RunConns(ctx context.Context, cfg ConnsConfig) ([]ConnsStep, error) {
	if len(cfg.Counts) == 0 {
		cfg.Counts = []int{4000, 8000}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, int, int) {}
	}
	most := cfg.Counts[len(cfg.Counts)-1]
	if err := RaiseNoFile(uint64(2*most) + 1024); err != nil {
		return nil, err
	}
	c, err := startOneNode(ctx, cfg.Exe, cfg.Dir, cfg.Progress)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	n := c.Nodes[0]
	// The room is active and its module compiled before the baseline.
	if err := c.Post(ctx, 0); err != nil {
		return nil, c.annotate(err)
	}
	base, err := n.memory(ctx)
	if err != nil {
		return nil, c.annotate(err)
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	url := "ws" + strings.TrimPrefix(n.URL, "http") + "/v1/objects/" + Publisher + "/connect"
	var socks []*websocket.Conn
	defer func() {
		for _, s := range socks {
			s.CloseNow()
		}
	}()
	var out []ConnsStep
	for step, want := range cfg.Counts {
		// Dial in parallel, a few hundred at a time.
		add := make([]*websocket.Conn, want-len(socks))
		errs := make([]error, len(add))
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		for i := range add {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				add[i], errs[i] = coldFollow(rctx, url)
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				for _, s := range add {
					if s != nil {
						s.CloseNow()
					}
				}
				return out, c.annotate(fmt.Errorf("connect: %w", err))
			}
		}
		socks = append(socks, add...)
		cfg.Progress(fmt.Sprintf("conns: %d connected", len(socks)), len(socks), most)
		// Warm: every socket receives one event.
		if err := c.Post(rctx, step+1); err != nil {
			return out, c.annotate(err)
		}
		readErrs := make([]error, len(socks))
		for i, s := range socks {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				_, _, readErrs[i] = s.Read(rctx)
			})
		}
		wg.Wait()
		for _, err := range readErrs {
			if err != nil {
				return out, c.annotate(fmt.Errorf("warm-up event: %w", err))
			}
		}
		// Let the node settle (its delivery garbage collected) before it
		// is read: the smallest of a few samples.
		m, err := n.settled(rctx)
		if err != nil {
			return out, c.annotate(err)
		}
		k := float64(len(socks))
		out = append(out, ConnsStep{
			Conns:             len(socks),
			RSSMB:             m.rss / (1 << 20),
			RSSKBPerConn:      (m.rss - base.rss) / 1024 / k,
			HeapKBPerConn:     (m.heap - base.heap) / 1024 / k,
			StackKBPerConn:    (m.stack - base.stack) / 1024 / k,
			GoroutinesPerConn: (m.goroutines - base.goroutines) / k,
		})
	}
	return out, nil
}

// nodeMemory is a node's memory as its /proc status and /metrics say.
type nodeMemory struct{ rss, heap, stack, goroutines float64 }

func (n *Node) memory(ctx context.Context) (nodeMemory, error) {
	m, err := scrape(ctx, n.Client.HTTP, n.URL+"/metrics")
	if err != nil {
		return nodeMemory{}, err
	}
	_, rss := n.rss()
	return nodeMemory{rss: rss * (1 << 20), heap: m.Sum("go_memstats_heap_inuse_bytes"), stack: m.Sum("go_memstats_stack_inuse_bytes"), goroutines: m.Sum("go_goroutines")}, nil
}

// settled reads the node's memory a few times, a second apart, and keeps
// the smallest resident set: what the connections hold, not the garbage of
// their warm-up that the collector has not returned yet.
func (n *Node) settled(ctx context.Context) (nodeMemory, error) {
	var best nodeMemory
	for i := range 5 {
		if i > 0 {
			select {
			case <-ctx.Done():
				return best, ctx.Err()
			case <-time.After(time.Second):
			}
		}
		m, err := n.memory(ctx)
		if err != nil {
			return best, err
		}
		if i == 0 || m.rss < best.rss {
			best = m
		}
	}
	return best, nil
}
