// Package bench runs the cluster benchmarks of fan-out by node: it starts
// N `host serve` processes on loopback, clustered through their embedded
// NATS servers, attaches WebSocket watchers (or object followers) to them,
// publishes messages to one chat room and reads what it cost from the
// nodes' /metrics. The `host bench fanout` and `host bench followers`
// commands drive it; see README.md, "Cluster fan-out".
package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	examples "github.com/durable-host/host/examples/wasm"
	"github.com/durable-host/host/host/client"
)

// Fan-out modes of the nodes (the `host serve --fanout` values).
const (
	ModeNode    = "node"    // the product: one call per node holding sockets
	ModeSocket  = "socket"  // naive baseline: one inter-node send per watcher
	ModeSubject = "subject" // baseline: a NATS subject per topic, NATS fans out
)

// Modes are the fan-out modes in the order a --fanout all run takes them.
var Modes = []string{ModeNode, ModeSocket, ModeSubject}

// Publisher is the chat room every benchmark publishes to.
const Publisher = "chat/room1"

// Progress reports how far a benchmark is: stage names the step, done of
// total units.
type Progress func(stage string, done, total int)

// ClusterConfig describes the node processes of one run.
type ClusterConfig struct {
	// Exe is the `host` executable to start as `Exe serve ...`.
	Exe string
	// Nodes is how many node processes to start.
	Nodes int
	// Mode is the --fanout of every node.
	Mode string
	// LeaseTTL is each node's --lease-ttl; a loaded 2-CPU machine can miss
	// heartbeats, and a node that loses its lease rejoins under a new id
	// (dropping its sockets), so the bench uses a long one. 0 = 60 s.
	LeaseTTL time.Duration
	// LogLevel is each node's --log-level ("" = warn). Node output goes to
	// node-I.log in the run's directory.
	LogLevel string
	// Dir holds the nodes' data directories and logs ("" = a new
	// temporary directory, removed by Close).
	Dir string
	// CacheSeed, when set, is a directory of compiled code copied into each
	// node's compilation cache before it starts (and filled from node 0
	// after the run when empty), so later clusters skip compiling.
	CacheSeed string
	// Progress, if set, hears about startup.
	Progress Progress
	// Args are more `host serve` flags for every node (e.g. --replicas).
	Args []string
}

// Node is one running `host serve` process.
type Node struct {
	Index   int
	URL     string // http://127.0.0.1:PORT
	Route   string // nats://127.0.0.1:PORT
	Data    string
	LogPath string
	Client  *client.Client
	cmd     *exec.Cmd
	args    []string
	logf    *os.File
	done    chan struct{}
	exitErr error
}

// Cluster is N node processes.
type Cluster struct {
	Nodes   []*Node
	cfg     ClusterConfig
	dir     string
	tempDir bool
}

// FreePorts reserves n distinct loopback ports (held open together, then
// released) for the nodes this package starts, and for tests' nodes
// (hosttest.FreeAddr).
//
// They are below the kernel's ephemeral range (32768 and up on Linux): a
// port the kernel chose for a port-0 listener is the next it hands to an
// outgoing connection or port-0 listener once released, and a node
// started on it a moment later (or killed and restarted on it, as the
// chaos soak does) could find it taken. The range is sliced by pid, so
// parallel processes (go test runs packages at once) rarely draw the same
// port, and no port is given out twice in one process.
func FreePorts(n int) ([]int, error) {
	const low, high, slices = 20000, 32768, 8
	width := (high - low) / slices
	base := low + os.Getpid()%slices*width
	freeMu.Lock()
	defer freeMu.Unlock()
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000*n {
			return nil, fmt.Errorf("no %d free loopback ports in %d-%d", n, base, base+width-1)
		}
		port := base + rand.IntN(width)
		if freeGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use: another process's
		}
		ls = append(ls, l)
		ports = append(ports, port)
		freeGiven[port] = true
	}
	return ports, nil
}

var (
	freeMu    sync.Mutex
	freeGiven = map[int]bool{}
)

