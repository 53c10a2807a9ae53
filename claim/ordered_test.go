package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// newOrderedStore is a fresh outbox with the ordering index and an ordered
// store on it.
func newOrderedStore(t *testing.T, cfg claim.Config) (*claim.Store, *pgxpool.Pool) {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	ensureOrderingIndex(t, url)
	cfg.Ordering = claim.OrderAggregate
	s, err := claim.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Check(context.Background()))
	return s, pool
}

// insertAggregates inserts events events for each of aggregates
// aggregates, interleaved (event 1 of every aggregate, then event 2, …).
func insertAggregates(t *testing.T, pool *pgxpool.Pool, aggregates, events int) {
	t.Helper()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', a::text, 'e', jsonb_build_object('seq', e)
		FROM generate_series(1, $2) AS e, generate_series(1, $1) AS a ORDER BY e, a`, aggregates, events)
}

func byAggregate(events []claim.Event) map[string][]int64 {
	m := map[string][]int64{}
	for _, e := range events {
		m[e.OrderingKey] = append(m[e.OrderingKey], e.ID)
	}
	return m
}

func TestOrderedClaimTakesEachAggregateOnceAndInOrder(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	insertAggregates(t, pool, 3, 4)
	b, err := s.Claim(context.Background(), 100)
	require.NoError(t, err)
	require.Len(t, b.Events, 12, "three aggregates, each a run of four")
	runs := byAggregate(b.Events)
	require.Len(t, runs, 3)
	for key, ids := range runs {
		require.IsIncreasing(t, ids, key)
	}
	again, err := s.Claim(context.Background(), 100)
	require.NoError(t, err)
	require.Empty(t, again.Events, "every aggregate has a leased head")

	// A new event of a leased aggregate waits for its head.
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'e', '{}'), ('order', '9', 'e', '{}')`)
	next, err := s.Claim(context.Background(), 100)
	require.NoError(t, err)
	require.Len(t, next.Events, 1)
	require.Equal(t, "(order,9)", next.Events[0].OrderingKey)
}

func TestOrderedClaimSpreadsTheBatchOverAggregates(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	insertAggregates(t, pool, 10, 10)
	b, err := s.Claim(context.Background(), 20)
	require.NoError(t, err)
	require.Len(t, b.Events, 20)
	runs := byAggregate(b.Events)
	require.Len(t, runs, 10, "two events of each of ten aggregates, not twenty of two")
}

func TestOrderedClaimIsBlockedByARetryingHead(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{RetryMin: time.Hour, RetryMax: time.Hour})
	insertAggregates(t, pool, 2, 3)
	b, err := s.Claim(context.Background(), 100)
	require.NoError(t, err)
	runs := byAggregate(b.Events)
	a1 := runs["(order,1)"]
	require.Len(t, a1, 3)
	// Aggregate 1's head failed: it backs off; the rest of its run is
	// given back. Aggregate 2 is published.
	_, err = s.Retry(context.Background(), b.Lease, []claim.Failure{{ID: a1[0], Attempts: 1, Err: errors.New("nacked")}})
	require.NoError(t, err)
	_, err = s.Release(context.Background(), b.Lease, a1[1:])
	require.NoError(t, err)
	_, err = s.MarkPublished(context.Background(), runs["(order,2)"])
	require.NoError(t, err)
	insertAggregates(t, pool, 2, 1)

	next, err := s.Claim(context.Background(), 100)
	require.NoError(t, err)
	require.Len(t, next.Events, 1, "aggregate 1 waits for its head; aggregate 2 goes on")
	require.Equal(t, "(order,2)", next.Events[0].OrderingKey)
}

func TestOrderedDeadLetterPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy claim.DeadLetterPolicy
		next   int
	}{{claim.DeadLetterBlock, 0}, {claim.DeadLetterContinue, 2}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			t.Parallel()
			s, pool := newOrderedStore(t, claim.Config{OrderedDeadLetter: tc.policy})
			insertAggregates(t, pool, 1, 3)
			b, err := s.Claim(context.Background(), 1)
			require.NoError(t, err)
			require.Len(t, b.Events, 1)
			f := claim.Failure{ID: b.Events[0].ID, Attempts: 1, Err: errors.New("bad"), Permanent: true}
			require.Equal(t, tc.policy == claim.DeadLetterContinue, s.Unblocks(f))
			_, err = s.Retry(context.Background(), b.Lease, []claim.Failure{f})
			require.NoError(t, err)
			next, err := s.Claim(context.Background(), 100)
			require.NoError(t, err)
			require.Len(t, next.Events, tc.next)
		})
	}
}

func TestOrderedCheckNeedsTheIndex(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{Ordering: claim.OrderAggregate})
	require.NoError(t, err)
	require.ErrorIs(t, s.Check(context.Background()), claim.ErrNoOrderingIndex)
}

// TestOrderedClaimSaysWhetherMoreIsClaimable checks Batch.More: set while
// claimable aggregates are left past the batch, unset when every other
// aggregate's head is in flight, so the relay wakes no worker to find
// nothing.
func TestOrderedClaimSaysWhetherMoreIsClaimable(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	insertAggregates(t, pool, 20, 2)
	ctx := context.Background()
	first, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, first.Events, 10)
	require.True(t, first.More, "ten more aggregates are claimable")
	second, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, second.Events, 10)
	require.False(t, second.More, "every other aggregate's head is leased")
}
