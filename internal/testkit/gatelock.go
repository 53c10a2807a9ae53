package testkit

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// GateLocksSQL selects, from pg_locks, the notification gate lock's holders
// ($2 true) or the requests waiting for it ($2 false), in the current
// database only: tests running side by side share the lock's key, each in
// its own database. $1 is the lock's class (notify.GateLockClass, passed
// in: notify's own tests cannot import a package that imports notify).
// Prefix it with a select list, such as "SELECT count(*) ".
const GateLocksSQL = `FROM pg_locks
	WHERE locktype = 'advisory' AND classid = $1 AND mode = 'ExclusiveLock' AND granted = $2
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// GateLocks counts the gate lock's holders (granted) or waiting requests
// (not granted) in pool's database; class is notify.GateLockClass.
func GateLocks(t testing.TB, pool *pgxpool.Pool, class int, granted bool) int64 {
	t.Helper()
	return QueryInt(t, pool, "SELECT count(*) "+GateLocksSQL, class, granted)
}
