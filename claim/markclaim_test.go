package claim_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// MarkAndClaim marks the last batch and claims the next: the marked rows
// are published, and the claim takes what is claimable, not them.
func TestMarkAndClaimMarksThenClaims(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{})
	ctx := context.Background()
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'a', g::text, 'e', '{}' FROM generate_series(1, 3) AS g RETURNING 0`)
	first, err := s.Claim(ctx, 2)
	require.NoError(t, err)
	require.Len(t, first.Events, 2)

	next, err := s.MarkAndClaim(ctx, ids(first.Events), 10)
	require.NoError(t, err)
	require.Len(t, next.Events, 1)
	require.Equal(t, "3", next.Events[0].AggregateID)
	require.NotEqual(t, first.Lease, next.Lease)
	require.Equal(t, int64(2), q(`SELECT count(*) FROM outbox WHERE status = 'published' AND published_at IS NOT NULL AND lease_id IS NULL AND id = ANY ($1)`, ids(first.Events)))
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE status = 'pending' AND lease_id IS NOT NULL`))

	none, err := s.MarkAndClaim(ctx, ids(next.Events), 10)
	require.NoError(t, err)
	require.Empty(t, none.Events)
	require.Zero(t, q(`SELECT count(*) FROM outbox WHERE status = 'pending'`), "a claim that finds nothing still marks")
}

// Under DeleteConfirmed a mark deletes the rows of the confirmed events,
// on its own and riding on a claim, and leaves every other row as it was.
func TestDeleteConfirmedDeletesTheMarkedRows(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{DeleteConfirmed: true})
	ctx := context.Background()
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'a', g::text, 'e', '{}' FROM generate_series(1, 4) AS g RETURNING 0`)
	first, err := s.Claim(ctx, 2)
	require.NoError(t, err)
	require.Len(t, first.Events, 2)

	n, err := s.MarkPublished(ctx, ids(first.Events[:1]))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, q(`SELECT count(*) FROM outbox WHERE id = $1`, first.Events[0].ID), "the marked row is gone")

	next, err := s.MarkAndClaim(ctx, ids(first.Events[1:]), 1)
	require.NoError(t, err)
	require.Len(t, next.Events, 1)
	require.Zero(t, q(`SELECT count(*) FROM outbox WHERE id = $1`, first.Events[1].ID), "the row marked on the claim is gone")
	require.Equal(t, int64(2), q(`SELECT count(*) FROM outbox WHERE status = 'pending'`), "the claimed and the unclaimed row stay")
	require.Zero(t, q(`SELECT count(*) FROM outbox WHERE status <> 'pending'`), "no row is kept as published")
}

// In ordered mode the claim sees the mark made before it in the same
// round trip: the aggregate whose head it marks is claimable again at
// once, which a single statement (one snapshot for the mark and the claim)
// would not see.
func TestMarkAndClaimUnblocksTheMarkedAggregate(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	insertAggregates(t, pool, 1, 2)
	ctx := context.Background()
	head, err := s.Claim(ctx, 1)
	require.NoError(t, err)
	require.Len(t, head.Events, 1)
	blocked, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, blocked.Events, "the aggregate's head is in flight")

	next, err := s.MarkAndClaim(ctx, ids(head.Events), 10)
	require.NoError(t, err)
	require.Len(t, next.Events, 1, "the mark unblocked the aggregate")
	require.Greater(t, next.Events[0].ID, head.Events[0].ID)
}

// The mark and the claim are one transaction: a claim that fails takes
// the mark back with it, so the caller marks again and nothing is marked
// twice or lost.
func TestMarkAndClaimFailsWhole(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'ok', 'e', '{}')`)
	first, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, first.Events, 1)
	// The claim's update of this row raises; the mark touches other rows.
	testkit.Exec(t, pool, `CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.attempts > OLD.attempts THEN RAISE EXCEPTION 'claim refused'; END IF;
			RETURN NEW;
		END $$`)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'refused', 'e', '{}')`)
	testkit.Exec(t, pool, `CREATE TRIGGER refuse_claim BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_claim()`)

	_, err = s.MarkAndClaim(ctx, ids(first.Events), 10)
	require.ErrorContains(t, err, "claim refused")
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`),
		"the failed claim took its mark back")
}

// execQuery is a DB that cannot send batches.
type execQuery struct{ claim.DB }

// Given a DB that cannot send batches, MarkAndClaim still marks, then
// claims, in two round trips.
func TestMarkAndClaimWithoutBatches(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(execQuery{pool}, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 2)
	first, err := s.Claim(ctx, 1)
	require.NoError(t, err)
	next, err := s.MarkAndClaim(ctx, ids(first.Events), 10)
	require.NoError(t, err)
	require.Len(t, next.Events, 1)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'published' AND id = $1`, first.Events[0].ID))
}
