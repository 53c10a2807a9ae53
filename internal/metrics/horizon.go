package metrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// The holders of vacuum's horizon: the values of the holder label.
const (
	// holderBackend is a session of this database: its snapshot, or its
	// transaction ID.
	holderBackend = "backend"
	// holderPreparedTransaction is a prepared transaction of this
	// database (PREPARE TRANSACTION), which outlives its session.
	holderPreparedTransaction = "prepared_transaction"
	// holderStandbyFeedback is a WAL sender without a replication slot: a
	// standby's hot_standby_feedback, for its own queries.
	holderStandbyFeedback = "standby_feedback"
	// holderReplicationSlot is a replication slot's xmin: a standby's
	// feedback through its slot, inactive standbys included.
	holderReplicationSlot = "replication_slot"
	// holderReplicationSlotCatalog is a replication slot's catalog_xmin
	// (logical decoding): it holds back the system catalogs only, not the
	// outbox table.
	holderReplicationSlotCatalog = "replication_slot_catalog"
)

// holders are the holder label's values, in the order they are exported.
var holders = []string{holderBackend, holderPreparedTransaction, holderStandbyFeedback,
	holderReplicationSlot, holderReplicationSlotCatalog}

// horizonSQL reads, for each kind of holder, the oldest transaction ID that
// keeps VACUUM from removing dead row versions of this database's tables,
// the outbox among them: its age() in transactions, the ID itself, and the
// seconds since its holder's transaction began where PostgreSQL shows it.
// It reads three views of shared memory, no table, so it costs well under
// a millisecond, and every role may read them:
//
//   - pg_stat_activity, for sessions of this database (and WAL senders,
//     whose datname is NULL). A session's snapshot (backend_xmin) is the
//     oldest ID it needs; between two statements of a READ COMMITTED
//     transaction it has none, but its own ID (backend_xid), once it has
//     written, holds back the horizon as well. A role sees other roles'
//     backend_xmin and backend_xid, but not their xact_start (NULL here)
//     nor their backend_type; hence the tests on datname and usesysid. The
//     sampler's own session is left out, and so are autovacuum workers
//     (they run as no role): a VACUUM's snapshot holds back no other
//     vacuum, and one can run for hours on a large table. Logical WAL
//     senders hold back through their slots; they are left out where
//     backend_type shows them.
//   - pg_prepared_xacts: a prepared transaction of this database holds
//     its ID until COMMIT PREPARED or ROLLBACK PREPARED, with no session.
//   - pg_replication_slots: every slot's xmin holds back every database of
//     the cluster, and its catalog_xmin their catalogs.
//
// The kinds without a row hold nothing.
const horizonSQL = `
WITH holder (kind, xid, since) AS (
    SELECT CASE WHEN datname IS NULL THEN 'standby_feedback' ELSE 'backend' END,
           coalesce(backend_xmin, backend_xid),
           CASE WHEN datname IS NOT NULL THEN xact_start END
    FROM pg_stat_activity
    WHERE coalesce(backend_xmin, backend_xid) IS NOT NULL
      AND pid <> pg_backend_pid()
      AND (datname IS NULL
           OR datname = current_database() AND usesysid IS NOT NULL
              AND backend_type IS DISTINCT FROM 'walsender')
  UNION ALL
    SELECT 'prepared_transaction', transaction, prepared
    FROM pg_prepared_xacts
    WHERE database = current_database()
  UNION ALL
    SELECT 'replication_slot', xmin, NULL
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
  UNION ALL
    SELECT 'replication_slot_catalog', catalog_xmin, NULL
    FROM pg_replication_slots
    WHERE catalog_xmin IS NOT NULL
)
SELECT DISTINCT ON (kind) kind, age(xid), xid::text,
       extract(epoch FROM statement_timestamp() - since)::float8
FROM holder
ORDER BY kind, age(xid) DESC, since`

