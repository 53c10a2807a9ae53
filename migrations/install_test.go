package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// Relays started together all install the ordered mode's indexes at once:
// each succeeds, and one valid index of each kind results (unserialized, two of three
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
			errs[i] = migrations.Install(ctx, conn, testkit.MigratedTable(outboxsql.Settings{Ordering: "aggregate"}), nil)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
		WHERE indrelid = 'outbox'::regclass AND indisvalid AND indkey::text = '3 4 ' || `+relaySeqAttnum+``), "the ordered mode's two indexes, once each")
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
		WHERE indrelid = 'outbox'::regclass AND indisvalid AND indkey::text = '3 4 ' || `+relaySeqAttnum+`
		  AND pg_get_expr(indpred, indrelid) LIKE '%last_error%'`), "the index of the rows a publish failed")
}

// relaySeqAttnum is relay_seq's column number in outbox, in SQL: the
// ordering indexes lead with the aggregate (columns 3 and 4), then it.
const relaySeqAttnum = `(SELECT attnum FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'relay_seq')`

// An ordering index whose concurrent build failed half-way is left invalid:
// the next install drops it and builds it again.
func TestInstallRebuildsAnInvalidIndex(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	// A unique index on duplicate keys fails its build and stays, invalid.
	testkit.InsertEvents(t, pool, 2)
	testkit.Exec(t, pool, `UPDATE outbox SET aggregate_id = '1'`)
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `CREATE UNIQUE INDEX CONCURRENTLY outbox_relay_ordering_idx
		ON outbox (aggregate_type, aggregate_id) WHERE status IN ('pending', 'failed')`)
	require.Error(t, err)
	require.Equal(t, int64(0), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
		WHERE indexrelid = 'outbox_relay_ordering_idx'::regclass AND indisvalid`))

	require.NoError(t, migrations.Install(context.Background(), conn,
		testkit.MigratedTable(outboxsql.Settings{Ordering: "aggregate"}), nil))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
		WHERE indexrelid = 'outbox_relay_ordering_idx'::regclass AND indisvalid AND NOT indisunique`))
}

// Migration 7 adds the listen lock to the trigger by replacing it, which
// would enable it and could change its arguments: each trigger calling
// outboxrelay_notify() keeps its state, its channel and its gate sequence.
func TestListenMigrationKeepsTheTriggers(t *testing.T) {
	t.Parallel()
	for _, state := range []struct{ alter, want string }{
		{"DISABLE TRIGGER outbox_notify", "D"},
		{"ENABLE ALWAYS TRIGGER outbox_notify", "A"},
		{"ENABLE TRIGGER outbox_notify", "O"},
	} {
		url := testkit.NewDatabase(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		require.NoError(t, migrations.MigrateTo(ctx, conn, 6))
		// A channel of the operator's own, set as version 6 would.
		_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT
			WHEN (pg_try_advisory_xact_lock_shared(%d, hashtext('app ''events'''))) EXECUTE FUNCTION outboxrelay_notify('app ''events''', 'public.outbox_wakeup')`,
			lockkey.Gate))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "ALTER TABLE outbox "+state.alter)
		require.NoError(t, err)

		_, err = migrations.Migrate(ctx, conn, nil)
		require.NoError(t, err)
		var enabled, def string
		require.NoError(t, conn.QueryRow(ctx, `SELECT tgenabled::text, pg_get_triggerdef(oid) FROM pg_trigger
			WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_notify'`).Scan(&enabled, &def))
		require.Equal(t, state.want, enabled, "after %s", state.alter)
		require.Contains(t, def, fmt.Sprintf("WHEN (((NOT pg_try_advisory_xact_lock_shared(%d, hashtext('app ''events'''::text))) "+
			"AND pg_try_advisory_xact_lock_shared(%d, hashtext('app ''events'''::text))))", lockkey.Listen, lockkey.Gate))
		require.Contains(t, def, "EXECUTE FUNCTION outboxrelay_notify('app ''events''', 'public.outbox_wakeup')")
	}
}
