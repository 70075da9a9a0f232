package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// FanoutConfig is one `host bench fanout` run in one mode.
type FanoutConfig struct {
	Exe      string
	Nodes    int
	Watchers int
	// Messages are published closed loop: the next one goes out when every
	// watcher has the previous one (or after Timeout).
	Messages int
	// Warmup messages go out first and are not measured (default 3).
	Warmup int
	// Timeout bounds the wait for one message to reach every watcher
	// (default 60 s); a message that misses it counts its missing frames.
	Timeout time.Duration
	Mode    string
	// Churn, when positive, has watchers join and leave during the
	// measured messages: this fraction of Watchers per second each way
	// (0.01: 1%), as extra sockets following the same topic beside the
	// measured ones, so the edge sets the batches carry keep changing.
	Churn     float64
	LeaseTTL  time.Duration
	LogLevel  string
	Dir       string // "" = temporary
	CacheSeed string
	Progress  Progress
}

// FanoutResult is what one mode cost.
type FanoutResult struct {
	Mode             string `json:"mode"`
	Nodes            int    `json:"nodes"`
	Watchers         int    `json:"watchers"`
	Messages         int    `json:"messages"`
	NodesWithSockets int    `json:"nodes_with_sockets"`
	// SendsPerMsg is what the publisher's node sends per message: connection
	// batches (host_delivery_calls_total{kind="connection_batch"}, local and
	// remote) in the node and socket modes, NATS publishes
	// (host_internode_calls_total{kind="topic"}) in the subject mode.
	SendsPerMsg float64 `json:"sends_per_msg"`
	// InterNodePerMsg counts the sends that leave the process
	// (host_internode_calls_total of kind conns or topic).
	InterNodePerMsg float64 `json:"internode_per_msg"`
	// RemoteBatchesPerMsg: host_delivery_calls_total{kind="connection_batch",path="remote"}.
	RemoteBatchesPerMsg float64 `json:"remote_batches_per_msg"`
	// BytesPerMsg is host_internode_bytes_total of the same kind.
	BytesPerMsg float64 `json:"bytes_per_msg"`
	// EventBytesPerMsg and EdgeBytesPerMsg split the remote connection
	// batches' bytes (host_connection_batch_bytes_total): the publisher
	// and events, and the edge sets (versions, changes or whole sets).
	EventBytesPerMsg float64 `json:"event_bytes_per_msg"`
	EdgeBytesPerMsg  float64 `json:"edge_bytes_per_msg"`
	// WholeSetsPerMsg: remote batches that carried a node's whole edge
	// set (host_connection_batch_whole_sets_total).
	WholeSetsPerMsg float64 `json:"whole_sets_per_msg"`
	// Churn is the configured rate; Joined and Left count the churning
	// watchers that did, in ChurnS seconds (the warm-up and the measured
	// messages).
	Churn  float64 `json:"churn_per_s,omitempty"`
	Joined int64   `json:"joined,omitempty"`
	Left   int64   `json:"left,omitempty"`
	ChurnS float64 `json:"churn_s,omitempty"`
	// CPUPerMsg is process_cpu_seconds_total over every node process.
	CPUPerMsg float64 `json:"cpu_s_per_msg"`
	// ClientCPUPerMsg is the bench process (the watchers' reads).
	ClientCPUPerMsg float64 `json:"client_cpu_s_per_msg"`
	FramesPerMsg    float64 `json:"frames_per_msg"`
	// Publish (the event's time, set inside the method) → a socket read
	// the frame, over every (message, watcher).
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// AllP50Ms, AllP99Ms: publish → the last watcher has it, per message.
	AllP50Ms         float64 `json:"all_p50_ms"`
	AllP99Ms         float64 `json:"all_p99_ms"`
	DeliveriesPerSec float64 `json:"deliveries_per_s"`
	Delivered        int64   `json:"delivered"`
	Expected         int64   `json:"expected"`
	OutOfOrder       int64   `json:"out_of_order"`
	Notices          int64   `json:"notices"`
	// DialRetries: watcher dials refused with 503 and retried, and the
	// last refusal's text.
	DialRetries int64   `json:"dial_retries,omitempty"`
	DialRefusal string  `json:"dial_refusal,omitempty"`
	ElapsedS    float64 `json:"elapsed_s"`
	sample      []byte
}

