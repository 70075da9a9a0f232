// Command host runs a node of the durable object host and talks to one.
//
// It only parses flags and wires packages; see `host --help`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/delivery"
	examples "github.com/durable-host/host/examples/wasm"
	"github.com/durable-host/host/host"
	"github.com/durable-host/host/store"
)

func main() { os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr)) }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	if err := app.Run(permute(app, args)); err != nil {
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
	return 0
}

func serverFlag() cli.Flag {
	return &cli.StringFlag{Name: "server", Value: "http://127.0.0.1:7070", EnvVars: []string{"HOST_SERVER"}, Usage: "the node's `URL`"}
}

func tokenFlag() cli.Flag {
	return &cli.StringFlag{Name: "token", EnvVars: []string{"HOST_TOKEN"}, Usage: "bearer `TOKEN` when the node runs with --auth"}
}

func client(c *cli.Context) *host.Client {
	return &host.Client{Base: c.String("server"), Token: c.String("token")}
}

func nodeFlags() []cli.Flag {
	d := host.DefaultConfig()
	return []cli.Flag{
		&cli.StringFlag{Name: "data", Value: "./data", EnvVars: []string{"HOST_DATA"}, Usage: "`DIR` for the node database, programs, object files and the compilation cache"},
		&cli.StringFlag{Name: "listen", Value: d.Listen, EnvVars: []string{"HOST_LISTEN"}, Usage: "HTTP `HOST:PORT`"},
		&cli.StringFlag{Name: "nats-url", EnvVars: []string{"HOST_NATS_URL"}, Usage: "use an existing NATS cluster at `URL` instead of the embedded server"},
		&cli.StringFlag{Name: "nats-listen", EnvVars: []string{"HOST_NATS_LISTEN"}, Usage: "embedded NATS client `HOST:PORT` (default: in process, no port)"},
		&cli.StringFlag{Name: "nats-cluster", EnvVars: []string{"HOST_NATS_CLUSTER"}, Usage: "embedded NATS route `HOST:PORT` of this node, to cluster with peers"},
		&cli.StringFlag{Name: "nats-cluster-name", Value: "host", EnvVars: []string{"HOST_NATS_CLUSTER_NAME"}, Usage: "embedded NATS cluster `NAME`; every peer uses the same, and routes from another name are refused"},
		&cli.StringSliceFlag{Name: "nats-routes", EnvVars: []string{"HOST_NATS_ROUTES"}, Usage: "peers' route `URLS`, nats://HOST:PORT, comma separated"},
		&cli.DurationFlag{Name: "budget", Value: d.VM.Budget, EnvVars: []string{"HOST_BUDGET"}, Usage: "wall-clock budget of one handler call"},
		&cli.UintFlag{Name: "memory-pages", Value: uint(d.VM.MemoryLimitPages), EnvVars: []string{"HOST_MEMORY_PAGES"}, Usage: "most 64 KiB memory pages one instance may use"},
		&cli.IntFlag{Name: "max-module-bytes", Value: d.VM.MaxModuleSize, EnvVars: []string{"HOST_MAX_MODULE_BYTES"}, Usage: "largest module an upload may be"},
		&cli.IntFlag{Name: "max-active-objects", Value: d.MaxActiveObjects, EnvVars: []string{"HOST_MAX_ACTIVE_OBJECTS"}, Usage: "objects kept active (open file + instance); the least recently used idle one is deactivated past this"},
		&cli.DurationFlag{Name: "stream-idle", Value: d.Streams.Idle, EnvVars: []string{"HOST_SUBSCRIPTION_IDLE_THRESHOLD"}, Usage: "a stream subscription that heard no hint this long publishes one, recovering lost hints (must be positive)"},
		&cli.DurationFlag{Name: "idle-timeout", Value: d.IdleTimeout, EnvVars: []string{"HOST_IDLE_TIMEOUT"}, Usage: "deactivate an object unused this long"},
		&cli.StringFlag{Name: "sync", Value: "normal", EnvVars: []string{"HOST_SYNC"}, Usage: "SQLite synchronous setting for object files: normal (survives a process crash) or full (also power loss, an fsync per commit)"},
		&cli.DurationFlag{Name: "lease-ttl", Value: d.LeaseTTL, EnvVars: []string{"HOST_LEASE_TTL"}, Usage: "a node that has not renewed its cluster lease for this long is gone for good (its id never returns)"},
		&cli.DurationFlag{Name: "heartbeat", Value: d.Heartbeat, EnvVars: []string{"HOST_HEARTBEAT"}, Usage: "how often a node renews its lease"},
		&cli.IntFlag{Name: "kv-replicas", Value: d.KVReplicas, EnvVars: []string{"HOST_KV_REPLICAS"}, Usage: "replicas of the cluster's JetStream buckets with --nats-url (the embedded cluster picks 3 from 3 nodes up)"},
		&cli.StringFlag{Name: "fanout", Value: string(d.Delivery.FanOut), EnvVars: []string{"HOST_FANOUT"}, Usage: "how connection events cross nodes: node (one call per node; the product), or the benchmark baselines socket (one send per watcher) and subject (NATS subject per topic)"},
		&cli.BoolFlag{Name: "auth", EnvVars: []string{"HOST_AUTH"}, Usage: "tenancy: every request needs a token; the first start writes the operator token to DATA/admin.token (see host tenant --help)"},
		&cli.StringFlag{Name: "tenant-limits", EnvVars: []string{"HOST_TENANT_LIMITS"}, Usage: "default tenant limits as `JSON` over the built-in ones, e.g. '{\"programs\":20,\"publish_rate\":500}' (see host tenant --help)"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"HOST_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
	}
}

func nodeConfig(c *cli.Context, stderr io.Writer) (host.Config, error) {
	cfg := host.DefaultConfig()
	cfg.DataDir = c.String("data")
	cfg.Listen = c.String("listen")
	cfg.NATS = host.NATSConfig{
		URL: c.String("nats-url"), Listen: c.String("nats-listen"),
		Cluster: c.String("nats-cluster"), Routes: c.StringSlice("nats-routes"), ClusterName: c.String("nats-cluster-name"),
	}
	cfg.VM.Budget = c.Duration("budget")
	cfg.VM.MemoryLimitPages = uint32(c.Uint("memory-pages"))
	cfg.VM.MaxModuleSize = c.Int("max-module-bytes")
	cfg.Streams.Idle = c.Duration("stream-idle")
	cfg.MaxActiveObjects = c.Int("max-active-objects")
	cfg.IdleTimeout = c.Duration("idle-timeout")
	cfg.Sync = store.Sync(strings.ToUpper(c.String("sync")))
	cfg.LeaseTTL = c.Duration("lease-ttl")
	cfg.Heartbeat = c.Duration("heartbeat")
	cfg.KVReplicas = c.Int("kv-replicas")
	cfg.Delivery.FanOut = delivery.FanOut(c.String("fanout"))
	cfg.Auth = c.Bool("auth")
	if js := c.String("tenant-limits"); js != "" {
		var over host.Limits
		dec := json.NewDecoder(strings.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&over); err != nil {
			return cfg, fmt.Errorf("--tenant-limits: %w", err)
		}
		cfg.TenantLimits = over.Over(cfg.TenantLimits)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return cfg, fmt.Errorf("--log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	return cfg, cfg.Validate()
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "host",
		Usage: "a WebAssembly host for durable objects and their event streams",
		Description: `A node runs programs (WebAssembly modules built with the Go or Rust SDK).
Each object (PROGRAM/ID) owns one SQLite file with its state and event log;
clients call its methods over HTTP and follow its events over WebSockets
(host watch); other objects follow them durably. Nodes cluster over NATS
(host serve --help); a publish costs one call per node holding watchers.

Start here:  host dev        (a node on 127.0.0.1:7070 with the examples uploaded)
Then:        host call counter/c1 inc`,
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		// Errors come back from Run; run prints them and returns the code,
		// so the CLI never exits the process from inside.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			{
				Name:  "serve",
				Usage: "run a node",
				Description: `Runs a node: the HTTP API, the objects it holds and an embedded NATS server.
With no flags: data under ./data, HTTP on 127.0.0.1:7070, NATS in process.
Every flag also reads its HOST_... environment variable.
Ctrl-C or SIGTERM shuts down gracefully: running calls finish first.

A cluster on one machine, three terminals (each node its own data and port):
  host serve --data d1 --listen 127.0.0.1:7071 --nats-cluster 127.0.0.1:6221 \
    --nats-routes nats://127.0.0.1:6222,nats://127.0.0.1:6223
  host serve --data d2 --listen 127.0.0.1:7072 --nats-cluster 127.0.0.1:6222 \
    --nats-routes nats://127.0.0.1:6221,nats://127.0.0.1:6223
  host serve --data d3 --listen 127.0.0.1:7073 --nats-cluster 127.0.0.1:6223 \
    --nats-routes nats://127.0.0.1:6221,nats://127.0.0.1:6222
Or point every node at an existing NATS cluster (JetStream on) with --nats-url.
A call or a watch against any node reaches the object's home node.`,
				Flags: nodeFlags(),
				Action: func(c *cli.Context) error {
					cfg, err := nodeConfig(c, stderr)
					if err != nil {
						return err
					}
					return serve(c.Context, cfg, nil, stdout)
				},
			},
			{
				Name:  "dev",
				Usage: "run a node with the example programs built and uploaded: the one-command start",
				Description: `Builds every example in --examples (Go; Rust too when Debian's rustc with
the wasm32 target is installed) into the user's cache directory
($XDG_CACHE_HOME/host/examples, by default ~/.cache/host/examples), starts a
node like "host serve" and uploads them, then prints what to try.
The sources are only read: by default those this binary was built from (a
checkout, or the module cache for "go install"). Needs the go command.`,
				Flags: append(nodeFlags(),
					&cli.StringFlag{Name: "examples", Value: examples.SourceDir(), Usage: "`DIR` of the example sources: a subdirectory per program, with main.go (Go) or lib.rs (Rust)"},
				),
				Action: func(c *cli.Context) error {
					cfg, err := nodeConfig(c, stderr)
					if err != nil {
						return err
					}
					cfg.Demo = true
					src := c.String("examples")
					return serve(c.Context, cfg, func(ctx context.Context, n *host.Node) error {
						return devSetup(ctx, n, src, stdout)
					}, stdout)
				},
			},
			{
				Name:      "upload",
				Usage:     "upload a program (a .wasm module) under a name; each upload of new bytes is a new version",
				ArgsUsage: "FILE.wasm",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "program `NAME` (default: the file name without .wasm)"},
					serverFlag(), tokenFlag(),
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: host upload FILE.wasm [--name NAME]")
					}
					path := c.Args().First()
					wasm, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					name := c.String("name")
					if name == "" {
						name = strings.TrimSuffix(filepath.Base(path), ".wasm")
					}
					p, err := client(c).Upload(c.Context, name, wasm)
					if err != nil {
						return err
					}
					fmt.Fprintf(stdout, "program  %s\nversion  %d\ndigest   sha256:%s\nsize     %d bytes\nexports  %s\nhandlers %s\n",
						p.Name, p.Version, p.Digest, p.Size, strings.Join(p.Exports, ", "), strings.Join(p.Handlers, ", "))
					return nil
				},
			},
			{
				Name:      "call",
				Usage:     "call a method of an object and print its reply",
				ArgsUsage: "PROGRAM/ID METHOD [PAYLOAD|-]",
				Description: `PAYLOAD is sent as the request body; "-" reads it from standard input.
Example: host call counter/c1 add '{"amount": 5}'`,
				Flags: []cli.Flag{serverFlag(), tokenFlag()},
				Action: func(c *cli.Context) error {
					if c.NArg() < 2 || c.NArg() > 3 {
						return errors.New("usage: host call PROGRAM/ID METHOD [PAYLOAD|-]")
					}
					var payload []byte
					if c.NArg() == 3 {
						payload = []byte(c.Args().Get(2))
						if c.Args().Get(2) == "-" {
							var err error
							if payload, err = io.ReadAll(stdin); err != nil {
								return err
							}
						}
					}
					out, err := client(c).Call(c.Context, c.Args().Get(0), c.Args().Get(1), payload)
					if err != nil {
						return err
					}
					stdout.Write(out)
					if len(out) == 0 || out[len(out)-1] != '\n' {
						fmt.Fprintln(stdout)
					}
					return nil
				},
			},
			{
				Name:      "watch",
				Usage:     "follow an object's topic over a WebSocket connection and print each event, one JSON line each",
				ArgsUsage: "PROGRAM/ID",
				Description: `Opens a connection (GET /v1/objects/PROGRAM/ID/connect), asks to follow
the object's topic (its follow hook decides) and prints every frame: the
forward envelope {"type":"event","publisher","topic","seq","time","payload"}
unless the connection's program shapes events with an event export.
Delivery to connections is at-most-once: a watcher that falls 256 events
behind is dropped and told so.
Example: host watch chat/room1 --topic messages`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to follow (default: every topic)"},
					&cli.StringFlag{Name: "filter", Usage: "only events whose JSON payload matches `FIELD=VALUE[&...]`"},
					&cli.StringFlag{Name: "params", Usage: "what to present to the publisher's follow hook (a room key ...)"},
					&cli.StringFlag{Name: "via", Usage: "attach the connection to `PROGRAM/ID` whose event export shapes the frames"},
					&cli.IntFlag{Name: "count", Usage: "exit after `N` frames (0: run until interrupted)"},
					serverFlag(), tokenFlag(),
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: host watch PROGRAM/ID [--topic T]")
					}
					ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
					defer stop()
					left := c.Int("count")
					return client(c).Watch(ctx, c.Args().First(), host.WatchOptions{
						Topic: c.String("topic"), Filter: c.String("filter"), Params: c.String("params"), Via: c.String("via"),
					}, func(frame []byte) bool {
						stdout.Write(frame)
						fmt.Fprintln(stdout)
						left--
						return left != 0
					})
				},
			},
			{
				Name:      "subscribe",
				Usage:     "read an object's event stream from storage (catch-up, at-least-once) and print each event, one JSON line each",
				ArgsUsage: "PROGRAM/ID",
				Description: `Opens GET /v1/objects/PROGRAM/ID/stream (server-sent events). Every event
is read from the object's log; the node sends it when the object commits
(an empty NATS hint wakes the reader) or, if a hint was lost, within the
idle threshold (--stream-idle on the node, 10 s by default).

--after N resumes after your checkpoint N (exclusive): events N+1, N+2, ...
in order. Without --after: the latest stored event once, then newer ones.
Delivery is at-least-once: keep the seq of the last event you processed
and pass it as --after when you come back; deduplicate by seq.
Example: host subscribe chat/room1 --topic messages --after 0`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "topic", Usage: "only events of `TOPIC` (default: every topic)"},
					&cli.StringFlag{Name: "filter", Usage: "only events whose JSON payload matches `FIELD=VALUE[&...]`"},
					&cli.StringFlag{Name: "after", Usage: "resume after event `SEQ` (exclusive); omit for the latest event, then newer"},
					&cli.IntFlag{Name: "count", Usage: "exit after `N` events (0: run until interrupted)"},
					serverFlag(), tokenFlag(),
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: host subscribe PROGRAM/ID [--after SEQ] [--topic T]")
					}
					o := host.SubscribeOptions{Topic: c.String("topic"), Filter: c.String("filter")}
					if s := c.String("after"); s != "" {
						v, err := strconv.ParseUint(s, 10, 64)
						if err != nil {
							return fmt.Errorf("--after must be an event seq (a non-negative integer), not %q", s)
						}
						o.After = &v
					}
					ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
					defer stop()
					left := c.Int("count")
					return client(c).Subscribe(ctx, c.Args().First(), o, func(data []byte) bool {
						stdout.Write(data)
						fmt.Fprintln(stdout)
						left--
						return left != 0
					})
				},
			},
			{
				Name:      "edges",
				Usage:     "list an object's edges: its approved followers, their nodes, topics and cursors",
				ArgsUsage: "PROGRAM/ID",
				Flags:     []cli.Flag{serverFlag(), tokenFlag()},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: host edges PROGRAM/ID")
					}
					id, err := host.ParseObjectID(c.Args().First())
					if err != nil {
						return err
					}
					var v json.RawMessage
					if err := client(c).Get(c.Context, "/v1/objects/"+id.Program+"/"+id.ID+"/edges", &v); err != nil {
						return err
					}
					return printJSON(stdout, v)
				},
			},
			{
				Name:      "unfollow",
				Usage:     "remove one of an object's edges by id (see host edges)",
				ArgsUsage: "PROGRAM/ID EDGE",
				Flags:     []cli.Flag{serverFlag(), tokenFlag()},
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return errors.New("usage: host unfollow PROGRAM/ID EDGE")
					}
					id, err := host.ParseObjectID(c.Args().First())
					if err != nil {
						return err
					}
					var v json.RawMessage
					if err := client(c).Delete(c.Context, "/v1/objects/"+id.Program+"/"+id.ID+"/edges/"+c.Args().Get(1), &v); err != nil {
						return err
					}
					return printJSON(stdout, v)
				},
			},
			{
				Name:  "examples",
				Usage: "build the example programs into examples/wasm/out (Go; Rust when Debian's rustc with the wasm32 target is installed)",
				Action: func(c *cli.Context) error {
					out := filepath.Join(examples.SourceDir(), "out")
					_, rerr := examples.Rustc()
					built, err := examples.Build(c.Context, out, examples.Options{SkipRust: rerr != nil})
					for _, b := range built {
						if fi, serr := os.Stat(b.Path); serr == nil {
							fmt.Fprintf(stdout, "%-16s %8d bytes  %s\n", b.Name, fi.Size(), b.Path)
						}
					}
					if rerr != nil {
						fmt.Fprintf(stdout, "(Rust examples skipped: %v)\n", rerr)
					}
					return err
				},
			},
			{
				Name:  "cluster",
				Usage: "list the live nodes of the cluster: ids, addresses, objects and connections held",
				Flags: []cli.Flag{serverFlag(), tokenFlag()},
				Action: func(c *cli.Context) error {
					var v json.RawMessage
					if err := client(c).Get(c.Context, "/v1/cluster", &v); err != nil {
						return err
					}
					return printJSON(stdout, v)
				},
			},
			benchCommand(stdout, stderr),
			tenantCommand(stdout),
			whoamiCommand(stdout),
			{
				Name:      "programs",
				Usage:     "list programs (the latest version of each), or every version of one",
				ArgsUsage: "[NAME]",
				Flags:     []cli.Flag{serverFlag(), tokenFlag()},
				Action: func(c *cli.Context) error {
					path := "/v1/programs"
					if c.NArg() == 1 {
						path += "/" + c.Args().First()
					}
					var v json.RawMessage
					if err := client(c).Get(c.Context, path, &v); err != nil {
						return err
					}
					return printJSON(stdout, v)
				},
			},
		},
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// serve runs a node until SIGINT/SIGTERM, calling setup once it listens.
// A node that loses its cluster lease is gone for good: serve starts a new
// one, under a new id, on the same data directory.
func serve(parent context.Context, cfg host.Config, setup func(context.Context, *host.Node) error, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	for {
		n, err := host.New(ctx, cfg)
		if err != nil {
			return err
		}
		// Setup (host dev's uploads) runs before the node serves, so nobody
		// calls a program that is not there yet.
		if setup != nil {
			if err := setup(ctx, n); err != nil {
				n.Shutdown(context.Background())
				return err
			}
			setup = nil
		}
		if err := n.Start(); err != nil {
			n.Shutdown(context.Background())
			return err
		}
		select {
		case <-n.LeaseLost():
			fmt.Fprintf(stdout, "node %s lost its lease; rejoining under a new id\n", n.ID())
			continue
		case <-ctx.Done():
		}
		fmt.Fprintln(stdout, "shutting down: finishing running calls")
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return n.Shutdown(sctx)
	}
}

