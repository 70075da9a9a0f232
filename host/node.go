// Package host is the node: its wiring (it builds the parts and connects
// them), programs, object activation, WebSocket connections and their
// registry, stream subscriptions, inter-node calls and the embedded NATS
// server. It wires the vm (running guests) to delivery (the pump, fan-out,
// streams) and store (object files), and serves the HTTP API (package
// api) as its Backend.
//
// It does not run guests itself (vm does), define what is in an object's
// file (store does), route, decode or encode HTTP requests (api does),
// decide membership and placement (cluster does) nor who may do what and
// how much (tenancy does).
package host

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// Config configures a node. Start from DefaultConfig.
type Config struct {
	// DataDir holds the node database, programs, object files and the
	// compilation cache.
	DataDir string
	// Listen is the HTTP address.
	Listen string
	// VM configures the engine; its CacheDir defaults to DataDir/cache.
	VM vm.Config
	// Sync is SQLite's synchronous setting for object files.
	Sync store.Sync
	// MaxActiveObjects bounds the objects with an open file and an
	// instance; the least recently used idle one is deactivated past it.
	// It also bounds the copy files kept open to apply change sets to.
	MaxActiveObjects int
	// IdleTimeout deactivates an object unused this long.
	IdleTimeout time.Duration
	// MaxPayload bounds a method call's request body.
	MaxPayload int
	// MaxBatch bounds the calls one commit covers: calls queued at an
	// object run back to back in one transaction, each in its own
	// savepoint, and are answered after its commit (1: a commit per call).
	MaxBatch int
	// Delivery configures the pump: inbox size, inline limit, retries.
	Delivery delivery.Config
	// Streams configures stream subscriptions: the idle threshold, read
	// batch bounds, listener retry backoff.
	Streams delivery.StreamConfig
	// NATS configures the embedded server or an external cluster.
	NATS NATSConfig
	// Demo serves the chat demo page at / (host dev turns it on).
	Demo bool
	// LeaseTTL: a node that has not renewed its lease for this long is
	// gone for good. Heartbeat renews it.
	LeaseTTL  time.Duration
	Heartbeat time.Duration
	// KVReplicas is the replication of the cluster's JetStream buckets when
	// using an external NATS (--nats-url); the embedded cluster derives it.
	KVReplicas int
	// Replicas is how many nodes besides an object's home keep a copy of
	// its file, applied from its change stream; ReplicasAuto (the default)
	// means 2 once the cluster has three NATS servers, 0 on fewer. With
	// copies, an object whose home dies is taken over with every
	// acknowledged write.
	Replicas int
	// ReplicaAck is when a call is answered with copies on: ReplicaSync
	// (the default) once its changes are in the replicated change stream;
	// ReplicaAsync once they are committed on the home, shipped right
	// after: a crash of the home can lose up to AsyncWindow change sets
	// of an object that were answered. Followers and stream readers never
	// see an event before it is shipped, in either mode.
	ReplicaAck string
	// SnapshotEvery is how many change sets a home ships between
	// snapshots of an object's file (which bound its change stream: the
	// change sets before a snapshot are purged); negative: never.
	SnapshotEvery int
	// Auth turns tenancy on: every request needs a token, programs and
	// objects are namespaced by tenant, and tenant limits apply. The first
	// start writes the operator token to DATA/admin.token.
	Auth bool
	// CallRecordAge is how long an object keeps the record of a call
	// made with an idempotency key (a client's Idempotency-Key, an
	// object's call from a receive handler or with its own key): a repeat
	// within it gets the recorded reply, a later one runs again.
	CallRecordAge time.Duration
	// CallRecords bounds the records one object keeps; the oldest go
	// first. They count toward the object's storage.
	CallRecords int
	// TenantLimits are the limits of a tenant whose record does not set its
	// own.
	TenantLimits Limits
	// Logger is the node's logger.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultListen           = "127.0.0.1:7070"
	DefaultDataDir          = "data"
	DefaultMaxActiveObjects = 512
	DefaultIdleTimeout      = 2 * time.Minute
	DefaultMaxPayload       = 1 << 20
	DefaultMaxBatch         = 64
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		DataDir:          DefaultDataDir,
		Listen:           DefaultListen,
		VM:               vm.DefaultConfig(),
		Sync:             store.SyncNormal,
		MaxActiveObjects: DefaultMaxActiveObjects,
		IdleTimeout:      DefaultIdleTimeout,
		MaxPayload:       DefaultMaxPayload,
		MaxBatch:         DefaultMaxBatch,
		Delivery:         delivery.DefaultConfig(),
		Streams:          delivery.DefaultStreamConfig(),
		LeaseTTL:         DefaultLeaseTTL,
		Heartbeat:        DefaultHeartbeat,
		KVReplicas:       1,
		Replicas:         ReplicasAuto,
		ReplicaAck:       ReplicaSync,
		SnapshotEvery:    DefaultSnapshotEvery,
		CallRecordAge:    DefaultCallRecordAge,
		CallRecords:      DefaultCallRecords,
		TenantLimits:     DefaultTenantLimits(),
		Logger:           slog.Default(),
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data directory must be set"))
	}
	if c.MaxActiveObjects < 1 {
		errs = append(errs, errors.New("max active objects must be at least 1"))
	}
	if c.IdleTimeout <= 0 {
		errs = append(errs, errors.New("idle timeout must be positive"))
	}
	if c.Heartbeat <= 0 || c.LeaseTTL < 2*c.Heartbeat {
		errs = append(errs, errors.New("lease TTL must be at least two heartbeats"))
	}
	if c.MaxPayload < 1 {
		errs = append(errs, errors.New("max payload must be positive"))
	}
	if c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("max batch must be at least 1 (1: a commit per call), not %d", c.MaxBatch))
	}
	if c.CallRecordAge <= 0 {
		errs = append(errs, fmt.Errorf("call record age must be positive, not %v", c.CallRecordAge))
	}
	if c.CallRecords < 1 {
		errs = append(errs, fmt.Errorf("call records must be at least 1, not %d", c.CallRecords))
	}
	if c.Replicas < ReplicasAuto {
		errs = append(errs, fmt.Errorf("replicas must be 0 or more (or %d for the default), not %d", ReplicasAuto, c.Replicas))
	}
	if c.ReplicaAck != ReplicaSync && c.ReplicaAck != ReplicaAsync {
		errs = append(errs, fmt.Errorf("replica ack must be %q (a call is answered once its changes are in the replicated change stream) or %q (once committed on the home; a crash of the home can lose up to %d change sets of an object), not %q", ReplicaSync, ReplicaAsync, AsyncWindow, c.ReplicaAck))
	}
	if c.Sync != store.SyncNormal && c.Sync != store.SyncFull {
		errs = append(errs, fmt.Errorf("sync must be NORMAL or FULL, not %q", c.Sync))
	}
	if err := c.VM.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.TenantLimits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Delivery.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Streams.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Errors the API maps to statuses (api.Status). ErrBadRequest, ErrTooLarge
