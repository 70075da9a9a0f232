package host

import (
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/replica"
	"github.com/durable-host/host/store"
	"github.com/durable-host/host/vm"
)

// metrics are the node's Prometheus metrics, on their own registry so tests
// can run several nodes in one process.
type metrics struct {
	reg               *prometheus.Registry
	callsOK, callsErr prometheus.Counter
	callSecs          prometheus.Histogram
	batchCalls        prometheus.Histogram

	deliveries   *prometheus.CounterVec // kind, path
	deliveredEvs *prometheus.CounterVec // kind, path
	pruned       *prometheus.CounterVec // reason
	retries      prometheus.Counter
	dropped      prometheus.Counter
	received     prometheus.Counter
	callRepeats  prometheus.Counter
	streamEvents prometheus.Counter
	materialized prometheus.Counter
	readPath     *prometheus.CounterVec // tier
	followHooks  prometheus.Counter
	eventCalls   prometheus.Counter
	conns        prometheus.Gauge
	remoteCalls  *prometheus.CounterVec // op
	remoteBytes  *prometheus.CounterVec // op
	// batchEventBytes and batchEdgeBytes split the remote connection
	// batches' bytes; wholeSets counts those carrying a whole edge set.
	batchEventBytes, batchEdgeBytes prometheus.Counter
	wholeSets                       prometheus.Counter
	alarms                          *prometheus.CounterVec // result
	alarmDelay                      prometheus.Histogram
	// alarmDelays, when set (tests, benchmarks), gets each first run's
	// delay past its time too.
	alarmDelays atomic.Pointer[func(time.Duration)]

	log *slog.Logger
}

