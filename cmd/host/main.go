// Command host runs a node of the durable object host and talks to one.
//
// It only parses flags and wires packages; see `host --help`.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
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

// newApp assembles the commands, one file each (serve.go, call.go ...),
// in the order host --help lists them.
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
			serveCommand(stdout, stderr),
			devCommand(stdout, stderr),
			uploadCommand(stdout),
			callCommand(stdin, stdout),
			watchCommand(stdout),
			subscribeCommand(stdout),
			edgesCommand(stdout),
			replicasCommand(stdout),
			objectsCommand(stdout),
			stateCommand(stdout),
			logCommand(stdout),
			unfollowCommand(stdout),
			examplesCommand(stdout),
			clusterCommand(stdout),
			benchCommand(stdout, stderr),
			tenantCommand(stdout),
			whoamiCommand(stdout),
			programsCommand(stdout),
		},
	}
}

// The flags below are shared by several commands. Each call makes a new
// flag, as urfave/cli keeps parse state in the flag value.

// serverFlag is the node a client command talks to.
func serverFlag() cli.Flag {
	return &cli.StringFlag{Name: "server", Value: "http://127.0.0.1:7070", EnvVars: []string{"HOST_SERVER"}, Usage: "the node's `URL`"}
}

// tokenFlag is a client command's bearer token.
func tokenFlag() cli.Flag {
	return &cli.StringFlag{Name: "token", EnvVars: []string{"HOST_TOKEN"}, Usage: "bearer `TOKEN` when the node runs with --auth"}
}

// client is the Go client for a command's --server and --token.
func client(c *cli.Context) *hclient.Client {
	return &hclient.Client{Base: c.String("server"), Token: c.String("token")}
}