// and ErrUnavailable are abi's values, shared with the vm and the cluster:
// a failure a guest sees as a status and the same failure over HTTP need no
// translating between the two. ErrUnauthorized, ErrForbidden, ErrNotFound
// and ErrConflict are tenancy's, where they arise; ErrUnknownProgram and
// ErrUnknownObject are names'. ErrShuttingDown, the node's own, states its
// status (503) itself.
var (
	ErrBadRequest     = abi.ErrBadRequest
	ErrUnknownProgram = names.ErrUnknownProgram
	ErrUnknownObject  = names.ErrUnknownObject
	ErrTooLarge       = abi.ErrTooLarge
	ErrUnavailable    = abi.ErrUnavailable
	ErrNotFound       = tenancy.ErrNotFound
	ErrConflict       = tenancy.ErrConflict
	// ErrUnauthorized: no token, or a token nobody holds.
	ErrUnauthorized = tenancy.ErrUnauthorized
	// ErrForbidden: a valid token that may not do this.
	ErrForbidden = tenancy.ErrForbidden
)

// ErrShuttingDown: the node is stopping.
var ErrShuttingDown error = &statusError{msg: "node is shutting down", status: http.StatusServiceUnavailable}

// statusError is a sentinel of the node's that says its HTTP status
// (api.StatusError): no package below the API defines it.
type statusError struct {
	msg    string
	status int
}

