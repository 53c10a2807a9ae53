package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sample is what the table holds, for the relay's gauges.
type Sample struct {
	// Pending, Failed: exact counts of rows by status.
	Pending, Failed int64
	// Published is an estimate: the planner's row count of the table
	// (pg_class.reltuples, refreshed by autovacuum and ANALYZE) less the
	// pending and failed rows. Counting the published rows exactly would
	// read them all.
	Published int64
	// Scheduled counts the pending rows waiting for their time
	// (Event.NotBefore of the producer library): never attempted, not
	// yet due. They are among Pending.
	Scheduled int64
	// OldestPending is the age of the pending event with the lowest id
	// among those due or attempted, from its created_at, or from its time
	// if it was scheduled (Event.NotBefore of the producer library): a
	// scheduled event is not late before its time. 0 when none is.
	OldestPending time.Duration
	// BlockedAggregates counts the aggregates a dead-lettered event holds
	// back: in ordered mode under DeadLetterBlock, else 0.
	BlockedAggregates int64
}

// Sample reads the table's gauges on db (a connection of its own, say,
// that holds the sampling lock), or on the store's own connections if db
// is nil. It stays cheap on a large table: see queries.sql.
func (s *Store) Sample(ctx context.Context, db DB) (Sample, error) {
	if db == nil {
		db = s.db
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	var (
		out     Sample
		rows    int64
		oldestS float64
	)
	blocking := s.cfg.Ordering == OrderAggregate && s.cfg.OrderedDeadLetter == DeadLetterBlock
	floor, parked := s.floorAndParked()
	r, err := db.Query(ctx, s.q.sample, s.q.table, blocking, floor, parked)
	if err != nil {
		return Sample{}, fmt.Errorf("sample: %w", err)
	}
	if _, err := pgx.CollectExactlyOneRow(r, func(row pgx.CollectableRow) (struct{}, error) {
		return struct{}{}, row.Scan(&out.Pending, &out.Scheduled, &out.Failed, &rows, &oldestS, &out.BlockedAggregates)
	}); err != nil {
		return Sample{}, fmt.Errorf("sample: %w", err)
	}
	out.Published = max(rows-out.Pending-out.Failed, 0)
	out.OldestPending = time.Duration(oldestS * float64(time.Second))
	return out, nil
}
