package metrics

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxrelay/outboxrelay/publish"
)

const namespace = "outboxrelay"

// Histogram buckets, in base units.
var (
	lagBuckets      = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	claimBuckets    = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	publishBuckets  = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 15, 30}
	batchBuckets    = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500}
	connectionNames = []string{ServicePostgres, ServiceListener, ServiceRabbitMQ}
)

// The services of outboxrelay_connection_up.
const (
	ServicePostgres = "postgres"
	ServiceListener = "listener"
	ServiceRabbitMQ = "rabbitmq"
)

// Metrics holds the relay's collectors. Create it with New.
type Metrics struct {
	published     prometheus.Counter
	retried       *prometheus.CounterVec
	deadLettered  *prometheus.CounterVec
	released      prometheus.Counter
	lag           prometheus.Histogram
	claimDuration prometheus.Histogram
	publishTime   prometheus.Histogram
	batchEvents   prometheus.Histogram
	connectionUp  *prometheus.GaugeVec
	brokerBlocked prometheus.Gauge
	broker        *prometheus.GaugeVec
	gateClosed    prometheus.Gauge
	gateCloses    prometheus.Counter
	// closed is gateClosed's value, for counting its rises in gateCloses.
	closed     atomic.Bool
	ready      prometheus.Gauge
	queueUsage prometheus.Gauge
	sampling   prometheus.Gauge
	table      *tableCollector
	horizon    *horizonCollector
}

// Options configure New.
type Options struct {
	// Version is the relay's version, for outboxrelay_build_info. Default
	// "devel".
	Version string
	// Ordered exports outboxrelay_blocked_aggregates (ordered mode under
	// the block policy). Default false.
	Ordered bool
}

// New creates the relay's metrics and registers them, the Go runtime's and
// the process's collectors on reg.
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if opts.Version == "" {
		opts.Version = "devel"
	}
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_published_total",
			Help: "Events confirmed by RabbitMQ and marked published.",
		}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_retried_total",
			Help: "Events whose publish failed and that were put back for another attempt, by reason.",
		}, []string{"reason"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_dead_lettered_total",
			Help: "Events dead-lettered (status failed): out of attempts, or unpublishable as they are, by reason.",
		}, []string{"reason"}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_released_total",
			Help: "Claimed events given back unpublished without counting an attempt (shutdown, held back behind an earlier event of their aggregate, or claimed by a claim whose reply was lost).",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "event_lag_seconds",
			Help:    "Time from an event's created_at to RabbitMQ's confirm of it.",
			Buckets: lagBuckets,
		}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "claim_duration_seconds",
			Help:    "Time one claim statement took.",
			Buckets: claimBuckets,
		}),
		publishTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "publish_duration_seconds",
			Help:    "Time one batch took from its first publish to its last confirm.",
			Buckets: publishBuckets,
		}),
		batchEvents: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "batch_events",
			Help:    "Events per claim that found any.",
			Buckets: batchBuckets,
		}),
		connectionUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "connection_up",
			Help: "1 while the relay's connection to the service is up: postgres (the pool answers), listener (LISTENing), rabbitmq (connected).",
		}, []string{"service"}),
		broker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "broker_connected",
			Help: "1 for the RabbitMQ URL (password redacted) the relay is connected to, of the --amqp-url list; no series while disconnected.",
		}, []string{"url"}),
		brokerBlocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "broker_blocked",
			Help: "1 while RabbitMQ blocks the relay's connection (a memory or disk alarm).",
		}),
		gateClosed: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "gate_closed",
			Help: "1 while the relay keeps the notification gate closed (busy: it polls instead of waiting for NOTIFY).",
		}),
		gateCloses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "gate_closes_total",
			Help: "Times the relay closed the notification gate after it had been open; its refreshes of a closed gate do not count. A relay that closes it about once a second or more flaps between its busy and idle regimes.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "ready",
			Help: "1 while /readyz answers 200.",
		}),
		queueUsage: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "notification_queue_usage_ratio",
			Help: "pg_notification_queue_usage(): the fraction of PostgreSQL's NOTIFY queue in use (0 to 1); a full queue fails every notifying commit.",
		}),
		sampling: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "table_sampler",
			Help: "1 on the relay that samples the table gauges now (one per table at a time).",
		}),
		table:   newTableCollector(opts.Ordered),
		horizon: &horizonCollector{},
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "1, labelled with the relay's version and the Go version it was built with.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(opts.Version, runtime.Version()).Set(1)
	for _, reason := range publish.Reasons() {
		m.retried.WithLabelValues(reason)
		m.deadLettered.WithLabelValues(reason)
	}
	for _, service := range connectionNames {
		m.connectionUp.WithLabelValues(service)
	}
	for _, c := range []prometheus.Collector{
		m.published, m.retried, m.deadLettered, m.released, m.lag, m.claimDuration, m.publishTime,
		m.batchEvents, m.connectionUp, m.broker, m.brokerBlocked, m.gateClosed, m.gateCloses, m.ready, m.queueUsage,
		m.sampling, m.table, m.horizon, build,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Claimed implements relay.Observer.
func (m *Metrics) Claimed(events int, took time.Duration) {
	m.claimDuration.Observe(took.Seconds())
	if events > 0 {
		m.batchEvents.Observe(float64(events))
	}
}

// Published implements relay.Observer.
func (m *Metrics) Published(lags []time.Duration, took time.Duration) {
	m.published.Add(float64(len(lags)))
	for _, lag := range lags {
		m.lag.Observe(lag.Seconds())
	}
	m.publishTime.Observe(took.Seconds())
}

// Retried implements relay.Observer.
func (m *Metrics) Retried(reason string, n int) { m.retried.WithLabelValues(reason).Add(float64(n)) }

// DeadLettered implements relay.Observer.
func (m *Metrics) DeadLettered(reason string, n int) {
	m.deadLettered.WithLabelValues(reason).Add(float64(n))
}

// Released implements relay.Observer.
func (m *Metrics) Released(n int) { m.released.Add(float64(n)) }

// GateClosed implements relay.Observer. A relay reports its gate closed at
// each refresh as well; only a report that finds it open counts a close.
func (m *Metrics) GateClosed(closed bool) {
	m.gateClosed.Set(b2f(closed))
	if m.closed.Swap(closed) != closed && closed {
		m.gateCloses.Inc()
	}
}

// SetConnection sets outboxrelay_connection_up for one service.
func (m *Metrics) SetConnection(service string, up bool) {
	m.connectionUp.WithLabelValues(service).Set(b2f(up))
}

// SetBroker sets outboxrelay_broker_connected to the URL connected to,
// redacted; "" (disconnected) leaves no series.
func (m *Metrics) SetBroker(url string) {
	m.broker.Reset()
	if url != "" {
		m.broker.WithLabelValues(url).Set(1)
	}
}

// SetBrokerBlocked sets outboxrelay_broker_blocked.
func (m *Metrics) SetBrokerBlocked(blocked bool) { m.brokerBlocked.Set(b2f(blocked)) }

// SetReady sets outboxrelay_ready.
func (m *Metrics) SetReady(ready bool) { m.ready.Set(b2f(ready)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
