package main_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// outboxrelay sql | psql installs exactly what psql -v … -f
// sql/outboxrelay_install.sql does with the same mapping: the same columns,
// indexes and trigger, with the table's own status values and channel. It
// needs no database, and quotes names that hold quotes, backslashes and
// spaces.
func TestSQLCommandInstallsThroughPsql(t *testing.T) {
	t.Parallel()
	const (
		table   = `app's \events`
		channel = `app 'events'`
	)
	create := strings.Replace(dropInSchema, "app_events", pgx.Identifier{"shop", table}.Sanitize(), 1)
	vars := append([]string{"-v", "schema=shop", "-v", "table=" + table, "-v", "channel=" + channel}, dropInVars[2:]...)
	flags := append([]string{"sql", "--table=shop." + table, "--channel=" + channel}, dropInFlags[1:]...)

	code, script, stderr := runOnce(t, adminEnv("postgres://nobody@127.0.0.1:1/none?connect_timeout=1"), flags...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, script, `\set table 'app''s \\events'`)
	require.Contains(t, script, `\set status_pending 'NEW'`)
	require.Contains(t, script, `\set ordering_key 'entity_type,entity_id'`)

	viaCommand := testkit.NewDatabase(t)
	viaFile := testkit.NewDatabase(t)
	for _, db := range []string{viaCommand, viaFile} {
		testkit.Exec(t, testkit.NewPool(t, db), `CREATE SCHEMA shop; `+create)
	}
	cmd := exec.Command("psql", viaCommand, "-X", "-q")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	psql(t, viaFile, append(vars, "-f", "../../sql/outboxrelay_install.sql")...)

	describe := func(db string) string {
		return psql(t, db, "-v", "t=shop."+pgx.Identifier{table}.Sanitize(), "-c",
			`SELECT string_agg(column_name || ' ' || data_type || ' ' || coalesce(column_default, ''), E'\n' ORDER BY ordinal_position)
				FROM information_schema.columns WHERE table_schema = 'shop'`,
			"-c", `SELECT string_agg(indexdef, E'\n' ORDER BY indexname) FROM pg_indexes WHERE schemaname = 'shop'`,
			"-c", `SELECT string_agg(pg_get_triggerdef(t.oid), E'\n' ORDER BY tgname) FROM pg_trigger t
				JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'shop'`)
	}
	installed := describe(viaCommand)
	require.Equal(t, describe(viaFile), installed)
	for _, want := range []string{"seq bigint", "attempts integer", "WHERE ((state)::text = 'NEW'::text)",
		"(entity_type, entity_id, relay_seq) WHERE ((state)::text = ANY", "relay_seq bigint nextval(", "outboxrelay_notify AFTER INSERT", `'app ''events'''`} {
		require.Contains(t, installed, want)
	}

	// The trigger notifies the channel of the flags.
	pool := testkit.NewPool(t, viaCommand)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listener, err := pgx.Connect(ctx, viaCommand)
	require.NoError(t, err)
	defer listener.Close(context.Background())
	testkit.ListenAsRelay(t, listener, notify.ListenLockClass, channel)
	var emitted emitOut
	runJSON(t, adminEnv(viaCommand), &emitted, append([]string{"emit", "--table=shop." + table}, dropInFlags[1:]...)...)
	require.Equal(t, int64(1), emitted.Inserted)
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, channel, n.Channel)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM shop.`+pgx.Identifier{table}.Sanitize()+` WHERE state = 'NEW' AND seq = 1`))
}
