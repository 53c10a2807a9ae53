package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// Migration 6 puts the gate's try-lock in the trigger's WHEN clause by
// replacing the trigger, which would enable it: a trigger the operator had
// disabled, or enabled ALWAYS, before the upgrade stays as it was.
func TestGateWhenMigrationKeepsTheTriggersState(t *testing.T) {
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
		require.NoError(t, migrations.MigrateTo(ctx, conn, 5))
		_, err = conn.Exec(ctx, "ALTER TABLE outbox "+state.alter)
		require.NoError(t, err)

		require.NoError(t, migrations.MigrateTo(ctx, conn, 6))
		var enabled, def string
		require.NoError(t, conn.QueryRow(ctx, `SELECT tgenabled::text, pg_get_triggerdef(oid) FROM pg_trigger
			WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_notify'`).Scan(&enabled, &def))
		require.Equal(t, state.want, enabled, "after %s", state.alter)
		require.Contains(t, def, fmt.Sprintf("WHEN (pg_try_advisory_xact_lock_shared(%d, hashtext('outbox'::text)))", lockkey.Gate))
	}
}