func (e *statusError) Error() string   { return e.msg }
func (e *statusError) HTTPStatus() int { return e.status }

// Node is one `host serve` process.
type Node struct {
	cfg      Config
	id       string
	started  time.Time
	log      *slog.Logger
	db       *sql.DB
	engine   *vm.Engine
	programs *programs
	shaper   *shaper
	tenants  *tenancy.Registry // nil without Auth
	usage    *tenancy.Usage    // nil without Auth
	objects  *objects
	nats     *natsConn
	cluster  *cluster.Cluster
	replicas *replicas // nil without copies
	alarms   *alarmTimers
	streams  *streams
	metrics  *metrics
	dcfg     delivery.Config
	pump     *delivery.Pump
	conns    *conns
	subs     []*nats.Subscription
	// pumps counts running pump goroutines, waited for at shutdown;
	// pumpMu guards adding to it against stopping.
	pumps    sync.WaitGroup
	pumpMu   sync.Mutex
	stopping bool
	rpcs     sync.WaitGroup // inter-node requests being served

	httpSrv *http.Server
	ln      net.Listener

	stop     chan struct{}
	lost     chan struct{} // closed when the lease is lost
	lostOnce sync.Once
	wg       sync.WaitGroup
	shutOnce sync.Once
	cancelBg context.CancelFunc
	// alarmSlots bounds the alarm runs at once (maxAlarmRuns);
	// alarmsRunning counts them.
	alarmSlots    chan struct{}
	alarmsRunning gauge
	// upgrades queue the programs whose active objects move onto a new
	// version (upgrade.go).
	upgrades  upgrades
	bgContext context.Context
}

// New opens the node's storage, starts its engine and NATS, binds its HTTP
// address and joins the cluster under a fresh id. Start serves.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	if cfg.VM.CacheDir == "" {
		cfg.VM.CacheDir = filepath.Join(cfg.DataDir, "cache")
	}
	cfg.VM.Logger = cfg.Logger
	n := &Node{cfg: cfg, id: newNodeID(), started: time.Now().UTC(), stop: make(chan struct{}), lost: make(chan struct{})}
	n.bgContext, n.cancelBg = context.WithCancel(context.Background())
	n.upgrades.wake = make(chan struct{}, 1)
	n.log = cfg.Logger.With(slog.String("node", n.id))
	n.metrics = newMetrics()
	n.metrics.log = n.log
	n.streams = newStreams()
	n.dcfg = cfg.Delivery
	n.alarms = newAlarmTimers(cfg.Delivery.Clock, n.fireAlarm)
	n.alarmSlots = make(chan struct{}, maxAlarmRuns)
	n.metrics.alarmCounters(n.alarms.pending)
	if err := n.open(ctx); err != nil {
		n.closeParts(context.Background())
		return nil, err
	}
	return n, nil
}

