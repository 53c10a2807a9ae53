package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// A direct connection is a session; the same database through PgBouncer
// in transaction pooling is not, and is named as such.
func TestRequireSessionFindsATransactionPool(t *testing.T) {
	t.Parallel()
	direct := testkit.NewDatabase(t)
	for _, tc := range []struct {
		url  string
		want error
	}{
		{direct, nil},
		{testkit.NewPgBouncer(t, direct), migrations.ErrTransactionPooled},
	} {
		cfg, err := pgx.ParseConfig(tc.url)
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		conn, err := pgx.ConnectConfig(context.Background(), cfg)
		require.NoError(t, err)
		require.ErrorIs(t, migrations.RequireSession(context.Background(), conn), tc.want, tc.url)
		require.NoError(t, conn.Close(context.Background()))
	}
}
