package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outboxrelay/claim"
)

var (
	outboxEventsDesc = prometheus.NewDesc(namespace+"_outbox_events",
		"Rows of the outbox table by status: pending and failed counted, published estimated from the planner's row count. Exported by the sampling relay only.",
		[]string{"status"}, nil)
	oldestPendingDesc = prometheus.NewDesc(namespace+"_oldest_pending_age_seconds",
		"Age of the oldest pending event (lowest id) that is due or was attempted; a scheduled event is aged from its time. 0 when there is none. Exported by the sampling relay only.",
		nil, nil)
	scheduledDesc = prometheus.NewDesc(namespace+"_scheduled_events",
		"Pending events waiting for their time (scheduled by the producer, never attempted, not yet due); they are among the pending of outbox_events. Exported by the sampling relay only.",
		nil, nil)
	blockedDesc = prometheus.NewDesc(namespace+"_blocked_aggregates",
		"Ordered mode under the block policy: aggregates whose later events wait behind a dead-lettered event. Exported by the sampling relay only.",
		nil, nil)
)

// tableCollector exports the last table sample while this relay is the
// sampler, and nothing otherwise: a relay that lost the sampling lock must
// not go on exporting a sample that ages.
type tableCollector struct {
	ordered bool

	mu     sync.Mutex
	sample claim.Sample
	held   bool // a fresh sample is held
}

func newTableCollector(ordered bool) *tableCollector { return &tableCollector{ordered: ordered} }

func (c *tableCollector) set(s claim.Sample) {
	c.mu.Lock()
	c.sample, c.held = s, true
	c.mu.Unlock()
}

func (c *tableCollector) clear() {
	c.mu.Lock()
	c.sample, c.held = claim.Sample{}, false
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- outboxEventsDesc
	ch <- oldestPendingDesc
	ch <- scheduledDesc
	if c.ordered {
		ch <- blockedDesc
	}
}

// Collect implements prometheus.Collector.
func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	s, held := c.sample, c.held
	c.mu.Unlock()
	if !held {
		return
	}
	for _, v := range []struct {
		status string
		n      int64
	}{{"pending", s.Pending}, {"published", s.Published}, {"failed", s.Failed}} {
		ch <- prometheus.MustNewConstMetric(outboxEventsDesc, prometheus.GaugeValue, float64(v.n), v.status)
	}
	ch <- prometheus.MustNewConstMetric(oldestPendingDesc, prometheus.GaugeValue, s.OldestPending.Seconds())
	ch <- prometheus.MustNewConstMetric(scheduledDesc, prometheus.GaugeValue, float64(s.Scheduled))
	if c.ordered {
		ch <- prometheus.MustNewConstMetric(blockedDesc, prometheus.GaugeValue, float64(s.BlockedAggregates))
	}
}