func (n *Node) open(ctx context.Context) error {
	cfg := n.cfg
	var err error
	if n.db, err = sql.Open("sqlite", "file:"+filepath.Join(cfg.DataDir, "node.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"); err != nil {
		return err
	}
	n.db.SetMaxOpenConns(1)
	if _, err = n.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS publishers (object TEXT PRIMARY KEY)`); err != nil {
		return fmt.Errorf("node database: %w", err)
	}
	if n.engine, err = vm.New(ctx, cfg.VM); err != nil {
		return err
	}
	n.metrics.engineCounters(n.engine)
	if n.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if n.nats, err = startNATS(cfg.NATS, filepath.Join(cfg.DataDir, "nats"), n.log); err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	// NATS restores listeners after a reconnect; hints sent meanwhile are
	// lost, so each subscription pings to drain what it missed.
	n.nats.nc.SetReconnectHandler(func(*nats.Conn) { n.streams.reconnected() })
	js, replicas, err := n.jetStream()
	if err != nil {
		return err
	}
	copies := cfg.Replicas
	if copies == ReplicasAuto {
		copies = copiesFor(len(cfg.NATS.Routes) + 1)
		if cfg.NATS.URL != "" {
			copies = copiesFor(cfg.KVReplicas)
		}
	}
	if n.cluster, err = n.newCluster(js, replicas, copies > 0); err != nil {
		return err
	}
	if copies > 0 {
		if n.replicas, err = n.newReplicas(ctx, js, replicas, copies); err != nil {
			return err
		}
	}
	// Every bucket at once: in a new cluster each replicated stream elects
	// its own leader, and one after the other those elections were most of
	// the start time.
	var wg sync.WaitGroup
	var clusterErr, programsErr, tenantsErr error
	wg.Go(func() { clusterErr = n.cluster.Open(ctx) })
	wg.Go(func() {
		n.programs, programsErr = openPrograms(ctx, n.log, cfg.DataDir, js, replicas, n.engine)
		if programsErr != nil {
			programsErr = fmt.Errorf("programs: %w", programsErr)
		} else {
			n.programs.changed = n.programChanged
		}
	})
	if cfg.Auth {
		wg.Go(func() { n.tenants, tenantsErr = tenancy.OpenRegistry(ctx, n.log, js, replicas) })
	}
	wg.Wait()
	if err := errors.Join(clusterErr, programsErr, tenantsErr); err != nil {
		return err
	}
	if cfg.Auth {
		n.usage = tenancy.NewUsage(cfg.TenantLimits, n.tenants.Limits)
	}
	// Under --sync full with group commit, a home's file commits without
	// an fsync and its object's output gate makes the commits durable
	// before anything they did is seen (syncGate).
	gated := cfg.Sync == store.SyncFull && cfg.MaxBatch > 1
	homeSync := cfg.Sync
	if gated {
		homeSync = store.SyncNormal
	}
	openFile := func(ctx context.Context, _ ObjectID, path string) (*store.File, error) {
		return store.Open(ctx, path, homeSync)
	}
	if r := n.replicas; r != nil {
		openFile = func(ctx context.Context, id ObjectID, path string) (*store.File, error) {
			return r.openHome(ctx, id, path, homeSync)
		}
	}
	n.objects = newObjects(&objectEnv{
		dataDir: cfg.DataDir, openFile: openFile, programs: n.programs, engine: n.engine,
		usage: n.usage, metrics: n.metrics, log: n.log,
		hint: n.hintCommitted, kick: n.kick, follows: n, maxBatch: cfg.MaxBatch, gated: gated, batchTime: maxBatchTime, batchedCall: maxBatchedCall,
		now: cfg.Delivery.Clock.Now, alarmFileChanged: n.alarmFileChanged, alarmRetry: n.alarms.schedule,
		call: n.call, budget: cfg.VM.Budget, callRecordAge: cfg.CallRecordAge, callRecords: cfg.CallRecords,
	}, cfg.MaxActiveObjects, cfg.IdleTimeout)
	n.shaper = newShaper(n.programs, n.engine, n.usage, n.metrics, n.log)
	var topics *topicSubs // the subject fan-out baseline only
	if cfg.Delivery.FanOut == delivery.FanOutSubject {
		topics = newTopicSubs(n.nats.nc)
	}
	edgeCopies := delivery.NewEdgeCopies(cfg.Delivery.EdgeCopies, cfg.Delivery.EdgeCopyIdle, cfg.Delivery.Clock)
	n.conns = newConns(n.bgContext, n, n.shaper, topics, edgeCopies, n.log)
	n.metrics.connectionCounters(n.conns)
	// The pump exists before the cluster starts: a node gone from then on
	// (a takeover) kicks pumps, even while the rest of this starts.
	n.pump = delivery.NewPump(cfg.Delivery, remoteTransport{n}, clusterMembership{n.cluster}, n.metrics, n.log)
	if err := n.cluster.Start(ctx); err != nil {
		return err
	}
	if n.replicas != nil {
		if err := n.replicas.start(n.bgContext, js); err != nil {
			return err
		}
	}
	if cfg.Auth {
		path, created, err := n.tenants.EnsureOperator(ctx, cfg.DataDir)
		if err != nil {
			return err
		}
		if created {
			n.log.Info("tenancy is on: wrote the operator token; create tenants with `host tenant create NAME --token \"$(cat "+path+")\"`", slog.String("path", path))
		} else {
			n.log.Info("tenancy is on", slog.String("operator_token", path))
		}
		scanUsage(cfg.DataDir, n.usage)
	}
	return n.subscribe()
}

