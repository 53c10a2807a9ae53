package claim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// smallBatch is the room Claim makes for events before it knows how many
// came; a larger batch grows it.
const smallBatch = 16

// An ordered claim reads the first pending rows above the floor: at least
// orderedScanMin times its limit (and orderedScanFloor rows), enough to
// pass the rows of other claims in flight. Where they are mostly rows of a
// few aggregates (a deep aggregate written first, its run in flight), a
// read of all those rows finds fewer heads than the batch holds, or none
// claimable, and the next claim reads four times as many, up to
// orderedScanMax times the limit, so the aggregates behind them get their
// turn; a read that finds heads enough, or runs out of pending rows,
// halves it again. Reading many rows costs little while few are pending,
// and is what a backlog of one aggregate's held-back rows needs.
const (
	orderedScanMin   = 4
	orderedScanMax   = 64
	orderedScanFloor = 64
)

// orderedScan is how many pending rows the next ordered claim of up to
// limit events reads, and learns from what it got.
type orderedScan struct{ rows atomic.Int64 }

func (o *orderedScan) next(limit int) int64 {
	lo, hi := int64(max(orderedScanMin*limit, orderedScanFloor)), int64(max(orderedScanMax*limit, orderedScanFloor))
	return min(max(o.rows.Load(), lo), hi)
}

// observe learns from a claim that read rows and took got events; heads
// is how many heads it found if it read all of them, -1 if it read fewer
// (none are left beyond), and 0 if it took nothing (it says nothing).
func (o *orderedScan) observe(limit, got int, read int64, heads int64) {
	if got == 0 || (heads >= 0 && heads < int64(limit)) {
		o.rows.Store(read * 4)
	} else {
		o.rows.Store(read / 2)
	}
}

// Claim leases up to limit claimable events, oldest first, and no more of
// them than fit in Config.MaxBatchBytes (but at least one). An empty batch
// means nothing is claimable now.
func (s *Store) Claim(ctx context.Context, limit int) (Batch, error) {
	return s.MarkAndClaim(ctx, nil, limit)
}

