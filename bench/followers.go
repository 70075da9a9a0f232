package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"
)

// FollowersConfig is one `host bench followers` run.
type FollowersConfig struct {
	Exe       string
	Nodes     int
	Followers int
	// Messages are published closed loop: the next one goes out when every
	// follower's receive has committed the previous one.
	Messages  int
	Warmup    int           // default 3
	Timeout   time.Duration // per message, default 60 s
	Poll      time.Duration // commit polling interval, default 5 ms
	LeaseTTL  time.Duration
	LogLevel  string
	Dir       string
	CacheSeed string
	Progress  Progress
}

// FollowersResult is what durable delivery to object followers cost.
type FollowersResult struct {
	Nodes     int `json:"nodes"`
	Followers int `json:"followers"`
	Messages  int `json:"messages"`
	// DeliveriesPerMsg: host_internode_calls_total{kind="deliver"}, summed
	// over the nodes, per message (the followers all live off the
	// publisher's node).
	DeliveriesPerMsg      float64 `json:"deliveries_per_msg"`
	LocalDeliveriesPerMsg float64 `json:"local_deliveries_per_msg"`
	BytesPerMsg           float64 `json:"bytes_per_msg"`
	CPUPerMsg             float64 `json:"cpu_s_per_msg"`
	RetriesPerMsg         float64 `json:"retries_per_msg"`
	// The post call starts → every follower's receive has committed
	// (host_receive_commits_total polled every Poll on the followers'
	// nodes), per message.
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	P999Ms         float64 `json:"p999_ms"`
	EventsPerSec   float64 `json:"events_per_s"`
	ReceivesPerSec float64 `json:"receives_per_s"`
	// Every follower's own count after the run: each must be Warmup +
	// Messages, with no duplicates.
	CountsOK   int     `json:"followers_count_exact"`
	Duplicates int64   `json:"duplicates"`
	ElapsedS   float64 `json:"elapsed_s"`
}