// newNodeID returns a fresh random id; ids are never reused.
func newNodeID() string {
	var b [6]byte
	rand.Read(b[:])
	return "n-" + hex.EncodeToString(b[:])
}

// DataDir returns the node's data directory.
func (n *Node) DataDir() string { return n.cfg.DataDir }

// ID returns the node's id.
func (n *Node) ID() string { return n.id }

// LeaseLost is closed when the node lost its cluster lease: it has shut
// down and must be started again, under a new id.
func (n *Node) LeaseLost() <-chan struct{} { return n.lost }

// The node is the HTTP API's backend.
var _ api.Backend = (*Node)(nil)

// Handler returns the node's HTTP API.
func (n *Node) Handler() http.Handler {
	return api.New(n, api.Config{
		Tenants: n.tenants, Usage: n.usage, TenantLimits: n.cfg.TenantLimits,
		MaxModuleSize: n.cfg.VM.MaxModuleSize, MaxPayload: n.cfg.MaxPayload, Budget: n.cfg.VM.Budget,
		Metrics: n.metrics.handler(), Demo: n.cfg.Demo,
	})
}

// Start serves the API until Shutdown.
func (n *Node) Start() error {
	n.httpSrv = &http.Server{Handler: n.Handler(), ReadHeaderTimeout: 10 * time.Second}
	// Streams never end on their own: a graceful shutdown ends them first,
	// or it would wait for them.
	n.httpSrv.RegisterOnShutdown(n.streams.end)
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		if err := n.httpSrv.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", slog.Any("err", err))
		}
	}()
	go func() {
		defer n.wg.Done()
		n.reaper()
	}()
	go func() {
		defer n.wg.Done()
		n.programs.watch(n.bgContext)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.runUpgrades(n.bgContext)
	}()
	if n.tenants != nil {
		n.wg.Add(2)
		go func() {
			defer n.wg.Done()
			n.tenants.Watch(n.bgContext)
		}()
		go func() {
			defer n.wg.Done()
			t := time.NewTicker(usageScanEvery)
			defer t.Stop()
			for {
				select {
				case <-n.bgContext.Done():
					return
				case <-t.C:
					scanUsage(n.cfg.DataDir, n.usage)
				}
			}
		}()
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.cluster.Reclaim(n.bgContext)
		// Files of objects taken over while this data directory was away
		// (or under an earlier id of this process) are not homes here.
		for _, id := range objectFiles(filepath.Join(n.cfg.DataDir, "objects")) {
			if n.bgContext.Err() != nil {
				return
			}
			n.retire(id)
		}
		n.scheduleStoredAlarms(n.bgContext)
		if err := n.resumePublishers(n.bgContext); err != nil {
			n.log.Warn("resume deliveries", slog.Any("err", err))
		}
	}()
	n.log.Info("node started", slog.String("http", n.URL()), slog.String("data", n.cfg.DataDir))
	return nil
}

