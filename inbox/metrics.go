package inbox

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's Prometheus collectors, curried with its name.
// A nil *metrics (no Config.Registerer) records nothing.
type metrics struct {
	processed    prometheus.Counter
	duplicates   prometheus.Counter
	retried      prometheus.Counter
	dbFailures   prometheus.Counter
	deadMissing  prometheus.Counter
	deadAttempts prometheus.Counter
	duration     prometheus.Observer
}

// newMetrics registers the collectors with reg. Consumers of other names
// may share reg: a collector registered already by another Consumer is
// reused.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := []string{"consumer"}
	processed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_processed_total",
		Help: "Messages whose handler committed.",
	}, labels)
	duplicates := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_duplicates_total",
		Help: "Deliveries of messages already processed, acked without running the handler.",
	}, labels)
	retried := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_retried_total",
		Help: "Handler attempts that failed (error or panic) and were retried.",
	}, labels)
	dbFailures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_database_failures_total",
		Help: "Attempts the database failed, not the handler (a begin, the insert or a commit failed, the connection was lost), retried without being counted.",
	}, labels)
	dead := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_dead_lettered_total",
		Help: "Deliveries rejected to the queue's dead-letter exchange, by reason (missing_id, attempts).",
	}, []string{"consumer", "reason"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "inbox_handler_duration_seconds",
		Help:    "Time the handler took, per attempt, failed ones included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 8), // 1ms .. 16s
	}, labels)
	var err error
	processed, err = register(reg, processed)
	if err == nil {
		duplicates, err = register(reg, duplicates)
	}
	if err == nil {
		retried, err = register(reg, retried)
	}
	if err == nil {
		dbFailures, err = register(reg, dbFailures)
	}
	if err == nil {
		dead, err = register(reg, dead)
	}
	if err == nil {
		duration, err = register(reg, duration)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: Config.Registerer: %w", err)
	}
	return &metrics{
		processed:    processed.WithLabelValues(name),
		duplicates:   duplicates.WithLabelValues(name),
		retried:      retried.WithLabelValues(name),
		dbFailures:   dbFailures.WithLabelValues(name),
		deadMissing:  dead.WithLabelValues(name, "missing_id"),
		deadAttempts: dead.WithLabelValues(name, "attempts"),
		duration:     duration.WithLabelValues(name),
	}, nil
}

// register registers c, or returns the collector registered already.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

func (m *metrics) incProcessed() {
	if m != nil {
		m.processed.Inc()
	}
}

func (m *metrics) incDuplicates() {
	if m != nil {
		m.duplicates.Inc()
	}
}

func (m *metrics) incRetried() {
	if m != nil {
		m.retried.Inc()
	}
}

func (m *metrics) incDatabaseFailures() {
	if m != nil {
		m.dbFailures.Inc()
	}
}

func (m *metrics) incDeadMissing() {
	if m != nil {
		m.deadMissing.Inc()
	}
}

func (m *metrics) incDeadAttempts() {
	if m != nil {
		m.deadAttempts.Inc()
	}
}

func (m *metrics) observe(seconds float64) {
	if m != nil {
		m.duration.Observe(seconds)
	}
}