// MarkAndClaim marks published as MarkPublished does and then claims as
// Claim does, in one round trip and one transaction: the claim runs after
// the mark, and sees it (an ordered claim finds the aggregates the mark
// unblocked). A relay that settles one batch and claims the next saves a
// round trip and a commit. On an error nothing was claimed, and the marks
// were rolled back with the claim: the caller marks them again, which
// changes nothing where they went through. A DB that cannot send batches
// (it has no SendBatch, as *pgxpool.Pool has) gets the two statements one
// after the other.
func (s *Store) MarkAndClaim(ctx context.Context, published []int64, limit int) (Batch, error) {
	lease, err := s.newLease()
	if err != nil {
		return Batch{}, fmt.Errorf("claim batch: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	// The statement weighs rows by their stored size, which compression
	// can make far smaller than what is sent: highly compressible events
	// would all pass, be sent, and be given back. So ask for no more than
	// the budget takes at the size events have had lately.
	if avg := s.eventSize.Load(); avg > 0 {
		limit = int(min(int64(limit), int64(s.cfg.MaxBatchBytes)/avg+1))
	}
	args := []any{limit, s.cfg.Lease.Milliseconds(), lease, s.cfg.MaxBatchBytes}
	ordered := s.cfg.Ordering == OrderAggregate
	var scan int64  // ordered: the pending rows the claim reads
	var heads int64 // ordered: the heads a full read found, -1 if not full
	if ordered {
		// Every parked row, due or not: one not due holds its aggregate.
		floor, parked := s.orderedParked()
		scan = s.scan.next(limit)
		args = append(args, floor, scan, parked)
	} else {
		args = append(args, s.floor.at.Load(), s.dueParked(limit))
	}
	rows, err := s.claimRows(ctx, published, args)
	if err != nil {
		s.noteLost(lease, err)
		return Batch{}, err
	}
	// Room for a small batch only: at everyday rates a claim takes one
	// event or a few, and zeroing room for limit events on every claim was
	// a quarter of the claim's CPU (pprof, 1,000 one-event batches/s).
	events := make([]Event, 0, min(limit, smallBatch))
	var (
		size     int     // payload and header bytes kept
		received int     // payload and header bytes received
		overflow []int64 // claimed, but over the budget once received
		// firstBack maps an aggregate to the seq of its first row in
		// overflow.
		firstBack map[string]int64
		batchMore bool // ordered: the statement's "more"
	)
	if ordered {
		firstBack = map[string]int64{}
	}
	// One set of scan targets serves every row: scanning into fresh locals
	// cost a heap allocation for each of them per row, and a nullable
	// column scanned into a *string one more.
	var r scanned
	dest := r.targets(ordered)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			err = fmt.Errorf("claim batch: scan: %w", err)
			s.noteLost(lease, err) // the claim went on without the rows read
			return Batch{}, err
		}
		e := r.event()
		if ordered {
			heads = -1
			if r.heads.Valid {
				heads = r.heads.Int64
			}
		}
		batchMore = batchMore || r.more
		n := len(e.Payload) + len(e.PayloadBytes) + len(e.Headers)
		received += n
		if len(events) == 0 || size+n <= s.cfg.MaxBatchBytes {
			size += n
		} else {
			overflow = append(overflow, e.ID)
			if ordered {
				// A row given back holds its aggregate's later rows of
				// this batch back too.
				if first, ok := firstBack[e.OrderingKey]; !ok || e.Seq < first {
					firstBack[e.OrderingKey] = e.Seq
				}
			}
			continue
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		s.noteLost(lease, err)
		return Batch{}, fmt.Errorf("claim batch: %w", err)
	}
	if got := len(events) + len(overflow); got > 0 {
		avg := int64(received/got + 1)
		if old := s.eventSize.Load(); old > 0 {
			avg = (3*old + avg) / 4
		}
		s.eventSize.Store(avg)
	}
	sortBySeq(events)
	s.unpark(events)
	if len(firstBack) > 0 {
		events, overflow = cutAfterOverflow(events, overflow, firstBack)
	}
	if len(overflow) > 0 {
		// If this fails, those rows are claimable again once the lease
		// lapses: later, never lost.
		_, _ = s.Release(ctx, lease, overflow)
	}
	more := len(events)+len(overflow) >= limit
	if ordered {
		more = batchMore
		s.scan.observe(limit, len(events)+len(overflow), scan, heads)
	}
	return Batch{Lease: lease, Events: events, LeaseFor: s.cfg.Lease, More: more}, nil
}

// claimRows runs the claim statement with args, after the mark of
// published if there are any: both are sent in one pgx batch, which pgx
// sends in one round trip with one Sync, so the two run in one implicit
// transaction, each statement under its own snapshot.
func (s *Store) claimRows(ctx context.Context, published []int64, args []any) (pgx.Rows, error) {
	if len(published) == 0 {
		rows, err := s.db.Query(ctx, s.q.claim, args...)
		if err != nil {
			return nil, fmt.Errorf("claim batch: %w", err)
		}
		return rows, nil
	}
	if s.sender == nil {
		if _, err := s.db.Exec(ctx, s.q.markPublished, published); err != nil {
			return nil, fmt.Errorf("mark published: %w", err)
		}
		return s.claimRows(ctx, nil, args)
	}
	b := &pgx.Batch{}
	if s.local != nil {
		s.local.queue(b)
	}
	b.Queue(s.q.markPublished, published)
	b.Queue(s.q.claim, args...)
	br := s.sender.SendBatch(ctx, b)
	if s.local != nil {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("claim batch: settings: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("mark published: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// cutAfterOverflow keeps an ordered batch gap-free once some of its rows
// went over the byte budget: every row of an aggregate after one given back
// is given back too. firstBack maps an aggregate to the seq of its first row
// given back.
func cutAfterOverflow(events []Event, overflow []int64, firstBack map[string]int64) ([]Event, []int64) {
	kept := events[:0]
	for _, e := range events {
		if first, ok := firstBack[e.OrderingKey]; ok && e.Seq > first {
			overflow = append(overflow, e.ID)
			continue
		}
		kept = append(kept, e)
	}
	return kept, overflow
}

// sortBySeq puts a batch in insert order, which an ordered batch's runs
// follow.
func sortBySeq(events []Event) {
	slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.Seq, b.Seq) })
}