// Addr returns the HTTP listen address.
func (n *Node) Addr() string { return n.ln.Addr().String() }

// URL returns the node's base URL.
func (n *Node) URL() string { return "http://" + n.Addr() }

func (n *Node) advertisedURL() string { return n.URL() }

// leaseLost shuts the node down: its id is gone for good.
func (n *Node) leaseLost() {
	n.lostOnce.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			n.Shutdown(ctx)
			close(n.lost)
		}()
	})
}

func (n *Node) reaper() {
	tick := min(n.cfg.IdleTimeout/4, 30*time.Second)
	t := time.NewTicker(max(tick, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			if k := n.objects.reapIdle(now); k > 0 {
				n.log.Debug("deactivated idle objects", slog.Int("count", k))
			}
		}
	}
}

// Shutdown stops accepting requests, lets running calls finish (until ctx
// ends), then leaves the cluster and closes every object, the engine and
// NATS.
func (n *Node) Shutdown(ctx context.Context) error {
	var err error
	n.shutOnce.Do(func() {
		if n.httpSrv != nil {
			err = n.httpSrv.Shutdown(ctx)
		}
		close(n.stop)
		for _, s := range n.subs {
			s.Unsubscribe()
		}
		n.rpcs.Wait()
		n.conns.closeAll()
		if n.replicas != nil {
			// Async acknowledgement: what this node answered is shipped
			// before its objects can be taken over.
			n.replicas.drain(ctx)
		}
		if n.replicas != nil && n.nats != nil {
			// Copies elsewhere take this node's objects over as soon as
			// its lease is gone; hand the streams' leadership off first so
			// they can write at once.
			n.nats.handOff(ctx, n.log, 3*time.Second)
		}
		if n.cluster != nil {
			n.cluster.Close(n.nats.reachesPeers())
		}
		n.alarms.close()
		n.cancelBg()
		n.wg.Wait()
		n.pumpMu.Lock()
		n.stopping = true
		n.pumpMu.Unlock()
		n.pumps.Wait()
		n.closeParts(ctx)
		n.log.Info("node stopped")
	})
	return err
}

func (n *Node) closeParts(ctx context.Context) {
	if n.objects != nil {
		n.objects.closeAll()
	}
	if n.replicas != nil {
		n.replicas.stop()
	}
	if n.shaper != nil {
		n.shaper.close()
	}
	if n.programs != nil {
		n.programs.close(ctx)
	}
	if n.engine != nil {
		n.engine.Close(ctx)
	}
	if n.nats != nil {
		n.nats.close()
	}
	if n.ln != nil && n.httpSrv == nil {
		n.ln.Close()
	}
	if n.db != nil {
		n.db.Close()
	}
}

// Rollback makes the module of version to of name (0: the version before
// the newest) current again, as a new version; objects move onto it at
// their next call boundary, as after an upload.
func (n *Node) Rollback(ctx context.Context, name string, to int) (client.Program, error) {
	pr, err := n.programs.rollback(ctx, name, to)
	if err == nil {
		n.announce(ctx, pr)
	}
	return pr, err
}

// Upload validates wasm and stores it as the next version of name; created
// is false when the bytes equal the latest version.
func (n *Node) Upload(ctx context.Context, name string, wasm []byte) (client.Program, bool, error) {
	pr, created, err := n.programs.upload(ctx, name, wasm)
	if err == nil && created {
		n.announce(ctx, pr)
	}
	return pr, created, err
}

// Programs lists the latest version of each program, or every version of
// name.
func (n *Node) Programs(ctx context.Context, name string) ([]client.Program, error) {
	if name != "" {
		if _, err := n.programs.latest(ctx, name); err != nil {
			return nil, err
		}
	}
	return n.programs.list(ctx, name)
}

