package migrations_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/testkit"
)

// Relays started together all build the ordering index at once: each
// succeeds, and one valid index results (unserialized, two of three
// failed with a deadlock, or dropped another's build in progress).
func TestOrderingIndexBuiltConcurrently(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 20000)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(context.Background())
			errs[i] = migrations.EnsureOrderingIndex(ctx, conn, []string{"aggregate_type", "aggregate_id"}, nil)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
		WHERE indexrelid = 'outbox_ordering_idx'::regclass AND indisvalid`))
}