var _ delivery.Observer = (*metrics)(nil)

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), log: slog.Default()}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_calls_total", Help: "Method calls by result (ok or error).",
	}, []string{"result"})
	m.callsOK, m.callsErr = calls.WithLabelValues("ok"), calls.WithLabelValues("error")
	m.callSecs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "host_call_seconds", Help: "Method call latency, handler and transaction.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
	})
	m.batchCalls = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "host_commit_calls", Help: "Method calls one commit covered (group commit: calls waiting at an object run together, bounded by --max-batch).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 8),
	})
	m.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_delivery_calls_total", Help: "Deliveries sent by the pump: kind (connection_batch or object) and path (local or remote). A connection batch is one call per node.",
	}, []string{"kind", "path"})
	m.deliveredEvs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_delivery_events_total", Help: "Events carried by deliveries (once per batch, not per socket).",
	}, []string{"kind", "path"})
	m.pruned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_edges_pruned_total", Help: "Connection edges pruned, by reason.",
	}, []string{"reason"})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_delivery_retries_total", Help: "Failed durable deliveries scheduled for retry."})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_edges_dropped_total", Help: "Object edges dropped after the last failed attempt."})
	m.received = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_receive_commits_total", Help: "Receive handlers committed on followers."})
	m.callRepeats = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_call_repeats_total", Help: "Calls answered from an idempotency key's record instead of running the method again."})
	m.materialized = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_ranges_materialized_total", Help: "Ranged deliveries read through the read path."})
	m.readPath = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_read_path_total", Help: "Ranged deliveries by the read path's tier that served them: own (this node's file or copy), holder (the publisher's home), shipped (the change stream).",
	}, []string{"tier"})
	m.followHooks = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_follow_hooks_total", Help: "Follow hook runs (edge creations asked)."})
	m.eventCalls = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_event_handler_calls_total", Help: "Connection events shaped by a program's event export (VM runs)."})
	m.streamEvents = prometheus.NewCounter(prometheus.CounterOpts{Name: "host_stream_events_total", Help: "Events sent to stream subscribers (each read from storage)."})
	m.conns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "host_connections", Help: "Open WebSocket connections."})
	m.remoteCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_internode_calls_total", Help: "Inter-node requests sent, by kind (conns = a connection batch, deliver = an object delivery, call, follow, range ...).",
	}, []string{"kind"})
	m.remoteBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_internode_bytes_total", Help: "Bytes of inter-node requests sent, by kind.",
	}, []string{"kind"})
	batchBytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_connection_batch_bytes_total", Help: "Bytes of remote connection batches sent, by part: events (the publisher and the events, once per node) or edges (the node's edge set: its version, or the edges added and removed since, or the whole set).",
	}, []string{"part"})
	m.batchEventBytes, m.batchEdgeBytes = batchBytes.WithLabelValues("events"), batchBytes.WithLabelValues("edges")
	m.wholeSets = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "host_connection_batch_whole_sets_total", Help: "Remote connection batches that carried a node's whole edge set (unversioned, first to that node, or after it answered that it did not hold the base version).",
	})
	m.alarms = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_alarms_total", Help: "Alarm runs by result: ok (the handler committed), retry (it failed and runs again after the backoff), dropped (it failed its last attempt), postponed (its file would not open or take the failed attempt: it runs again after the longest backoff).",
	}, []string{"result"})
	m.alarmDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "host_alarm_delay_seconds", Help: "How late an alarm's handler started past the alarm's time, on its first attempt (retries wait their backoff on purpose).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	m.reg.MustRegister(m.remoteCalls, m.remoteBytes, batchBytes, m.wholeSets, m.readPath, m.alarms, m.alarmDelay)
	m.reg.MustRegister(calls, m.callSecs, m.batchCalls, m.deliveries, m.deliveredEvs, m.pruned, m.retries, m.dropped,
		m.received, m.callRepeats, m.materialized, m.followHooks, m.eventCalls, m.conns, m.streamEvents,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// replicaCounters exposes what replication shipped and applied, and how
// many times a copy file was opened (copyOpens).
func (m *metrics) replicaCounters(stats func() replica.Stats, copyOpens func() int64) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_change_sets_total", Help: "Change sets this node shipped to the replicated change stream (takeover marks included)."},
			func() float64 { return float64(stats().Shipped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_raw_bytes_total", Help: "Size of the shipped change sets before compression."},
			func() float64 { return float64(stats().RawBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_shipped_bytes_total", Help: "Size of the shipped change sets as published (zstd when smaller)."},
			func() float64 { return float64(stats().ShippedBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_applied_total", Help: "Change sets applied here to copies and catching-up files."},
			func() float64 { return float64(stats().Applied) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_snapshots_total", Help: "Snapshots of object files this node stored (each purges its change stream before it)."},
			func() float64 { return float64(stats().Snapshots) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_restores_total", Help: "Files this node restored from a snapshot (a copy, a taken-over home or a shipped read behind a purge)."},
			func() float64 { return float64(stats().Restores) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_replica_copy_opens_total", Help: "Copy files this node opened to apply change sets; growing with every change set means more copies are written than the node keeps open (max active objects)."},
			func() float64 { return float64(copyOpens()) }),
	)
}

// activationsHelp describes host_activations_total, one help for both
// labels as Prometheus requires.
const activationsHelp = "Object activations, by where their instance came from: pooled (made ahead) or made (at the activation)."

// engineCounters exposes the engine's compiles and compiled modules.
func (m *metrics) engineCounters(e interface {
	Compiles() int64
	Compiled() int
	PoolStats() vm.PoolStats
}) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_module_compiles_total", Help: "Modules compiled by this node (once per digest while in use)."},
			func() float64 { return float64(e.Compiles()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_activations_total", Help: activationsHelp, ConstLabels: prometheus.Labels{"instance": "pooled"}},
			func() float64 { return float64(e.PoolStats().Hits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_activations_total", Help: activationsHelp, ConstLabels: prometheus.Labels{"instance": "made"}},
			func() float64 { return float64(e.PoolStats().Misses) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "host_modules_compiled", Help: "Distinct modules held compiled."},
			func() float64 { return float64(e.Compiled()) }),
	)
}

// connectionCounters exposes the connections' own frame counts.
func (m *metrics) connectionCounters(cs *conns) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_socket_frames_total", Help: "Frames written to WebSockets."},
			func() float64 { f, _ := cs.totals(); return float64(f) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "host_forward_envelopes_total", Help: "Connection events written as the forward envelope (no VM)."},
			func() float64 { _, e := cs.totals(); return float64(e) }),
	)
}

func (m *metrics) observeCall(_ string, d time.Duration, err error) {
	if err != nil {
		m.callsErr.Inc()
	} else {
		m.callsOK.Inc()
	}
	m.callSecs.Observe(d.Seconds())
}

func path(local bool) string {
	if local {
		return "local"
	}
	return "remote"
}

func (m *metrics) ConnBatchSent(_ string, local bool, b *delivery.ConnBatch) {
	m.deliveries.WithLabelValues("connection_batch", path(local)).Inc()
	m.deliveredEvs.WithLabelValues("connection_batch", path(local)).Add(float64(len(b.Events)))
	if local {
		return
	}
	events, edges := b.WireSize()
	m.batchEventBytes.Add(float64(events))
	m.batchEdgeBytes.Add(float64(edges))
	if b.Set.Base == 0 {
		m.wholeSets.Inc()
	}
}

func (m *metrics) ObjectDeliverySent(_ string, local bool, events int, _ bool) {
	m.deliveries.WithLabelValues("object", path(local)).Inc()
	m.deliveredEvs.WithLabelValues("object", path(local)).Add(float64(events))
}

func (m *metrics) Pruned(reason string, edges int) {
	m.pruned.WithLabelValues(reason).Add(float64(edges))
}

func (m *metrics) Retried() { m.retries.Inc() }

func (m *metrics) Dropped(publisher string, e store.Edge, lastErr string) {
	m.dropped.Inc()
	m.log.Warn("edge dropped after its last failed attempt",
		slog.String("publisher", publisher), slog.String("follower", e.Follower),
		slog.String("topic", e.Topic), slog.Int("attempts", e.Attempts+1), slog.String("last_error", lastErr))
}

// alarmLate records how late past its time a first run of an alarm began.
func (m *metrics) alarmLate(d time.Duration) {
	m.alarmDelay.Observe(d.Seconds())
	if f := m.alarmDelays.Load(); f != nil {
		(*f)(d)
	}
}

func (m *metrics) alarmRan(r alarmResult) {
	if r != alarmNone {
		m.alarms.WithLabelValues(string(r)).Inc()
	}
}

// alarmCounters exposes the alarms waiting on this node.
func (m *metrics) alarmCounters(pending func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "host_alarms_pending", Help: "Objects with an alarm scheduled on this node."},
		func() float64 { return float64(pending()) }))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *metrics) observeRemote(op string, bytes int) {
	m.remoteCalls.WithLabelValues(op).Inc()
	m.remoteBytes.WithLabelValues(op).Add(float64(bytes))
}
