package inbox_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// The drop-in file inbox.sql and Migrate make the same schema: the file run
// by hand in schema a, Migrate in schema b (twice: it is idempotent).
func TestDropInFileAndMigrateMatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, sharedDatabaseURL)
	a, b := uniqueName("dropin"), uniqueName("migrate")
	for _, s := range []string{a, b} {
		_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{s}.Sanitize())
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
			require.NoError(t, err)
		})
	}
	file, err := os.ReadFile("inbox.sql")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL search_path = `+pgx.Identifier{a}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, string(file))
		return err
	}))
	require.NoError(t, inbox.Migrate(ctx, pool, b+".inbox"))
	require.NoError(t, inbox.Migrate(ctx, pool, b+".inbox"))

	schema := func(s string) []string {
		rows, err := pool.Query(ctx, `
			SELECT format('column %s %s %s %s', column_name, data_type, is_nullable, coalesce(column_default, '-'))
			FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'inbox'
			UNION ALL
			SELECT format('index %s %s', indexname, replace(indexdef, $1 || '.', ''))
			FROM pg_indexes WHERE schemaname = $1 AND tablename = 'inbox'
			UNION ALL
			SELECT format('constraint %s', pg_get_constraintdef(c.oid))
			FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace
			WHERE n.nspname = $1 AND r.relname = 'inbox'
			ORDER BY 1`, s)
		require.NoError(t, err)
		defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return defs
	}
	want := schema(a)
	require.Len(t, want, 6+3) // six columns, two indexes, the primary key
	require.Equal(t, want, schema(b))
}

// Migrate names the table (and its index) as told.
func TestMigrateTableName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, sharedDatabaseURL)
	table := uniqueName("Custom Inbox") // needs quoting
	require.NoError(t, inbox.Migrate(ctx, pool, table))
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP TABLE `+pgx.Identifier{table}.Sanitize())
		require.NoError(t, err)
	})
	var index string
	require.NoError(t, pool.QueryRow(ctx, `SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%brin%'`, table).Scan(&index))
	require.Equal(t, table+"_updated_at_brin", index)
	require.True(t, strings.HasPrefix(inbox.SchemaSQL(pgx.Identifier{"s", "t"}), "--"))

	require.ErrorContains(t, inbox.Migrate(ctx, pool, "a.b.c"), "want table or schema.table")
}