func (c *FanoutConfig) defaults() {
	if c.Warmup == 0 {
		c.Warmup = 3
	}
	if c.Timeout == 0 {
		c.Timeout = 60 * time.Second
	}
	if c.Mode == "" {
		c.Mode = ModeNode
	}
}

// RunFanout starts a cluster in cfg.Mode, attaches the watchers, publishes
// and measures.
func RunFanout(ctx context.Context, cfg FanoutConfig) (*FanoutResult, error) {
	cfg.defaults()
	if cfg.Messages < 1 || cfg.Watchers < 1 {
		return nil, errors.New("bench: need at least one message and one watcher")
	}
	if err := RaiseNoFile(uint64(cfg.Watchers + 1024)); err != nil {
		return nil, err
	}
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, int, int) {}
	}
	stage := func(s string) string { return cfg.Mode + ": " + s }
	cl, err := StartCluster(ctx, ClusterConfig{
		Exe: cfg.Exe, Nodes: cfg.Nodes, Mode: cfg.Mode, LeaseTTL: cfg.LeaseTTL, LogLevel: cfg.LogLevel,
		Dir: cfg.Dir, CacheSeed: cfg.CacheSeed,
		Progress: func(s string, d, t int) { progress(stage(s), d, t) },
	})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fail := func(err error) (*FanoutResult, error) { return nil, cl.annotate(err) }
	if err := cl.Upload(ctx, filepath.Join(cl.dir, "wasm")); err != nil {
		return fail(err)
	}
	post := func(i int) error { return cl.Post(ctx, i) }
	// The first post homes the room on node 0.
	if err := post(0); err != nil {
		return fail(fmt.Errorf("first post: %w", err))
	}
	urls := make([]string, len(cl.Nodes))
	for i, n := range cl.Nodes {
		urls[i] = n.URL
	}
	ws, err := dialWatchers(ctx, urls, cfg.Watchers, func(s string, d, t int) { progress(stage(s), d, t) })
	if err != nil {
		return fail(err)
	}
	defer ws.close()
	retries, refusal := dialRetries.Swap(0), deref(lastDialRefusal.Swap(nil))
	holding := map[int]bool{}
	for _, n := range ws.node {
		holding[n] = true
	}
	w := int64(cfg.Watchers)

	// Churn starts before the warm-up: its pool of watchers is full (as
	// many leave as join) by the measured messages.
	ch := startChurn(ctx, urls, cfg.Churn, cfg.Watchers)
	defer ch.stop()
	// Warm up: every watcher must see each warm-up message.
	if err := ws.warmUp(cfg.Warmup, cfg.Timeout, post, func(i int) { progress(stage("warm-up"), i, cfg.Warmup) }); err != nil {
		return fail(err)
	}

	// Inter-node calls are counted when their reply is back, which can be
	// after the sockets (or followers) have the event: let the last round
	// finish before each scrape.
	time.Sleep(settle)
	m0, err := cl.Scrape(ctx)
	if err != nil {
		return fail(err)
	}
	var ru0, ru1 rusage
	ru0.read()
	ws.measuring.Store(true)
	allLat := make([]int64, 0, cfg.Messages)
	start := time.Now()
	for i := 0; i < cfg.Messages; i++ {
		base := ws.received.Load()
		took, ok, err := ws.roundTrip(ctx, cfg.Timeout, func() error { return post(cfg.Warmup + 1 + i) })
		if err != nil {
			return fail(fmt.Errorf("post %d: %w", i, err))
		}
		if !ok {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if ex := cl.Exited(); ex != "" {
				return fail(fmt.Errorf("message %d: %d of %d watchers missing", i, base+w-ws.received.Load(), w))
			}
			continue
		}
		allLat = append(allLat, took.Nanoseconds())
		progress(stage("publish"), i+1, cfg.Messages)
	}
	elapsed := time.Since(start)
	joined, left, churned := ch.stop()
	ru1.read()
	time.Sleep(settle)
	m1, err := cl.Scrape(ctx)
	if err != nil {
		return fail(err)
	}
	ws.measuring.Store(false)

	msgs := float64(cfg.Messages)
	kind := `kind="conns"`
	r := &FanoutResult{
		Mode: cfg.Mode, Nodes: cfg.Nodes, Watchers: cfg.Watchers, Messages: cfg.Messages,
		NodesWithSockets:    len(holding),
		SendsPerMsg:         Delta(m0, m1, "host_delivery_calls_total", `kind="connection_batch"`) / msgs,
		CPUPerMsg:           Delta(m0, m1, "process_cpu_seconds_total") / msgs,
		RemoteBatchesPerMsg: Delta(m0, m1, "host_delivery_calls_total", `kind="connection_batch"`, `path="remote"`) / msgs,
		ClientCPUPerMsg:     (ru1.cpu() - ru0.cpu()) / msgs,
		FramesPerMsg:        Delta(m0, m1, "host_socket_frames_total") / msgs,
		Expected:            w * int64(cfg.Messages),
		ElapsedS:            elapsed.Seconds(),
		OutOfOrder:          ws.outOfOrder.Load(),
		Notices:             ws.notices.Load(),
		DialRetries:         retries,
		Churn:               cfg.Churn,
		Joined:              joined,
		Left:                left,
		ChurnS:              churned.Seconds(),
		DialRefusal:         refusal,
		sample:              deref(ws.sample.Load()),
	}
	if cfg.Mode == ModeSubject {
		kind = `kind="topic"`
		r.SendsPerMsg = Delta(m0, m1, "host_internode_calls_total", kind) / msgs
	}
	r.InterNodePerMsg = Delta(m0, m1, "host_internode_calls_total", kind) / msgs
	r.BytesPerMsg = Delta(m0, m1, "host_internode_bytes_total", kind) / msgs
	r.EventBytesPerMsg = Delta(m0, m1, "host_connection_batch_bytes_total", `part="events"`) / msgs
	r.EdgeBytesPerMsg = Delta(m0, m1, "host_connection_batch_bytes_total", `part="edges"`) / msgs
	r.WholeSetsPerMsg = Delta(m0, m1, "host_connection_batch_whole_sets_total") / msgs

	// Close the sockets (the readers stop) before reading their slices.
	cl.Close()
	ws.close()
	var lat []int64
	for _, l := range ws.lat {
		lat = append(lat, l...)
	}
	r.Delivered = int64(len(lat))
	r.P50Ms, r.P99Ms, r.P999Ms = pctMs(lat, 0.50), pctMs(lat, 0.99), pctMs(lat, 0.999)
	r.AllP50Ms, r.AllP99Ms = pctMs(allLat, 0.50), pctMs(allLat, 0.99)
	r.DeliveriesPerSec = float64(r.Delivered) / elapsed.Seconds()
	return r, nil
}

// settle is the pause before a metrics scrape (outside the timed loop).
const settle = 500 * time.Millisecond

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// seqMax is the highest seq any watcher has seen.
func seqMax(ws *watchers) uint64 {
	var m uint64
	for i := range ws.ws {
		if s := ws.lastSeq[i].Load(); s > m {
			m = s
		}
	}
	return m
}

// allPast reports whether every watcher has seen a seq above seq.
func allPast(ws *watchers, seq uint64) bool {
	for i := range ws.ws {
		if ws.lastSeq[i].Load() <= seq {
			return false
		}
	}
	return true
}

// pctMs is the p-quantile of ns samples, in ms (sorts s).
func pctMs(s []int64, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	i := min(len(s)-1, int(p*float64(len(s))))
	return float64(s[i]) / 1e6
}

// rusage is this process's CPU time so far.
type rusage struct{ ru syscall.Rusage }

func (r *rusage) read()        { syscall.Getrusage(syscall.RUSAGE_SELF, &r.ru) }
func (r *rusage) cpu() float64 { return tv(r.ru.Utime) + tv(r.ru.Stime) }
