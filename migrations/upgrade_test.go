package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// The upgrade from the last released schema (version 6) keeps every row as
// it was, pending, leased, backing off, published and dead-lettered alike,
// and a relay of this version claims every pending row that is due,
// unordered and ordered.
func TestUpgradeKeepsEveryRow(t *testing.T) {
	t.Parallel()
	url := testkit.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, migrations.MigrateTo(ctx, conn, 6))
	pool := testkit.NewPool(t, url)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, attempts, available_at, lease_id, published_at)
		SELECT 'order', (i % 7)::text, 'created', jsonb_build_object('n', i),
			CASE i % 5 WHEN 0 THEN 'published' WHEN 1 THEN 'failed' ELSE 'pending' END,
			i % 3, now() + CASE i % 5 WHEN 3 THEN interval '1 hour' ELSE interval '0' END,
			CASE i % 5 WHEN 3 THEN gen_random_uuid() END,
			CASE i % 5 WHEN 0 THEN now() END
		FROM generate_series(1, 500) AS i`)
	const rows = `SELECT string_agg(format('%s %s %s %s %s %s', id, event_id, status, attempts, available_at, lease_id), E'\n' ORDER BY id) FROM outbox`
	var before string
	require.NoError(t, pool.QueryRow(ctx, rows).Scan(&before))

	_, err = migrations.Migrate(ctx, conn, nil)
	require.NoError(t, err)
	require.NoError(t, migrations.Install(ctx, conn, testkit.MigratedTable(outboxsql.Settings{Ordering: "aggregate"}), nil))
	var after string
	require.NoError(t, pool.QueryRow(ctx, rows).Scan(&after))
	require.Equal(t, before, after)

	due := testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending' AND available_at <= now()`)
	for _, ordering := range []claim.Ordering{claim.OrderNone, claim.OrderAggregate} {
		s, err := claim.New(pool, claim.Config{Ordering: ordering})
		require.NoError(t, err)
		require.NoError(t, s.Check(ctx))
		n := 0
		var batches []claim.Batch
		for {
			b, err := s.Claim(ctx, 500)
			require.NoError(t, err)
			if len(b.Events) == 0 {
				break
			}
			n += len(b.Events)
			batches = append(batches, b)
		}
		for _, b := range batches { // for the next ordering's turn
			ids := make([]int64, len(b.Events))
			for i, e := range b.Events {
				ids[i] = e.ID
			}
			_, err = s.Release(ctx, b.Lease, ids)
			require.NoError(t, err)
		}
		if ordering == claim.OrderNone {
			require.Equal(t, int(due), n, "every due pending row claimed")
		} else {
			require.Positive(t, n)
		}
	}
}