// StartCluster starts cfg.Nodes processes and waits until every node's
// /v1/cluster lists all of them.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Exe == "" {
		return nil, errors.New("bench: no host executable")
	}
	if cfg.Nodes < 1 {
		return nil, errors.New("bench: need at least one node")
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 60 * time.Second
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	c := &Cluster{cfg: cfg, dir: cfg.Dir}
	if c.dir == "" {
		d, err := os.MkdirTemp("", "host-bench-")
		if err != nil {
			return nil, err
		}
		c.dir, c.tempDir = d, true
	}
	ports, err := FreePorts(2 * cfg.Nodes)
	if err != nil {
		return nil, err
	}
	routes := make([]string, cfg.Nodes)
	for i := range routes {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[2*i+1])
	}
	for i := 0; i < cfg.Nodes; i++ {
		n := &Node{
			Index:   i,
			URL:     fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			Route:   routes[i],
			Data:    filepath.Join(c.dir, fmt.Sprintf("node-%d", i)),
			LogPath: filepath.Join(c.dir, fmt.Sprintf("node-%d.log", i)),
			done:    make(chan struct{}),
		}
		n.Client = &client.Client{Base: n.URL, HTTP: &http.Client{Timeout: 60 * time.Second}}
		if err := os.MkdirAll(n.Data, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		if cfg.CacheSeed != "" {
			if err := copyDir(cfg.CacheSeed, filepath.Join(n.Data, "cache")); err != nil {
				c.Close()
				return nil, err
			}
		}
		var peers []string
		for j, r := range routes {
			if j != i {
				peers = append(peers, r)
			}
		}
		args := []string{"serve",
			"--data", n.Data,
			"--listen", strings.TrimPrefix(n.URL, "http://"),
			"--fanout", cfg.Mode,
			"--lease-ttl", cfg.LeaseTTL.String(),
			"--log-level", cfg.LogLevel,
		}
		args = append(args, cfg.Args...)
		if len(peers) > 0 {
			args = append(args,
				"--nats-cluster", strings.TrimPrefix(n.Route, "nats://"),
				// A name of its own: a stray route from another cluster on
				// this machine is refused instead of merging.
				"--nats-cluster-name", "bench-"+filepath.Base(c.dir),
				"--nats-routes", strings.Join(peers, ","))
		}
		n.logf, err = os.Create(n.LogPath)
		if err != nil {
			c.Close()
			return nil, err
		}
		n.args = args
		if err := n.start(cfg.Exe); err != nil {
			c.Close()
			return nil, fmt.Errorf("start node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.waitMembers(ctx, 3*time.Minute); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (n *Node) start(exe string) error {
	n.cmd = exec.Command(exe, n.args...)
	n.cmd.Stdout, n.cmd.Stderr = n.logf, n.logf
	n.done = make(chan struct{})
	if err := n.cmd.Start(); err != nil {
		return err
	}
	go func() {
		n.exitErr = n.cmd.Wait()
		close(n.done)
	}()
	return nil
}

// Restart stops node i gracefully (SIGTERM) and starts it again on its
// data directory, under a new id, and waits for the cluster to list it.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	n := c.Nodes[i]
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(60 * time.Second):
		n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	}
	if err := n.start(c.cfg.Exe); err != nil {
		return fmt.Errorf("restart node %d: %w", i, err)
	}
	return c.waitMembers(ctx, 3*time.Minute)
}

// waitMembers waits until every node lists all nodes as live.
func (c *Cluster) waitMembers(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ready := 0
		var last error
		for _, n := range c.Nodes {
			select {
			case <-n.done:
				return fmt.Errorf("node %d exited during startup (%v); its log:\n%s", n.Index, n.exitErr, tail(n.LogPath, 30))
			default:
			}
			var v struct {
				Nodes []struct {
					ID string `json:"id"`
				} `json:"nodes"`
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := n.Client.Get(cctx, "/v1/cluster", &v)
			cancel()
			if err != nil {
				last = err
				continue
			}
			if len(v.Nodes) == len(c.Nodes) {
				ready++
			} else {
				last = fmt.Errorf("node %d sees %d of %d nodes", n.Index, len(v.Nodes), len(c.Nodes))
			}
		}
		if c.cfg.Progress != nil {
			c.cfg.Progress("cluster up", ready, len(c.Nodes))
		}
		if ready == len(c.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster of %d not formed after %v: %v", len(c.Nodes), timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Exited reports the nodes that are no longer running, with their logs'
// tails, or "" when all run.
func (c *Cluster) Exited() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		select {
		case <-n.done:
			fmt.Fprintf(&b, "node %d exited (%v); its log:\n%s\n", n.Index, n.exitErr, tail(n.LogPath, 30))
		default:
		}
	}
	return b.String()
}

// Close stops every node (SIGKILL: the run's state is thrown away, and a
// graceful stop of thousands of connections only prunes edges nobody
// reads), fills the compilation cache seed, and removes a temporary
// directory.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			n.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	for _, n := range c.Nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			<-n.done
		}
		if n.logf != nil {
			n.logf.Close()
		}
	}
	if seed := c.cfg.CacheSeed; seed != "" && len(c.Nodes) > 0 {
		if entries, err := os.ReadDir(seed); err != nil || len(entries) == 0 {
			copyDir(filepath.Join(c.Nodes[0].Data, "cache"), seed)
		}
	}
	if c.tempDir {
		os.RemoveAll(c.dir)
	}
}

