package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// TailsConfig is one `host bench tails` run: one node process and a bare
// writer process (ServeBare, run as `host bench bare`) on this machine,
// Sockets WebSocket clients in this process on one of them at a time, in
// alternating blocks (node, bare, bare, node, node, bare, …: each side
// meets the machine's drift as often first as second).
type TailsConfig struct {
	Exe     string
	Sockets int
	// Messages per block, closed loop (the next goes out when every
	// socket has the last), after Warmup unmeasured ones (10).
	Messages int
	Warmup   int
	// Blocks per side (2: node, bare, bare, node).
	Blocks int
	// Timeout bounds the wait for one message to reach every socket.
	Timeout  time.Duration
	LogLevel string
	Dir      string
	Progress Progress
}

// TailsSide is what one server cost over all its blocks.
type TailsSide struct {
	Name string `json:"name"`
	// Publish (the server's clock as it takes the event: the node's event
	// time, the bare writer's before its first write) → a client read
	// the frame, over every (message, socket).
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// Publish (as above) → the first socket read it, per message: the
	// server's fixed cost before its first write.
	FirstP50Ms float64 `json:"first_p50_ms"`
	FirstP99Ms float64 `json:"first_p99_ms"`
	// Publish request sent → the last socket has it, per message.
	AllP50Ms float64 `json:"all_p50_ms"`
	AllP99Ms float64 `json:"all_p99_ms"`
	// CPUPerMsg is the server process's CPU seconds per message (from
	// /proc: user + system), dial and warm-up excluded.
	CPUPerMsg        float64 `json:"cpu_s_per_msg"`
	DeliveriesPerSec float64 `json:"deliveries_per_s"`
	Delivered        int64   `json:"delivered"`
	Expected         int64   `json:"expected"`
	OutOfOrder       int64   `json:"out_of_order"`
	Missed           int     `json:"missed_messages"`
	FrameBytes       int     `json:"frame_bytes"`
}

// TailsResult is one run: the node against the bare writer, same sockets,
// same machine, alternated.
type TailsResult struct {
	Machine  Machine   `json:"machine"`
	Sockets  int       `json:"sockets"`
	Messages int       `json:"messages_per_block"`
	Blocks   int       `json:"blocks_per_side"`
	Node     TailsSide `json:"node"`
	Bare     TailsSide `json:"bare"`
	// Each block in the order run: how far the machine drifted.
	Each []TailsBlock `json:"blocks"`
	// The node's figure over the bare writer's.
	P50Ratio    float64 `json:"p50_ratio"`
	P99Ratio    float64 `json:"p99_ratio"`
	AllP50Ratio float64 `json:"all_p50_ratio"`
	CPURatio    float64 `json:"cpu_ratio"`
}

