package host

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the node's Prometheus metrics, on their own registry so tests
// can run several nodes in one process.
type metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	callSecs prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "host_calls_total", Help: "Method calls by result (ok or error).",
	}, []string{"result"})
	m.callSecs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "host_call_seconds", Help: "Method call latency, handler and transaction.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
	})
	m.reg.MustRegister(m.calls, m.callSecs,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observeCall(_ string, d time.Duration, err error) {
	if err != nil {
		m.calls.WithLabelValues("error").Inc()
	} else {
		m.calls.WithLabelValues("ok").Inc()
	}
	m.callSecs.Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
