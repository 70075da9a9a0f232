package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// ColdStartConfig describes a cold-start run: one node process restarted
// with the chat program stored, then Connects WebSocket clients at once,
// each following Publisher.
type ColdStartConfig struct {
	Exe      string
	Connects int
	// Dir holds the node's data and log ("" = a temporary directory).
	Dir string
	// Timeout bounds the whole burst.
	Timeout  time.Duration
	Progress Progress
}

// ColdStartResult is what a cold start cost.
type ColdStartResult struct {
	Connects int `json:"connects"`
	Failed   int `json:"failed"`
	// FirstMs and AllMs: from the burst's start to the first and the last
	// "followed" answer.
	FirstMs float64 `json:"first_ms"`
	P50Ms   float64 `json:"p50_ms"`
	AllMs   float64 `json:"all_ms"`
	// PeakRSSMB is the node's peak resident set (VmHWM) after the burst;
	// IdleRSSMB its resident set before it.
	PeakRSSMB float64 `json:"peak_rss_mb"`
	IdleRSSMB float64 `json:"idle_rss_mb"`
	// Compiles is the node's module compiles during the burst.
	Compiles float64  `json:"compiles"`
	Errors   []string `json:"errors,omitempty"`
}

// RunColdStart starts a node, uploads the examples, restarts it (so nothing
// is compiled or active) and connects cfg.Connects sockets at once, each
// following Publisher's messages.
func RunColdStart(ctx context.Context, cfg ColdStartConfig) (*ColdStartResult, error) {
	if cfg.Connects < 1 {
		cfg.Connects = 1000
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if err := RaiseNoFile(uint64(cfg.Connects) + 1024); err != nil {
		return nil, err
	}
	c, err := startOneNode(ctx, cfg.Exe, cfg.Dir, cfg.Progress)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Restart(ctx, 0); err != nil {
		return nil, c.annotate(err)
	}
	n := c.Nodes[0]
	before, err := scrape(ctx, n.Client.HTTP, n.URL+"/metrics")
	if err != nil {
		return nil, c.annotate(err)
	}
	res := &ColdStartResult{Connects: cfg.Connects}
	_, res.IdleRSSMB = n.rss()
	bctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	url := "ws" + strings.TrimPrefix(n.URL, "http") + "/v1/objects/" + Publisher + "/connect"
	start := time.Now()
	done := make([]time.Duration, cfg.Connects)
	errs := make([]error, cfg.Connects)
	socks := make([]*websocket.Conn, cfg.Connects)
	var wg sync.WaitGroup
	for i := range cfg.Connects {
		wg.Go(func() {
			socks[i], errs[i] = coldFollow(bctx, url)
			done[i] = time.Since(start)
		})
	}
	wg.Wait()
	var ok []time.Duration
	for i, err := range errs {
		if err != nil {
			res.Failed++
			if len(res.Errors) < 5 {
				res.Errors = append(res.Errors, err.Error())
			}
			continue
		}
		ok = append(ok, done[i])
	}
	sort.Slice(ok, func(a, b int) bool { return ok[a] < ok[b] })
	if len(ok) > 0 {
		res.FirstMs = millis(ok[0])
		res.P50Ms = millis(ok[len(ok)/2])
		res.AllMs = millis(ok[len(ok)-1])
	}
	res.PeakRSSMB, _ = n.rss()
	after, err := scrape(ctx, n.Client.HTTP, n.URL+"/metrics")
	if err == nil {
		res.Compiles = after.Sum("host_module_compiles_total") - before.Sum("host_module_compiles_total")
	}
	for _, s := range socks {
		if s != nil {
			s.CloseNow()
		}
	}
	return res, nil
}

// startOneNode starts one node process (the product's fan-out) with the
// examples uploaded.
func startOneNode(ctx context.Context, exe, dir string, progress Progress) (*Cluster, error) {
	c, err := StartCluster(ctx, ClusterConfig{Exe: exe, Nodes: 1, Mode: "node", Dir: dir, Progress: progress})
	if err != nil {
		return nil, err
	}
	if err := c.Upload(ctx, filepath.Join(c.dir, "examples")); err != nil {
		err = c.annotate(err)
		c.Close()
		return nil, err
	}
	return c, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// coldFollow connects and follows Publisher's messages, returning once the
// node answers "followed".
func coldFollow(ctx context.Context, url string) (*websocket.Conn, error) {
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"follow","topic":"messages"}`)); err != nil {
		ws.CloseNow()
		return nil, err
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			ws.CloseNow()
			return nil, err
		}
		var f struct{ Type, Error string }
		json.Unmarshal(b, &f)
		switch f.Type {
		case "followed":
			return ws, nil
		case "error":
			ws.CloseNow()
			return nil, fmt.Errorf("follow: %s", f.Error)
		}
	}
}

// rss reads the node process's peak (VmHWM) and current (VmRSS) resident
// set in MB.
func (n *Node) rss() (peak, now float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmHWM:":
			peak = kb / 1024
		case "VmRSS:":
			now = kb / 1024
		}
	}
	return peak, now
}
