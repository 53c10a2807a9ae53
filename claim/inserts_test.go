package claim_test

import (
	"context"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// LastInsertID follows the id sequence: every insert moves it, a
// rolled-back or not yet committed one too, and claims do not.
func TestLastInsertIDFollowsTheIDSequence(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	last := func() int64 {
		t.Helper()
		id, err := s.LastInsertID(ctx)
		require.NoError(t, err)
		return id
	}
	require.Zero(t, last(), "nothing inserted yet")
	testkit.InsertEvents(t, pool, 5)
	require.EqualValues(t, 5, last())

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', '1', 'created', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	require.EqualValues(t, 8, last(), "an insert not yet committed counts")
	require.NoError(t, tx.Rollback(ctx))
	require.EqualValues(t, 8, last(), "and stays counted once rolled back")

	_, err = s.Claim(ctx, 10)
	require.NoError(t, err)
	require.EqualValues(t, 8, last())
}

// A table whose id column owns no sequence gives ErrInsertsUnreadable, and
// the relay reads the rate from the ids it claims.
func TestLastInsertIDWithoutASequence(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, `CREATE TABLE plain_ids (LIKE outbox INCLUDING DEFAULTS)`)
	testkit.Exec(t, pool, `ALTER TABLE plain_ids ALTER COLUMN id DROP IDENTITY IF EXISTS`)
	s, err := claim.New(pool, claim.Config{Table: "plain_ids"})
	require.NoError(t, err)
	_, err = s.LastInsertID(context.Background())
	require.ErrorIs(t, err, claim.ErrInsertsUnreadable)
}

// A role that may not read the sequence gets ErrInsertsUnreadable, naming
// the grant, so the relay stops asking.
func TestLastInsertIDWithoutThePrivilege(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	role := testkit.UniqueName("no_seq")
	testkit.Exec(t, pool, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		testkit.Exec(t, pool, `DROP OWNED BY `+role)
		testkit.Exec(t, pool, `DROP ROLE `+role)
	})
	testkit.Exec(t, pool, `GRANT SELECT, UPDATE, DELETE ON outbox TO `+role)
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	u.User = neturl.User(role)
	s, err := claim.New(testkit.NewPool(t, u.String()), claim.Config{})
	require.NoError(t, err)
	_, err = s.LastInsertID(context.Background())
	require.ErrorIs(t, err, claim.ErrInsertsUnreadable)
	require.ErrorContains(t, err, "grant SELECT")
}

// NotifyWaiters sees transactions queued behind PostgreSQL's NOTIFY lock:
// sixteen connections committing a NOTIFY each, as fast as they can, queue
// one behind another on it; a plain insert never takes it. The lock is the
// server's, so other tests' notifications may add to the count but not
// take from it.
func TestNotifyWaitersCountsCommitsQueuedOnTheNotifyLock(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	notifiers := testkit.NewPoolOf(t, url, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var producers sync.WaitGroup
	t.Cleanup(func() { cancel(); producers.Wait() })
	channel := testkit.UniqueName("contended")
	for range 16 {
		producers.Go(func() {
			for ctx.Err() == nil {
				_, _ = notifiers.Exec(ctx, `SELECT pg_notify($1, '')`, channel)
			}
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := s.NotifyWaiters(ctx)
		require.NoError(t, err)
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no waiter on the NOTIFY lock seen in 20s while 16 connections committed NOTIFYs")
	}
}