// RunTails measures publish → socket on one node against the bare writer.
func RunTails(ctx context.Context, cfg TailsConfig) (*TailsResult, error) {
	if cfg.Sockets < 1 || cfg.Messages < 1 {
		return nil, errors.New("bench: need at least one socket and one message")
	}
	if cfg.Blocks < 1 {
		cfg.Blocks = 2
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 10
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, int, int) {}
	}
	if err := RaiseNoFile(uint64(cfg.Sockets + 1024)); err != nil {
		return nil, err
	}
	cl, err := StartCluster(ctx, ClusterConfig{
		Exe: cfg.Exe, Nodes: 1, Mode: ModeNode, LogLevel: cfg.LogLevel, Dir: cfg.Dir,
		Progress: progress,
	})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fail := func(err error) (*TailsResult, error) { return nil, cl.annotate(err) }
	if err := cl.Upload(ctx, filepath.Join(cl.dir, "wasm")); err != nil {
		return fail(err)
	}
	if err := cl.Post(ctx, 0); err != nil {
		return fail(fmt.Errorf("first post: %w", err))
	}
	bare, err := startBare(ctx, cfg.Exe, filepath.Join(cl.dir, "bare.log"))
	if err != nil {
		return fail(err)
	}
	defer bare.close()

	node := &tailsSide{name: "node", url: cl.Nodes[0].URL, pid: cl.Nodes[0].cmd.Process.Pid}
	node.post = func(i int) error { return cl.Post(ctx, i) }
	bs := &tailsSide{name: "bare", url: bare.url, pid: bare.cmd.Process.Pid}
	bs.post = func(int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, bare.url+"/publish?len="+strconv.Itoa(node.frameBytes), nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("bare publish: %s", resp.Status)
		}
		return nil
	}
	order := make([]*tailsSide, 0, 2*cfg.Blocks)
	for b := 0; b < cfg.Blocks; b++ {
		if b%2 == 0 {
			order = append(order, node, bs)
		} else {
			order = append(order, bs, node)
		}
	}
	var each []TailsBlock
	for k, s := range order {
		if err := s.block(ctx, cfg, func(st string, d, t int) {
			progress(fmt.Sprintf("block %d/%d (%s): %s", k+1, len(order), s.name, st), d, t)
		}); err != nil {
			return fail(fmt.Errorf("%s block: %w", s.name, err))
		}
		each = append(each, s.each[len(s.each)-1])
	}
	r := &TailsResult{
		Machine: ThisMachine(), Sockets: cfg.Sockets, Messages: cfg.Messages, Blocks: cfg.Blocks,
		Node: node.result(), Bare: bs.result(), Each: each,
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	r.P50Ratio = ratio(r.Node.P50Ms, r.Bare.P50Ms)
	r.P99Ratio = ratio(r.Node.P99Ms, r.Bare.P99Ms)
	r.AllP50Ratio = ratio(r.Node.AllP50Ms, r.Bare.AllP50Ms)
	r.CPURatio = ratio(r.Node.CPUPerMsg, r.Bare.CPUPerMsg)
	return r, nil
}