// RunFollowers starts a cluster, makes F tally objects on the nodes other
// than the publisher's follow chat/room1, publishes and measures.
func RunFollowers(ctx context.Context, cfg FollowersConfig) (*FollowersResult, error) {
	if cfg.Warmup == 0 {
		cfg.Warmup = 3
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 5 * time.Millisecond
	}
	if cfg.Messages < 1 || cfg.Followers < 1 {
		return nil, errors.New("bench: need at least one message and one follower")
	}
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, int, int) {}
	}
	cl, err := StartCluster(ctx, ClusterConfig{
		Exe: cfg.Exe, Nodes: cfg.Nodes, Mode: ModeNode, LeaseTTL: cfg.LeaseTTL, LogLevel: cfg.LogLevel,
		Dir: cfg.Dir, CacheSeed: cfg.CacheSeed,
		Progress: func(s string, d, t int) { progress("followers: "+s, d, t) },
	})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fail := func(err error) (*FollowersResult, error) { return nil, cl.annotate(err) }
	if err := cl.Upload(ctx, filepath.Join(cl.dir, "wasm")); err != nil {
		return fail(err)
	}
	post := func(i int) error { return cl.Post(ctx, i) }
	if err := post(0); err != nil {
		return fail(fmt.Errorf("first post: %w", err))
	}
	// Followers on the other nodes, round-robin; each is homed where its
	// first call lands.
	home := func(i int) *Node {
		if len(cl.Nodes) == 1 {
			return cl.Nodes[0]
		}
		return cl.Nodes[1+i%(len(cl.Nodes)-1)]
	}
	followerNodes := map[*Node]bool{}
	for i := 0; i < cfg.Followers; i++ {
		n := home(i)
		followerNodes[n] = true
		if _, err := n.Client.Call(ctx, fmt.Sprintf("tally/f%d", i), "follow", []byte(`{"publisher":"`+Publisher+`","topic":"messages"}`)); err != nil {
			return fail(fmt.Errorf("follower %d follow: %w", i, err))
		}
		progress("followers: follow", i+1, cfg.Followers)
	}
	var polled []*Node
	for n := range followerNodes {
		polled = append(polled, n)
	}
	commits := func() (float64, error) {
		vals := make([]float64, len(polled))
		errs := make([]error, len(polled))
		var wg sync.WaitGroup
		for i, n := range polled {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, err := scrape(ctx, n.Client.HTTP, n.URL+"/metrics")
				vals[i], errs[i] = m.Sum("host_receive_commits_total"), err
			}()
		}
		wg.Wait()
		var s float64
		for _, v := range vals {
			s += v
		}
		return s, errors.Join(errs...)
	}
	waitCommits := func(want float64) error {
		deadline := time.Now().Add(cfg.Timeout)
		for {
			got, err := commits()
			if err != nil {
				return err
			}
			if got >= want {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%v of %v receives committed after %v", got, want, cfg.Timeout)
			}
			time.Sleep(cfg.Poll)
		}
	}
	f := float64(cfg.Followers)
	for i := 0; i < cfg.Warmup; i++ {
		c0, err := commits()
		if err != nil {
			return fail(err)
		}
		if err := post(i + 1); err != nil {
			return fail(err)
		}
		if err := waitCommits(c0 + f); err != nil {
			return fail(fmt.Errorf("warm-up %d: %w", i+1, err))
		}
		progress("followers: warm-up", i+1, cfg.Warmup)
	}
	// Inter-node calls are counted when their reply is back, which can be
	// after the sockets (or followers) have the event: let the last round
	// finish before each scrape.
	time.Sleep(settle)
	m0, err := cl.Scrape(ctx)
	if err != nil {
		return fail(err)
	}
	lat := make([]int64, 0, cfg.Messages)
	start := time.Now()
	for i := 0; i < cfg.Messages; i++ {
		c0, err := commits()
		if err != nil {
			return fail(err)
		}
		t0 := time.Now()
		if err := post(cfg.Warmup + 1 + i); err != nil {
			return fail(err)
		}
		if err := waitCommits(c0 + f); err != nil {
			return fail(fmt.Errorf("message %d: %w", i, err))
		}
		lat = append(lat, time.Since(t0).Nanoseconds())
		progress("followers: publish", i+1, cfg.Messages)
	}
	elapsed := time.Since(start)
	time.Sleep(settle)
	m1, err := cl.Scrape(ctx)
	if err != nil {
		return fail(err)
	}
	msgs := float64(cfg.Messages)
	r := &FollowersResult{
		Nodes: cfg.Nodes, Followers: cfg.Followers, Messages: cfg.Messages,
		DeliveriesPerMsg:      Delta(m0, m1, "host_internode_calls_total", `kind="deliver"`) / msgs,
		LocalDeliveriesPerMsg: Delta(m0, m1, "host_delivery_calls_total", `kind="object"`, `path="local"`) / msgs,
		BytesPerMsg:           Delta(m0, m1, "host_internode_bytes_total", `kind="deliver"`) / msgs,
		CPUPerMsg:             Delta(m0, m1, "process_cpu_seconds_total") / msgs,
		RetriesPerMsg:         Delta(m0, m1, "host_delivery_retries_total") / msgs,
		P50Ms:                 pctMs(lat, 0.50),
		P99Ms:                 pctMs(lat, 0.99),
		P999Ms:                pctMs(lat, 0.999),
		EventsPerSec:          msgs / elapsed.Seconds(),
		ReceivesPerSec:        msgs * f / elapsed.Seconds(),
		ElapsedS:              elapsed.Seconds(),
	}
	// Exactly-once in effect: every follower counted every event once.
	want := int64(cfg.Warmup + cfg.Messages)
	for i := 0; i < cfg.Followers; i++ {
		out, err := home(i).Client.Call(ctx, fmt.Sprintf("tally/f%d", i), "counts", nil)
		if err != nil {
			return fail(fmt.Errorf("follower %d counts: %w", i, err))
		}
		var c struct {
			Total      int64 `json:"total"`
			Duplicates int64 `json:"duplicates"`
		}
		if err := json.Unmarshal(out, &c); err != nil {
			return fail(fmt.Errorf("follower %d counts %s: %w", i, out, err))
		}
		if c.Total == want {
			r.CountsOK++
		}
		r.Duplicates += c.Duplicates
	}
	return r, nil
}
