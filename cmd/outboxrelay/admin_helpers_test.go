package main_test

import (
	"encoding/json"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// adminEnv is the environment of an admin subcommand: its database and
// nothing else of the caller's.
func adminEnv(databaseURL string, extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + databaseURL}, extra...)
}

// runJSON runs the binary, which must succeed, decodes its stdout into v
// and returns its stderr.
func runJSON(t *testing.T, env []string, v any, args ...string) string {
	t.Helper()
	code, stdout, stderr := runOnce(t, env, append(args, "--json")...)
	require.Equal(t, 0, code, "%v: %s", args, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), v), stdout)
	return stderr
}

// seedOutbox inserts one event into the relay's own outbox per row:
// status, aggregate id, event type. Failed events have 25 attempts and an
// error; each event is a minute younger than the one before, the last
// created now.
func seedOutbox(t *testing.T, pool *pgxpool.Pool, rows [][3]string) {
	t.Helper()
	for i, r := range rows {
		testkit.Exec(t, pool, `INSERT INTO outbox (status, aggregate_type, aggregate_id, event_type, payload, attempts, last_error, created_at, available_at)
			VALUES ($1, 'order', $2, $3, '{}', CASE WHEN $1 = 'failed' THEN 25 ELSE 0 END,
				CASE WHEN $1 = 'failed' THEN 'boom ' || $3 END, now() - $4 * interval '1 minute', now() - $4 * interval '1 minute')`,
			r[0], r[1], r[2], len(rows)-1-i)
	}
}

// dropInTable is a team's own outbox table, with its own column names and
// status values, made ready by sql/outboxrelay_install.sql (in ordered
// mode). Its flags are what every subcommand needs to find its way in it.
type dropInTable struct {
	URL   string
	Pool  *pgxpool.Pool
	Flags []string
}

const dropInSchema = `CREATE TABLE app_events (
	uid         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	entity_type varchar(100) NOT NULL,
	entity_id   varchar(100) NOT NULL,
	kind        text NOT NULL,
	body        jsonb NOT NULL,
	state       varchar(20) NOT NULL DEFAULT 'NEW',
	occurred_at timestamptz NOT NULL DEFAULT now()
)`

// dropInVars are the install script's variables for app_events.
var dropInVars = []string{"-v", "table=app_events", "-v", "id_column=seq", "-v", "event_id_column=uid",
	"-v", "status_column=state", "-v", "created_at_column=occurred_at",
	"-v", "status_pending=NEW", "-v", "status_published=SENT", "-v", "status_failed=DEAD",
	"-v", "ordering=aggregate", "-v", "ordering_key=entity_type,entity_id"}

// dropInFlags are the same mapping as the binary's flags.
var dropInFlags = []string{"--table=public.app_events", "--column-id=seq", "--column-event-id=uid",
	"--column-aggregate-type=entity_type", "--column-aggregate-id=entity_id", "--column-event-type=kind",
	"--column-payload=body", "--column-status=state", "--column-created-at=occurred_at",
	"--status-pending=NEW", "--status-published=SENT", "--status-failed=DEAD", "--ordering=aggregate"}

func newDropInTable(t *testing.T) dropInTable {
	t.Helper()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	testkit.Exec(t, pool, dropInSchema)
	psql(t, dbURL, append(dropInVars, "-f", "../../sql/outboxrelay_install.sql")...)
	return dropInTable{URL: dbURL, Pool: pool, Flags: dropInFlags}
}

// args is the subcommand's arguments followed by the table's flags.
func (d dropInTable) args(args ...string) []string {
	return append(args, d.Flags...)
}

// leastPrivilegeURL creates the relay's least-privilege role with
// sql/outboxrelay_role.sql for the table and returns the database URL as
// that role (trust authentication on 127.0.0.1). The role is dropped when
// the test ends.
func leastPrivilegeURL(t *testing.T, dbURL string, pool *pgxpool.Pool, vars ...string) string {
	t.Helper()
	role := testkit.UniqueName("admin_role")
	t.Cleanup(func() {
		testkit.Exec(t, pool, `DROP OWNED BY `+pgx.Identifier{role}.Sanitize())
		testkit.Exec(t, pool, `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	psql(t, dbURL, append(append([]string{"-v", "role=" + role}, vars...), "-f", "../../sql/outboxrelay_role.sql")...)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}