// Upload builds the chat and tally examples (cached by the Go build cache)
// and uploads them to node 0.
func (c *Cluster) Upload(ctx context.Context, outDir string) error {
	built, err := examples.Build(ctx, outDir, examples.Options{Only: []string{"chat", "tally"}, SkipRust: true})
	if err != nil {
		return fmt.Errorf("build examples: %w", err)
	}
	for _, b := range built {
		wasm, err := os.ReadFile(b.Path)
		if err != nil {
			return err
		}
		if _, err := c.Nodes[0].Client.Upload(ctx, b.Name, wasm); err != nil {
			return fmt.Errorf("upload %s: %w", b.Name, err)
		}
	}
	return nil
}

// Metrics is one scrape of a node's /metrics: series ("name{labels}" as the
// exposition prints them) → value.
type Metrics map[string]float64

// Scrape reads every node's /metrics.
func (c *Cluster) Scrape(ctx context.Context) ([]Metrics, error) {
	out := make([]Metrics, len(c.Nodes))
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = scrape(ctx, n.Client.HTTP, n.URL+"/metrics")
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func scrape(ctx context.Context, hc *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads the Prometheus text exposition format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series, val := line[:i], line[i+1:]
		// A timestamp may follow the value.
		if j := strings.LastIndexByte(series, ' '); j >= 0 && !strings.Contains(series[j:], "}") {
			series, val = series[:j], series[j+1:]
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		m[series] = v
	}
	return m, sc.Err()
}

// Sum adds every series of metric name whose labels include all of labels
// (given as `key="value"` strings).
func (m Metrics) Sum(name string, labels ...string) float64 {
	var s float64
	for series, v := range m {
		if !strings.HasPrefix(series, name) {
			continue
		}
		rest := series[len(name):]
		if rest != "" && rest[0] != '{' {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
				break
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// SumAll adds Sum over every node's scrape.
func SumAll(ms []Metrics, name string, labels ...string) float64 {
	var s float64
	for _, m := range ms {
		s += m.Sum(name, labels...)
	}
	return s
}

// Delta is after − before of SumAll.
func Delta(before, after []Metrics, name string, labels ...string) float64 {
	return SumAll(after, name, labels...) - SumAll(before, name, labels...)
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}

func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// RaiseNoFile lifts RLIMIT_NOFILE to its hard limit (children inherit it)
// and reports an error when that is below need.
func RaiseNoFile(need uint64) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	if rl.Cur < need {
		return fmt.Errorf("open file limit %d < %d needed; raise ulimit -n", rl.Cur, need)
	}
	return nil
}

// annotate adds what any exited node said to err.
func (c *Cluster) annotate(err error) error {
	if ex := c.Exited(); ex != "" {
		return fmt.Errorf("%w\n%s", err, ex)
	}
	return err
}

// Post publishes message i on the benchmark's publisher through node 0.
func (c *Cluster) Post(ctx context.Context, i int) error {
	_, err := c.Nodes[0].Client.Call(ctx, Publisher, "post", fmt.Appendf(nil, `{"author":"bench","text":"message %d"}`, i))
	return err
}