// TailsBlock is one block's figures.
type TailsBlock struct {
	Side     string  `json:"side"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	AllP50Ms float64 `json:"all_p50_ms"`
}

// tailsSide gathers one server's blocks.
type tailsSide struct {
	name       string
	url        string
	pid        int
	post       func(i int) error
	posted     int
	lat, all   []int64
	first      []int64
	each       []TailsBlock
	cpu        float64
	msgs       int
	expected   int64
	outOfOrder int64
	missed     int
	elapsed    time.Duration
	frameBytes int
}

// block dials the sockets, warms them up, measures cfg.Messages messages
// and closes the sockets.
func (s *tailsSide) block(ctx context.Context, cfg TailsConfig, progress Progress) error {
	ws, err := dialWatchers(ctx, []string{s.url}, cfg.Sockets, progress)
	if err != nil {
		return err
	}
	defer ws.close()
	w := int64(cfg.Sockets)
	next := func() error {
		s.posted++
		return s.post(s.posted)
	}
	if err := ws.warmUp(cfg.Warmup, cfg.Timeout, func(int) error { return next() }, func(int) {}); err != nil {
		return err
	}
	if f := ws.sample.Load(); f != nil && s.frameBytes == 0 {
		s.frameBytes = len(*f)
	}
	// The dial's aftermath (a node's edge rows and their WAL checkpoint,
	// the GC of the dial's garbage) is not the fan-out's.
	time.Sleep(4 * settle)
	cpu0, err := procCPU(s.pid)
	if err != nil {
		return err
	}
	ws.measuring.Store(true)
	start := time.Now()
	for i := 0; i < cfg.Messages; i++ {
		took, ok, err := ws.roundTrip(ctx, cfg.Timeout, next)
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.missed++
			continue
		}
		s.all = append(s.all, took.Nanoseconds())
		progress("publish", i+1, cfg.Messages)
	}
	s.elapsed += time.Since(start)
	cpu1, err := procCPU(s.pid)
	if err != nil {
		return err
	}
	ws.measuring.Store(false)
	s.cpu += cpu1 - cpu0
	s.msgs += cfg.Messages
	s.expected += w * int64(cfg.Messages)
	ws.close()
	s.outOfOrder += ws.outOfOrder.Load()
	var blk []int64
	for _, l := range ws.lat {
		blk = append(blk, l...)
	}
	s.lat = append(s.lat, blk...)
	s.each = append(s.each, TailsBlock{Side: s.name, P50Ms: pctMs(blk, 0.5), P99Ms: pctMs(blk, 0.99), AllP50Ms: pctMs(s.all[len(s.all)-min(len(s.all), cfg.Messages):], 0.5)})
	// A watcher's i-th latency is the i-th measured message's, when no
	// message was missed.
	if s.missed == 0 {
		for i := 0; i < cfg.Messages; i++ {
			m := int64(-1)
			for _, l := range ws.lat {
				if i < len(l) && (m < 0 || l[i] < m) {
					m = l[i]
				}
			}
			if m >= 0 {
				s.first = append(s.first, m)
			}
		}
	}
	// Let the server drop the closed sockets before the other side runs.
	time.Sleep(2 * settle)
	return nil
}

func (s *tailsSide) result() TailsSide {
	r := TailsSide{
		Name: s.name, Delivered: int64(len(s.lat)), Expected: s.expected,
		OutOfOrder: s.outOfOrder, Missed: s.missed, FrameBytes: s.frameBytes,
	}
	if s.msgs > 0 {
		r.CPUPerMsg = s.cpu / float64(s.msgs)
	}
	if s.elapsed > 0 {
		r.DeliveriesPerSec = float64(len(s.lat)) / s.elapsed.Seconds()
	}
	r.P50Ms, r.P99Ms, r.P999Ms = pctMs(s.lat, 0.50), pctMs(s.lat, 0.99), pctMs(s.lat, 0.999)
	r.AllP50Ms, r.AllP99Ms = pctMs(s.all, 0.50), pctMs(s.all, 0.99)
	r.FirstP50Ms, r.FirstP99Ms = pctMs(s.first, 0.50), pctMs(s.first, 0.99)
	return r
}

// procCPU is a process's user + system CPU seconds, from /proc.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (utime and stime are fields 14
	// and 15 of the line, 12 and 13 after it).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return float64(ut+st) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100

// bareProc is a running `host bench bare`.
type bareProc struct {
	url  string
	cmd  *exec.Cmd
	logf *os.File
}

func startBare(ctx context.Context, exe, logPath string) (*bareProc, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	cmd := exec.Command(exe, "bench", "bare", "--listen", addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	b := &bareProc{url: "http://" + addr, cmd: cmd, logf: logf}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(b.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return b, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.close()
			return nil, fmt.Errorf("bare writer did not answer at %s: %v (log: %s)", addr, err, tail(logPath, 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bareProc) close() {
	b.cmd.Process.Kill()
	b.cmd.Wait()
	b.logf.Close()
}

// WriteTable prints the run for people.
func (r *TailsResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs %s, %s, load %s\n", r.Machine.CPUs, r.Machine.CPU, r.Machine.Go, r.Machine.Load)
	fmt.Fprintf(w, "%d sockets, %d blocks per side of %d messages, frames of %d bytes\n\n", r.Sockets, r.Blocks, r.Messages, r.Node.FrameBytes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tper-delivery p50 ms\tp99 ms\tp999 ms\tfirst p50 ms\tfirst p99 ms\tall p50 ms\tall p99 ms\tCPU ms/msg\tdeliveries/s\tdelivered\tmissed msgs\tout of order\t")
	for _, s := range []TailsSide{r.Node, r.Bare} {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%d/%d\t%d\t%d\t\n", s.Name, s.P50Ms, s.P99Ms, s.P999Ms,
			s.FirstP50Ms, s.FirstP99Ms, s.AllP50Ms, s.AllP99Ms, 1000*s.CPUPerMsg, s.DeliveriesPerSec, s.Delivered, s.Expected, s.Missed, s.OutOfOrder)
	}
	fmt.Fprintf(tw, "node / bare\t%.2f×\t%.2f×\t\t\t\t%.2f×\t\t%.2f×\t\t\t\t\t\n", r.P50Ratio, r.P99Ratio, r.AllP50Ratio, r.CPURatio)
	tw.Flush()
	fmt.Fprintf(w, "\nblocks in order (per-delivery p50 / p99, all p50, ms):")
	for _, b := range r.Each {
		fmt.Fprintf(w, " %s %.0f/%.0f,%.0f", b.Side, b.P50Ms, b.P99Ms, b.AllP50Ms)
	}
	fmt.Fprintln(w)
}
