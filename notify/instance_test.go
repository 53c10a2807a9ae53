package notify

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// instanceHolder returns the backend that holds the instance lock of id in
// pool's database, 0 if none does.
func instanceHolder(t *testing.T, pool *pgxpool.Pool, id uint32) int64 {
	t.Helper()
	return testkit.QueryInt(t, pool, `SELECT coalesce(max(pid), 0) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2
		  AND mode = 'ExclusiveLock' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int32(InstanceLockClass), int32(id))
}

// With Config.Instance the listening connection holds an instance lock
// under an id of its own, and Instance names it; when the connection is
// lost (its backend terminated) the id is given up at once, and the next
// connection holds a new one. Without it, no lock and no id.
func TestListenerHoldsAnInstanceLockPerConnection(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	h := start(t, Config{ConnConfig: parseConfig(t, url), Pinger: pool, Instance: true})
	pid := h.awaitListening(t)
	first := h.l.Instance()
	require.NotZero(t, first)
	require.EqualValues(t, pid, instanceHolder(t, pool, first), "the listening connection holds the lock")

	testkit.Exec(t, pool, `SELECT pg_terminate_backend($1)`, int32(pid))
	next := h.awaitListening(t)
	second := h.l.Instance()
	require.NotZero(t, second)
	require.NotEqual(t, first, second, "a new connection draws a new id")
	require.EqualValues(t, next, instanceHolder(t, pool, second))
	require.Zero(t, instanceHolder(t, pool, first), "the old id went with its session")

	plain := start(t, Config{ConnConfig: parseConfig(t, url), Pinger: pool})
	plain.awaitListening(t)
	require.Zero(t, plain.l.Instance())
	require.EqualValues(t, 1, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int4::oid
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int32(InstanceLockClass)), "only the first listener's lock")
}
