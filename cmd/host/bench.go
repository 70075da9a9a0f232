package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/bench"
	"github.com/durable-host/host/bench/chaos"
)

// benchCommand is `host bench fanout`, `host bench followers` and `host
// bench chaos`. The fan-out flags sit on `bench` itself (the subcommands
// read them through their parent), so they may come before or after the
// subcommand's name; chaos has flags of its own, after its name.
func benchCommand(stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "benchmark fan-out across node processes on this machine: fanout (WebSocket watchers) or followers (durable objects); chaos: the chaos soak",
		Description: `Starts --nodes "host serve" processes of this binary on loopback (each its own
temporary data directory, HTTP port and NATS route port, clustered), uploads
the chat and tally examples, and publishes --messages messages to chat/room1
on node 0, one at a time (closed loop: the next goes out once every watcher
or follower has the previous one). Figures come from the nodes' /metrics and
from clients in this process.

  host bench fanout --fanout all       product vs both baselines, 8 nodes, 5,000 watchers
  host bench followers                 50 tally objects following the room

fanout: --watchers WebSocket clients spread round-robin over the nodes; prints
sends per message, inter-node bytes per message (and the connection batches'
event and edge bytes), node CPU seconds per
message, publish→socket latency p50/p99/p999, deliveries per second; then the
raw single-process WebSocket ceiling for the same number of sockets.
--fanout picks the nodes' mode: node (the product: one call per node holding
sockets), socket (baseline: one inter-node send per watcher), subject
(baseline: a NATS subject per topic, NATS fans out), or all (each on a fresh
cluster, same workload, with ratios). --churn F has F × --watchers more
watchers per second join and leave while the messages go out.

followers: --followers tally objects on the nodes other than the publisher's;
prints deliveries per message, latency until every follower committed, events
per second, and checks every follower counted every event exactly once.

Needs ulimit -n of at least --watchers + 1024 (2 × --watchers + 512 for the
raw ceiling); it raises the soft limit to the hard one.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 8, EnvVars: []string{"HOST_BENCH_NODES"}, Usage: "node processes to start"},
			&cli.IntFlag{Name: "watchers", Value: 5000, EnvVars: []string{"HOST_BENCH_WATCHERS"}, Usage: "fanout: WebSocket watchers, spread round-robin over the nodes"},
			&cli.IntFlag{Name: "followers", Value: 50, EnvVars: []string{"HOST_BENCH_FOLLOWERS"}, Usage: "followers: tally objects following the room, on the nodes other than the publisher's"},
			&cli.IntFlag{Name: "messages", Value: 100, EnvVars: []string{"HOST_BENCH_MESSAGES"}, Usage: "measured messages (after 3 unmeasured warm-up ones)"},
			&cli.StringFlag{Name: "fanout", Value: bench.ModeNode, Usage: "fanout: node, socket, subject or all"},
			&cli.BoolFlag{Name: "no-raw", Usage: "fanout: skip the raw single-process WebSocket ceiling"},
			&cli.Float64Flag{Name: "churn", Usage: "fanout: during the measured messages, this fraction of --watchers per second join and leave (0.01 = 1%), as extra watchers beside the measured ones"},
			&cli.DurationFlag{Name: "timeout", Value: 60 * time.Second, Usage: "longest wait for one message to reach everyone"},
			&cli.DurationFlag{Name: "lease-ttl", Value: 60 * time.Second, Usage: "the nodes' --lease-ttl (long: a loaded machine misses heartbeats)"},
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "the nodes' --log-level (their output goes to node-I.log in the run directory)"},
			&cli.StringFlag{Name: "dir", Usage: "keep the nodes' data and logs under `DIR` (default: a temporary directory, removed)"},
			&cli.StringFlag{Name: "cache", EnvVars: []string{"HOST_BENCH_CACHE"}, Usage: "seed every node's compilation cache from `DIR`, filled by the first cluster when empty, so later runs skip compiling (default: one per invocation)"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress line on stderr"},
		},
		Subcommands: []*cli.Command{
			chaosCommand(stdout, stderr),
			tailsCommand(stdout, stderr),
			bareCommand(),
			{
				Name:  "fanout",
				Usage: "WebSocket watchers over node processes: the product vs the per-socket and NATS-subject baselines",
				Action: func(c *cli.Context) error {
					modes := []string{c.String("fanout")}
					switch modes[0] {
					case "all":
						modes = bench.Modes
					case bench.ModeNode, bench.ModeSocket, bench.ModeSubject:
					default:
						return fmt.Errorf("--fanout %q: want node, socket, subject or all", modes[0])
					}
					cfg, err := benchBase(c, stderr)
					if err != nil {
						return err
					}
					defer cfg.done()
					rep, err := bench.RunFanoutAll(cfg.ctx, bench.FanoutAllConfig{
						FanoutConfig: bench.FanoutConfig{
							Exe: cfg.exe, Nodes: c.Int("nodes"), Watchers: c.Int("watchers"), Messages: c.Int("messages"),
							Churn:   c.Float64("churn"),
							Timeout: c.Duration("timeout"), LeaseTTL: c.Duration("lease-ttl"), LogLevel: c.String("log-level"),
							Dir: c.String("dir"), CacheSeed: c.String("cache"), Progress: cfg.progress,
						},
						Modes:   modes,
						SkipRaw: c.Bool("no-raw"),
					})
					cfg.done()
					if rep != nil && (len(rep.Runs) > 0 || err == nil) {
						if c.Bool("json") {
							if perr := printJSON(stdout, rep); perr != nil {
								return perr
							}
						} else {
							rep.WriteTable(stdout)
						}
					}
					return err
				},
			},
			{
				Name:  "followers",
				Usage: "durable object followers (tally) on other node processes following one chat room",
				Action: func(c *cli.Context) error {
					cfg, err := benchBase(c, stderr)
					if err != nil {
						return err
					}
					defer cfg.done()
					m := bench.ThisMachine()
					r, err := bench.RunFollowers(cfg.ctx, bench.FollowersConfig{
						Exe: cfg.exe, Nodes: c.Int("nodes"), Followers: c.Int("followers"), Messages: c.Int("messages"),
						Timeout: c.Duration("timeout"), LeaseTTL: c.Duration("lease-ttl"), LogLevel: c.String("log-level"),
						Dir: c.String("dir"), CacheSeed: c.String("cache"), Progress: cfg.progress,
					})
					cfg.done()
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(stdout, struct {
							Machine bench.Machine `json:"machine"`
							*bench.FollowersResult
						}{m, r})
					}
					r.WriteTable(stdout, m)
					return nil
				},
			},
		},
	}
}

// benchRun is what both subcommands share: the node executable, a context
// cancelled by Ctrl-C, and the progress line.
type benchRun struct {
	exe      string
	ctx      context.Context
	progress bench.Progress
	done     func() // clears the progress line and stops listening for signals
}

func benchBase(c *cli.Context, stderr io.Writer) (*benchRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this executable to start nodes: %w", err)
	}
	if dir := c.String("cache"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("--cache: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	p := &progressLine{w: stderr, off: c.Bool("no-progress")}
	var once sync.Once
	return &benchRun{exe: exe, ctx: ctx, progress: p.update, done: func() { once.Do(func() { p.clear(); stop() }) }}, nil
}

// progressLine draws one "\r" line on stderr: the stage, a bar, done/total.
type progressLine struct {
	mu   sync.Mutex
	w    io.Writer
	off  bool
	last time.Time
	n    int // width of the last line drawn
}

func (p *progressLine) update(stage string, done, total int) {
	if p.off {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if done < total && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 30
	fill := 0
	if total > 0 {
		fill = min(width, done*width/total)
	}
	line := fmt.Sprintf("%-28s [%s%s] %d/%d", stage, strings.Repeat("#", fill), strings.Repeat("-", width-fill), done, total)
	pad := max(0, p.n-len(line))
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
	p.n = len(line)
}

func (p *progressLine) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.n))
		p.n = 0
	}
}

// chaosCommand is `host bench chaos`. Its flags are its own (after
// `chaos`): its sizes and lease differ from fanout's.
func chaosCommand(stdout, stderr io.Writer) *cli.Command {
	d := chaos.DefaultConfig()
	return &cli.Command{
		Name:  "chaos",
		Usage: "a chaos soak: kill -9, SIGSTOP past the lease and graceful restarts under a counter workload with followers, subscribers and watchers, checked for linearizability and exactly-once",
		Description: `Starts --nodes "host serve" processes with --replicas copies and a short
--lease-ttl, uploads the counter and tally examples, and runs --clients
clients for --duration, each adding amounts no other write uses to, and
reading, one of --objects counters through a random live node. Beside
them, the counters' events are read three ways: --followers counters have
a tally object following their "changes" topic (set up before the first
write); --subscribers stream subscribers each read one counter's stream
through a random live node and resume after their last seq through
another when it breaks; --watchers WebSocket watchers each follow one
counter and connect again when dropped. Meanwhile a schedule seeded by
--seed kills (SIGKILL), pauses (SIGSTOP past the lease, then SIGCONT) or
gracefully restarts a random node, --fault-gap apart on average, and
waits for the cluster to list every node again; with --max-down 2, one
fault in three (a kill or a pause) takes a second node down with it.

At the end it checks each counter's history with porcupine (a call without
a reply counts as possibly applied), its log against every acknowledged
write (none lost, none twice, nothing else), that node ids never came
back, that no two homes answered one counter at once (from each reply's
Host-Served-By: the node that ran it), that each tally counted exactly the events of its counter's log
(by seq), that each subscriber got every event with no gap from each
checkpoint, and that no watcher connection got an event twice. It prints
operations, faults, availability, latency during faults and without, and
the watchers' loss rate (at-most-once: not a violation); on a violation,
the seed, the smallest failing history found and where the node logs
are, and exits 1. Node data and logs stay under --dir, or in a temporary
directory kept after a violation.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: d.Nodes, Usage: "node processes to start"},
			&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "how long the clients run"},
			&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seeds the clients and the fault schedule"},
			&cli.IntFlag{Name: "objects", Value: d.Objects, Usage: "counters the clients share"},
			&cli.IntFlag{Name: "clients", Value: d.Clients, Usage: "clients, each in a closed loop"},
			&cli.IntFlag{Name: "followers", Value: d.Followers, Usage: "counters followed by a tally object (durable follower)"},
			&cli.IntFlag{Name: "subscribers", Value: d.Subscribers, Usage: "stream subscribers, each on one counter, resuming from their checkpoint"},
			&cli.IntFlag{Name: "watchers", Value: d.Watchers, Usage: "WebSocket watchers, each on one counter"},
			&cli.IntFlag{Name: "max-down", Value: d.MaxDown, Usage: "nodes down at once at most (1 or 2)"},
			&cli.DurationFlag{Name: "lease-ttl", Value: d.LeaseTTL, Usage: "the nodes' --lease-ttl"},
			&cli.IntFlag{Name: "replicas", Value: d.Replicas, Usage: "the nodes' --replicas"},
			&cli.DurationFlag{Name: "fault-gap", Value: d.FaultGap, Usage: "mean wait between one fault healing and the next"},
			&cli.StringFlag{Name: "log-level", Value: d.LogLevel, Usage: "the nodes' --log-level (node-I.log in the run directory)"},
			&cli.StringFlag{Name: "dir", Usage: "keep the nodes' data and logs under `DIR` (default: a temporary directory, kept after a violation)"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress line on stderr"},
		},
		Action: func(c *cli.Context) error {
			run, err := benchBase(c, stderr)
			if err != nil {
				return err
			}
			defer run.done()
			cfg := d
			cfg.Exe, cfg.Progress = run.exe, run.progress
			cfg.Nodes, cfg.Duration, cfg.Seed = c.Int("nodes"), c.Duration("duration"), c.Uint64("seed")
			cfg.Objects, cfg.Clients, cfg.LeaseTTL = c.Int("objects"), c.Int("clients"), c.Duration("lease-ttl")
			cfg.Replicas, cfg.FaultGap = c.Int("replicas"), c.Duration("fault-gap")
			cfg.Followers, cfg.Subscribers, cfg.Watchers = c.Int("followers"), c.Int("subscribers"), c.Int("watchers")
			cfg.MaxDown = c.Int("max-down")
			cfg.LogLevel, cfg.Dir = c.String("log-level"), c.String("dir")
			r, err := chaos.Run(run.ctx, cfg)
			run.done()
			if r != nil {
				if c.Bool("json") {
					if perr := printJSON(stdout, r); perr != nil {
						return perr
					}
				} else {
					r.WriteTable(stdout)
				}
			}
			if err != nil {
				return err
			}
			if len(r.Violations) > 0 {
				return fmt.Errorf("%d violations (seed %d; logs in %s)", len(r.Violations), r.Seed, r.Dir)
			}
			return nil
		},
	}
}