var (
	horizonTransactionsDesc = prometheus.NewDesc(namespace+"_vacuum_horizon_age_transactions",
		"age() of the oldest transaction ID that keeps vacuum from removing the outbox table's dead rows, by holder: backend (a session of the database), prepared_transaction, standby_feedback (a standby's hot_standby_feedback without a slot), replication_slot (a slot's xmin), replication_slot_catalog (a slot's catalog_xmin, which holds back the catalogs only); 0 when none. Exported by the sampling relay only.",
		[]string{"holder"}, nil)
	horizonSecondsDesc = prometheus.NewDesc(namespace+"_vacuum_horizon_age_seconds",
		"How long the holder of that oldest transaction ID has held it: since its transaction began (or was prepared) where the relay's role can see it, otherwise since the sampling relay first saw that ID as its holder's oldest; 0 when none. Exported by the sampling relay only.",
		[]string{"holder"}, nil)
)

// holderRow is one row of horizonSQL.
type holderRow struct {
	kind string
	// age is age(xid), in transactions.
	age int64
	xid string
	// seconds since the holder's transaction began; nil where PostgreSQL
	// does not show it.
	seconds *float64
}

// holderAge is one holder's gauges.
type holderAge struct {
	transactions int64
	seconds      float64
}

// oldestSeen is the oldest transaction ID of one kind of holder, and when
// the sampler first saw it as that.
type oldestSeen struct {
	xid   string
	since time.Time
}

// horizon ages the holders of vacuum's horizon from one sample to the
// next. Only the sampler's goroutine uses it.
type horizon struct {
	seen map[string]oldestSeen // by kind
}

// observe turns a sample's rows, read at now, into every holder's gauges:
// a holder without a row is at 0, and one whose transaction start is
// unknown is aged from the first sample that saw its oldest ID, which it
// forgets once that ID is no longer its oldest.
func (h *horizon) observe(rows []holderRow, now time.Time) map[string]holderAge {
	byKind := make(map[string]holderRow, len(rows))
	for _, r := range rows {
		byKind[r.kind] = r
	}
	if h.seen == nil {
		h.seen = map[string]oldestSeen{}
	}
	out := make(map[string]holderAge, len(holders))
	for _, kind := range holders {
		r, ok := byKind[kind]
		if !ok {
			delete(h.seen, kind)
			out[kind] = holderAge{}
			continue
		}
		seen, ok := h.seen[kind]
		if !ok || seen.xid != r.xid {
			seen = oldestSeen{xid: r.xid, since: now}
			h.seen[kind] = seen
		}
		a := holderAge{transactions: r.age, seconds: now.Sub(seen.since).Seconds()}
		if r.seconds != nil {
			a.seconds = max(*r.seconds, 0)
		}
		out[kind] = a
	}
	return out
}

// reset forgets every ID seen: the next sample ages them from its own time.
func (h *horizon) reset() { h.seen = nil }

// querier runs a query: a *pgx.Conn or a *pgxpool.Pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readHorizon runs horizonSQL on db.
func readHorizon(ctx context.Context, db querier) ([]holderRow, error) {
	rows, err := db.Query(ctx, horizonSQL)
	if err != nil {
		return nil, fmt.Errorf("vacuum horizon: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (holderRow, error) {
		var r holderRow
		err := row.Scan(&r.kind, &r.age, &r.xid, &r.seconds)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("vacuum horizon: %w", err)
	}
	return out, nil
}

// horizonCollector exports the last horizon sample while this relay is
// the sampler, and nothing otherwise, as tableCollector does.
type horizonCollector struct {
	mu   sync.Mutex
	ages map[string]holderAge // nil: no fresh sample
}

func (c *horizonCollector) set(ages map[string]holderAge) {
	c.mu.Lock()
	c.ages = ages
	c.mu.Unlock()
}

func (c *horizonCollector) clear() { c.set(nil) }

// Describe implements prometheus.Collector.
func (c *horizonCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- horizonTransactionsDesc
	ch <- horizonSecondsDesc
}

// Collect implements prometheus.Collector.
func (c *horizonCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ages := c.ages
	c.mu.Unlock()
	if ages == nil {
		return
	}
	for _, kind := range holders {
		a := ages[kind]
		ch <- prometheus.MustNewConstMetric(horizonTransactionsDesc, prometheus.GaugeValue, float64(a.transactions), kind)
		ch <- prometheus.MustNewConstMetric(horizonSecondsDesc, prometheus.GaugeValue, a.seconds, kind)
	}
}