// ListPrograms lists the latest version of every program keep accepts.
func (n *Node) ListPrograms(ctx context.Context, keep func(name string) bool) ([]client.Program, error) {
	return n.programs.listIn(ctx, "", keep)
}

// ProgramNames lists the name of every program keep accepts.
func (n *Node) ProgramNames(ctx context.Context, keep func(name string) bool) ([]string, error) {
	return n.programs.names(ctx, keep)
}

// Program returns the latest version of the program name, or
// ErrUnknownProgram.
func (n *Node) Program(ctx context.Context, name string) (client.Program, error) {
	return n.programs.latest(ctx, name)
}

// Call runs method on the object with payload and returns its reply. Calls
// to one object run one at a time, in arrival order; calls to different
// objects run in parallel. A call reaching a node that is not the object's
// home is forwarded there.
func (n *Node) Call(ctx context.Context, id ObjectID, method string, payload []byte) ([]byte, error) {
	return n.call(ctx, id, callRequest{Method: method, Payload: payload})
}

// call runs req on id's home, a client's call or an object's.
func (n *Node) call(ctx context.Context, id ObjectID, req callRequest) ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if len(req.Payload) > n.cfg.MaxPayload {
		return nil, fmt.Errorf("%w: payload is %d bytes, the limit is %d", ErrTooLarge, len(req.Payload), n.cfg.MaxPayload)
	}
	// The method crosses to another node in a header, where a line break
	// would end it (a guest's method name, or a client's %0A).
	if strings.ContainsFunc(req.Method, unicode.IsControl) {
		return nil, fmt.Errorf("%w: method name %q has a control character", ErrBadRequest, names.Clip(req.Method))
	}
	if _, err := n.programs.latest(ctx, id.Program); err != nil {
		return nil, err
	}
	return opCall.onHome(ctx, n, id, req)
}

// opCall runs a method call on the object's home.
var opCall = objectOp("call", 0, (*Node).callLocal)

// callRequest is a call as it crosses to the home: the payload is the
// body as is, the rest headers.
type callRequest struct {
	Method  string
	Payload []byte
	// Key is the idempotency key as the callee records it, scoped by who
	// gave it ("http:K", "call:OBJECT:..."); "" for none.
	Key string
	// Chain lists the objects waiting for this call, the first caller
	// first; empty for a client's call.
	Chain []string
}

// callLocal runs a call on this node, the object's home.
func (n *Node) callLocal(ctx context.Context, id ObjectID, req callRequest) ([]byte, error) {
	if !n.cluster.LeaseValid() {
		return nil, fmt.Errorf("%w: this node's lease is not current", ErrUnavailable)
	}
	if len(req.Chain) > 0 {
		// An object's call: the callee runs on its caller's tenant slot
		// (a chain holds one, or a tenant at its limit would wait for
		// itself) and no longer than its caller waits, the request's
		// deadline.
		ctx = tenancy.HoldingSlot(context.WithValue(ctx, chainKey{}, req.Chain), tenancy.TenantOf(id.Program))
	}
	o, err := n.objects.acquire(id)
	if err != nil {
		return nil, err
	}
	defer n.objects.release(o)
	reply, err := o.submit(ctx, &req)
	if errors.Is(err, errDeactivated) {
		err = ErrShuttingDown
	}
	// A reply leaves only while the lease holds. A call that read the
	// object and changed nothing shipped nothing (nothing fenced it), and
	// it may have waited in the queue while the lease ran out and a
	// successor took the object over: answering then could show a value
	// older than one the successor has acknowledged.
	if err == nil && !n.cluster.LeaseValid() {
		return nil, fmt.Errorf("%w: this node's lease ran out before the reply was sent; the call may have been applied", ErrUnavailable)
	}
	if err == nil {
		api.SetServedBy(ctx, n.id)
	}
	return reply, err
}

// ActiveObjects reports how many objects are active.
func (n *Node) ActiveObjects() int { return n.objects.count() }
