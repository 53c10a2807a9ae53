package claim_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// A transaction that has inserted an event and not yet ended holds the
// frontier below the rows written after it, so the floor parks none of
// them; the store watches them all the same: ParkedDue reports a row
// scheduled an hour ahead, and a due one that another transaction holds,
// which a claim could not take, is to be looked at again within the
// recheck interval; once a claim takes it, only the scheduled row is left.
func TestRowsAboveAHeldFrontierAreWatched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(ctx) //nolint:errcheck // only holds the frontier
	_, err = hold.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('cart', 'held', 'expired', '{}')`)
	require.NoError(t, err)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, available_at)
		VALUES ('cart', 'later', 'expired', '{}', now() + interval '1 hour'), ('cart', 'due', 'expired', '{}', now())`)
	locked, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer locked.Rollback(ctx) //nolint:errcheck // released below
	_, err = locked.Exec(ctx, `SELECT 1 FROM outbox WHERE aggregate_id = 'due' FOR UPDATE`)
	require.NoError(t, err)

	for range 3 {
		require.NoError(t, s.Advance(ctx))
	}
	require.Zero(t, s.Floor(), "the floor passed rows an open insert may still commit below")
	d, ok := s.ParkedDue()
	require.True(t, ok, "no wake-up for the rows above the floor")
	require.Zero(t, d, "the due row: due now")

	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, b.Events, "claimed the locked row or the scheduled one")
	d, ok = s.ParkedDue()
	require.True(t, ok, "the due row the claim could not take is not looked at again")
	require.LessOrEqual(t, d, 25*time.Millisecond, "the due row the claim could not take is looked at again only in %s", d)

	require.NoError(t, locked.Rollback(ctx))
	b, err = s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, "due", b.Events[0].AggregateID)
	d, ok = s.ParkedDue()
	require.True(t, ok, "the scheduled row is no longer watched")
	require.Greater(t, d, 59*time.Minute, "the row claimed is still watched")
}

// A transaction that deletes from the outbox but inserts nothing (a
// Cancel held open) holds no frontier: the floor passes the rows inserted
// and published after it began.
func TestACancelHeldOpenHoldsNoFrontier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	cancel, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer cancel.Rollback(ctx) //nolint:errcheck // only holds its lock
	_, err = cancel.Exec(ctx, `DELETE FROM outbox WHERE event_id = gen_random_uuid()`)
	require.NoError(t, err)
	testkit.InsertEvents(t, pool, 10)
	require.Equal(t, 10, publishAll(t, s))
	for range 2 {
		require.NoError(t, s.Advance(ctx))
	}
	require.Equal(t, int64(10), s.Floor(), "the Cancel held the frontier")
}

// An ordered claim is given every parked row; one that is due by the
// store's clock but that the claim cannot take (here, not yet due by the
// database's) is looked at again only after the recheck interval, not at
// once: an empty claim asks for the next look (ParkedDue), and a due time
// left in the past would have the relay claim again and again without a
// pause for as long as the row stays untaken.
func TestOrderedClaimLooksAgainAtAnUntakenParkedRowOnlyAfterTheRecheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, pool := newOrderedStore(t, claim.Config{Now: clock})
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, available_at)
		VALUES ('cart', 'later', 'expired', '{}', now() + interval '1 hour')`)
	for range 2 {
		require.NoError(t, s.Advance(ctx))
	}
	require.Equal(t, 1, s.Parked())
	mu.Lock()
	now = now.Add(2 * time.Hour) // due by the store's clock
	mu.Unlock()
	d, ok := s.ParkedDue()
	require.True(t, ok)
	require.Zero(t, d)

	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, b.Events, "claimed a row not due by the database's clock")
	d, ok = s.ParkedDue()
	require.True(t, ok)
	require.Positive(t, d, "the untaken parked row is due again at once: the relay would claim without a pause")
	require.LessOrEqual(t, d, 25*time.Millisecond)
}
