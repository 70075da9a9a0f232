package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSConfig says how a node reaches NATS: an embedded server (the default,
// in process with no TCP port unless Listen or Cluster is set), or an
// existing cluster at URL.
type NATSConfig struct {
	// URL joins an existing NATS cluster instead of embedding a server.
	URL string
	// Listen is the embedded server's client address (HOST:PORT); empty
	// means in-process only, unless clustering needs a port.
	Listen string
	// Cluster is the embedded server's route address (HOST:PORT).
	Cluster string
	// Routes are the peers' route URLs (nats://HOST:PORT).
	Routes []string
	// ClusterName names the embedded cluster; every peer must use the same
	// one, and a route from a server with another name is refused, so two
	// clusters on one network never merge by a stray route. Default "host".
	ClusterName string
}

type natsConn struct {
	srv *server.Server // nil with an external URL
	nc  *nats.Conn
	// clustered: the embedded server routes to peers (--nats-cluster).
	clustered bool
}

func hostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return h, port, err
}

// A route to a peer is closed once routePingsOut pings sent every
// routePing went unanswered: 8-10 s, under the default lease TTL (15 s),
// so a paused node's routes are gone before its objects are taken over.
const (
	routePing     = 2 * time.Second
	routePingsOut = 4
)

func startNATS(cfg NATSConfig, storeDir string, log *slog.Logger) (*natsConn, error) {
	if cfg.URL != "" {
		nc, err := nats.Connect(cfg.URL, nats.Name("host"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
		}
		return &natsConn{nc: nc}, nil
	}
	opts := &server.Options{
		ServerName: "host",
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		NoLog:      true,
		// Calls forward payloads up to the node's limit plus headers.
		MaxPayload: 8 << 20,
	}
	switch {
	case cfg.Listen != "":
		h, p, err := hostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen %q: %w", cfg.Listen, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Host, opts.Port = h, p
	case cfg.Cluster != "":
		// A clustered server only starts routing once its client listener
		// is up, so it needs one: loopback, any port.
		opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	default:
		opts.DontListen = true
	}
	if cfg.Cluster != "" {
		h, p, err := hostPort(cfg.Cluster)
		if err != nil {
			return nil, fmt.Errorf("nats cluster %q: %w", cfg.Cluster, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Cluster.Name = cmp.Or(cfg.ClusterName, "host")
		opts.Cluster.Host, opts.Cluster.Port = h, p
		// A peer that stops answering (a frozen process keeps its sockets
		// open) has its routes closed after routePingsOut pings: until
		// then its subscriptions stay in this server's interest, and
		// requests sent to them (a KV read any replica may answer, a
		// call) wait for nothing. NATS's default, up to 30 s a ping and 2
		// out, held a paused node's routes for a minute and more, well
		// past its lease.
		opts.Cluster.PingInterval, opts.Cluster.MaxPingsOut = routePing, routePingsOut
		opts.ServerName = "host-" + net.JoinHostPort(h, strconv.Itoa(p))
		for _, r := range cfg.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("nats route %q: %w", r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	} else if len(cfg.Routes) > 0 {
		return nil, errors.New("--nats-routes needs --nats-cluster (this node's route address)")
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	// The server reports why it cannot start (a port in use) only to its
	// logger: keep its fatal errors, answer with the first at once, and
	// pass the rest to the node's log at debug level.
	nl := &natsLog{log: log, fatal: make(chan string, 1)}
	srv.SetLoggerV2(nl, false, false, false)
	go srv.Start()
	ready := make(chan bool, 1)
	go func() { ready <- srv.ReadyForConnections(10 * time.Second) }()
	select {
	case ok := <-ready:
		if !ok {
			srv.Shutdown()
			return nil, errors.New("embedded NATS server did not start within 10s")
		}
	case msg := <-nl.fatal:
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server: %s", msg)
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("host"))
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	nl.started.Store(true)
	log.Debug("embedded NATS started", slog.String("client", srv.ClientURL()))
	return &natsConn{srv: srv, nc: nc, clustered: cfg.Cluster != ""}, nil
}

// handOff asks JetStream to move the leadership of every stream this
// embedded server leads (the change stream, the buckets) to a peer, and
// waits up to wait for each to move: a graceful shutdown then costs the
// cluster no leader election, and writes go on within a second instead of
// waiting out an election's 4-9 s.
func (c *natsConn) handOff(ctx context.Context, log *slog.Logger, wait time.Duration) {
	if c.srv == nil || c.nc == nil || !c.reachesPeers() {
		return // no peer to hand anything to (the last of a cluster)
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	self := c.srv.Name()
	var led []string
	for info := range js.ListStreams(ctx).Info() {
		if info.Cluster != nil && info.Cluster.Leader == self && len(info.Cluster.Replicas) > 0 {
			led = append(led, info.Config.Name)
		}
	}
	for _, name := range led {
		if _, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+name, nil); err != nil {
			log.Debug("hand off stream leadership", slog.String("stream", name), slog.Any("err", err))
		}
	}
	// A stream without a leader does not answer its info request: each
	// ask gets a short deadline of its own, so the wait ends soon after
	// the election instead of at the hand-off's deadline.
	newLeader := func(name string) bool {
		ctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		defer cancel()
		st, err := js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != self
	}
	for _, name := range led {
		for ctx.Err() == nil && !newLeader(name) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(led) > 0 {
		log.Info("handed off stream leadership", slog.Int("streams", len(led)))
	}
}

// reachesPeers says whether a write that needs the cluster's quorum can
// still be made: always through an external server or on a single node,
// and on an embedded cluster while a route to a peer is up.
func (c *natsConn) reachesPeers() bool {
	if c == nil {
		return false
	}
	if c.srv == nil || !c.clustered {
		return true
	}
	return c.srv.NumRoutes() > 0
}

func (c *natsConn) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.srv != nil {
		c.srv.Shutdown()
		c.srv.WaitForShutdown()
	}
}

// natsLog is the embedded server's logger: fatal errors while it starts
// (it cannot listen, JetStream cannot start) are kept for startNATS to
// return, later ones are logged; the rest go to the node's log at debug
// level, where a route that keeps failing can be seen.
type natsLog struct {
	log     *slog.Logger
	fatal   chan string
	started atomic.Bool // startNATS returned: fatal errors are logged
}

func (l *natsLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !l.started.Load() {
		select {
		case l.fatal <- msg: // startNATS returns it
			return
		default:
		}
	}
	l.log.Error("embedded NATS", slog.String("fatal", msg))
}

func (l *natsLog) Errorf(format string, v ...any) {
	l.log.Debug("embedded NATS", slog.String("error", fmt.Sprintf(format, v...)))
}

func (l *natsLog) Warnf(format string, v ...any) {
	l.log.Debug("embedded NATS", slog.String("warning", fmt.Sprintf(format, v...)))
}

func (l *natsLog) Noticef(string, ...any) {}
func (l *natsLog) Debugf(string, ...any)  {}
func (l *natsLog) Tracef(string, ...any)  {}