// devOutDir is where host dev builds the examples: the user's cache, so an
// installed binary never writes into its sources (the module cache is
// read-only, and a checkout's examples/wasm/out belongs to make examples).
func devOutDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory to build the examples in (set XDG_CACHE_HOME or HOME): %w", err)
	}
	return filepath.Join(dir, "host", "examples"), nil
}

func devSetup(ctx context.Context, n *host.Node, src string, stdout io.Writer) error {
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return fmt.Errorf("no example sources at %s (this binary was built elsewhere, or with -trimpath): pass --examples DIR, the examples/wasm directory of a checkout", src)
	}
	out, err := devOutDir()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "building examples from %s into %s ...\n", src, out)
	built, err := examples.Build(ctx, out, examples.Options{Source: src, SkipRust: true})
	if err != nil {
		return fmt.Errorf("build examples: %w", err)
	}
	// Rust examples are a bonus here: without the toolchain, or if one
	// fails to build, the Go ones still make a working demo.
	var rust []string
	entries, _ := os.ReadDir(src)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "-rust") {
			rust = append(rust, e.Name())
		}
	}
	if _, rerr := examples.Rustc(); rerr != nil {
		fmt.Fprintf(stdout, "  (Rust examples skipped: %v)\n", rerr)
	} else if len(rust) > 0 {
		rb, rerr := examples.Build(ctx, out, examples.Options{Source: src, Only: rust})
		if rerr != nil {
			fmt.Fprintf(stdout, "  (Rust examples skipped: %v)\n", firstLine(rerr.Error()))
		} else {
			built = append(built, rb...)
		}
	}
	for _, b := range built {
		wasm, err := os.ReadFile(b.Path)
		if err != nil {
			return err
		}
		p, _, err := n.Upload(ctx, b.Name, wasm)
		if err != nil {
			return fmt.Errorf("upload %s: %w", b.Name, err)
		}
		fmt.Fprintf(stdout, "  uploaded %-14s version %d  %d KB\n", p.Name, p.Version, p.Size/1024)
	}
	fmt.Fprintf(stdout, `
node %s is up at %s

open %s/?room=room1 in two browser tabs to chat, or try:
  host call counter/c1 inc
  host call counter/c1 add '{"amount": 5}'
  host call chat/room1 post '{"author": "ann", "text": "hi"}'
  host call chat/room1 history
  curl -X POST %s/v1/objects/counter/c1/get

Ctrl-C stops the node; state survives under its data directory.
`, n.ID(), n.URL(), n.URL(), n.URL())
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// permute puts every flag right after the command that defines it, so
// flags may come before or after positional arguments ("host upload app.wasm
// --name app") and before or after a subcommand's name ("host bench --nodes
// 4 fanout", "host bench fanout --nodes 4"): urfave/cli stops parsing flags
// at the first argument, and a command parses only its own flags (its
// subcommands read them through their parent). A flag that no command on
// the path defines goes to the last one, which reports it.
func permute(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	var (
		path []*cli.Command // the command and subcommands named in args
		seen [][]string     // each flag, with its value if it takes one
		pos  []string
		cmds = app.Commands
		rest = args[1:]
	)
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if len(a) > 1 && a[0] == '-' {
			name, _, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
			words := []string{a}
			if !inline && takesValue(path, cmds, name) && i+1 < len(rest) {
				words = append(words, rest[i+1])
				i++
			}
			seen = append(seen, words)
			continue
		}
		if c := findCommand(cmds, a); c != nil && len(pos) == 0 {
			path = append(path, c)
			cmds = c.Subcommands
			continue
		}
		pos = append(pos, a)
	}
	if len(path) == 0 {
		return args // no command: --help, or urfave/cli's own answer to a typo
	}
	// flags[0] go after the app's name, flags[i] after path[i-1].
	flags := make([][]string, len(path)+1)
	for _, words := range seen {
		name, _, _ := strings.Cut(strings.TrimLeft(words[0], "-"), "=")
		at := len(path)
		for i := len(path) - 1; i >= 0; i-- {
			if flagNamed(path[i], name) != nil {
				at = i + 1
				break
			}
		}
		flags[at] = append(flags[at], words...)
	}
	out := append([]string{args[0]}, flags[0]...)
	for i, c := range path {
		out = append(out, c.Name)
		out = append(out, flags[i+1]...)
	}
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func flagNamed(c *cli.Command, name string) cli.Flag {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// takesValue reports whether flag name takes a value: as the nearest
// command of path defines it, else as a subcommand that may still be named
// (below) does.
func takesValue(path, below []*cli.Command, name string) bool {
	for i := len(path) - 1; i >= 0; i-- {
		if f := flagNamed(path[i], name); f != nil {
			_, isBool := f.(*cli.BoolFlag)
			return !isBool
		}
	}
	for _, c := range below {
		if f := flagNamed(c, name); f != nil {
			_, isBool := f.(*cli.BoolFlag)
			return !isBool
		}
		if takesValue(nil, c.Subcommands, name) {
			return true
		}
	}
	return false
}