// nodeFlags configure the node that serve and dev run.
func nodeFlags() []cli.Flag {
	d := host.DefaultConfig()
	return []cli.Flag{
		&cli.StringFlag{Name: "data", Value: "./data", EnvVars: []string{"HOST_DATA"}, Usage: "`DIR` for the node database, programs, object files and the compilation cache"},
		&cli.StringFlag{Name: "listen", Value: d.Listen, EnvVars: []string{"HOST_LISTEN"}, Usage: "HTTP `HOST:PORT`"},
		&cli.StringFlag{Name: "nats-url", EnvVars: []string{"HOST_NATS_URL"}, Usage: "use an existing NATS cluster at `URL` instead of the embedded server"},
		&cli.StringFlag{Name: "nats-listen", EnvVars: []string{"HOST_NATS_LISTEN"}, Usage: "embedded NATS client `HOST:PORT` (default: in process, no port)"},
		&cli.StringFlag{Name: "nats-cluster", EnvVars: []string{"HOST_NATS_CLUSTER"}, Usage: "embedded NATS route `HOST:PORT` of this node, to cluster with peers (port 0: any free port); a peer silent for 8-10 s has its routes closed"},
		&cli.StringFlag{Name: "nats-cluster-name", Value: "host", EnvVars: []string{"HOST_NATS_CLUSTER_NAME"}, Usage: "embedded NATS cluster `NAME`; every peer uses the same, and routes from another name are refused"},
		&cli.StringSliceFlag{Name: "nats-routes", EnvVars: []string{"HOST_NATS_ROUTES"}, Usage: "peers' route `URLS`, nats://HOST:PORT, comma separated"},
		&cli.DurationFlag{Name: "budget", Value: d.VM.Budget, EnvVars: []string{"HOST_BUDGET"}, Usage: "wall-clock budget of one handler call"},
		&cli.UintFlag{Name: "memory-pages", Value: uint(d.VM.MemoryLimitPages), EnvVars: []string{"HOST_MEMORY_PAGES"}, Usage: "most 64 KiB memory pages one instance may use"},
		&cli.IntFlag{Name: "instance-pool", Value: d.VM.PoolSize, EnvVars: []string{"HOST_INSTANCE_POOL"}, Usage: "instances kept made ahead (one per recently activated program, closed after 30s unused) so an object's first call skips the guest's start (about 10 ms and 8 MB for a Go guest); 0: none"},
		&cli.IntFlag{Name: "max-module-bytes", Value: d.VM.MaxModuleSize, EnvVars: []string{"HOST_MAX_MODULE_BYTES"}, Usage: "largest module an upload may be"},
		&cli.IntFlag{Name: "max-active-objects", Value: d.MaxActiveObjects, EnvVars: []string{"HOST_MAX_ACTIVE_OBJECTS"}, Usage: "objects kept active (open file + instance); the least recently used idle one is deactivated past this; also the copy files kept open"},
		&cli.DurationFlag{Name: "stream-idle", Value: d.Streams.Idle, EnvVars: []string{"HOST_SUBSCRIPTION_IDLE_THRESHOLD"}, Usage: "a stream subscription that heard no hint this long publishes one, recovering lost hints (must be positive)"},
		&cli.DurationFlag{Name: "idle-timeout", Value: d.IdleTimeout, EnvVars: []string{"HOST_IDLE_TIMEOUT"}, Usage: "deactivate an object unused this long"},
		&cli.IntFlag{Name: "max-batch", Value: d.MaxBatch, EnvVars: []string{"HOST_MAX_BATCH"}, Usage: "group commit: calls waiting at one object run together in one transaction, each in its own savepoint, and are answered after its one commit; at most `N` per commit (1: a commit per call)"},
		&cli.DurationFlag{Name: "call-record-age", Value: d.CallRecordAge, EnvVars: []string{"HOST_CALL_RECORD_AGE"}, Usage: "how long an object keeps the record of a call made with an idempotency key (an Idempotency-Key header, a call from a receive handler or with a key of its own): a repeat within it gets the recorded reply without the method running again"},
		&cli.IntFlag{Name: "call-records", Value: d.CallRecords, EnvVars: []string{"HOST_CALL_RECORDS"}, Usage: "most idempotency-key records one object keeps (the oldest go first); they count toward its storage"},
		&cli.StringFlag{Name: "sync", Value: "normal", EnvVars: []string{"HOST_SYNC"}, Usage: "SQLite synchronous setting for object files: normal (survives a process crash) or full (also power loss: an fsync per commit, shared by a batch and made while the object runs its next one; nothing is answered or delivered before it)"},
		&cli.DurationFlag{Name: "lease-ttl", Value: d.LeaseTTL, EnvVars: []string{"HOST_LEASE_TTL"}, Usage: "a node that has not renewed its cluster lease for this long is gone for good (its id never returns)"},
		&cli.DurationFlag{Name: "heartbeat", Value: d.Heartbeat, EnvVars: []string{"HOST_HEARTBEAT"}, Usage: "how often a node renews its lease"},
		&cli.IntFlag{Name: "kv-replicas", Value: d.KVReplicas, EnvVars: []string{"HOST_KV_REPLICAS"}, Usage: "replicas of the cluster's JetStream buckets with --nats-url (the embedded cluster picks 3 from 3 nodes up)"},
		&cli.IntFlag{Name: "replicas", Value: d.Replicas, EnvVars: []string{"HOST_REPLICAS"}, Usage: "nodes besides an object's home that keep a copy of its file, so a node can die and lose nothing acknowledged (-1: 2 once the cluster has 3 nodes, 0 on fewer)"},
		&cli.IntFlag{Name: "snapshot-every", Value: d.SnapshotEvery, EnvVars: []string{"HOST_SNAPSHOT_EVERY"}, Usage: "with copies, store a snapshot of an object's file every N change sets it ships and purge its change stream before it (a copy far behind restores the snapshot); negative: never"},
		&cli.StringFlag{Name: "replica-ack", Value: d.ReplicaAck, EnvVars: []string{"HOST_REPLICA_ACK"}, Usage: "with copies, answer a call once its changes are in the replicated change stream (sync), or once committed on the home and shipped right after (async: faster; a crash of the home can lose its last 32 answered change sets per object)"},
		&cli.StringFlag{Name: "fanout", Value: string(d.Delivery.FanOut), EnvVars: []string{"HOST_FANOUT"}, Usage: "how connection events cross nodes: node (one call per node; the product), or the benchmark baselines socket (one send per watcher) and subject (NATS subject per topic)"},
		&cli.BoolFlag{Name: "auth", EnvVars: []string{"HOST_AUTH"}, Usage: "tenancy: every request needs a token; the first start writes the operator token to DATA/admin.token (see host tenant --help)"},
		&cli.StringFlag{Name: "tenant-limits", EnvVars: []string{"HOST_TENANT_LIMITS"}, Usage: "default tenant limits as `JSON` over the built-in ones, e.g. '{\"programs\":20,\"publish_rate\":500}' (see host tenant --help)"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"HOST_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
	}
}

// nodeConfig reads nodeFlags into a validated host.Config, logging to
// stderr.
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
	cfg.VM.PoolSize = c.Int("instance-pool")
	cfg.Streams.Idle = c.Duration("stream-idle")
	cfg.MaxActiveObjects = c.Int("max-active-objects")
	cfg.IdleTimeout = c.Duration("idle-timeout")
	cfg.Sync = store.Sync(strings.ToUpper(c.String("sync")))
	cfg.MaxBatch = c.Int("max-batch")
	cfg.CallRecordAge = c.Duration("call-record-age")
	cfg.CallRecords = c.Int("call-records")
	cfg.LeaseTTL = c.Duration("lease-ttl")
	cfg.Heartbeat = c.Duration("heartbeat")
	cfg.KVReplicas = c.Int("kv-replicas")
	cfg.Replicas = c.Int("replicas")
	cfg.ReplicaAck = c.String("replica-ack")
	cfg.SnapshotEvery = c.Int("snapshot-every")
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

// printJSON prints v indented, for the commands that show a JSON reply.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
