package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ListenAsRelay has conn LISTEN on channel and take the listen lock
// (class, hashtext(channel)) as a relay's listener does, so that the
// outbox trigger notifies it: the trigger notifies only while some session
// holds that lock. class is notify.ListenLockClass, passed in: notify's own
// tests cannot import a package that imports notify.
func ListenAsRelay(t testing.TB, conn *pgx.Conn, class int, channel string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatalf("testkit: listen: %v", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, hashtext($2))", class, channel); err != nil {
		t.Fatalf("testkit: listen lock: %v", err)
	}
}

// ListenLocks counts the sessions holding the listen lock of class (all
// channels) in pool's database.
func ListenLocks(t testing.TB, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, class int) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), "SELECT count(*) "+GateLocksSQL, class, true).Scan(&n); err != nil {
		t.Fatalf("testkit: listen locks: %v", err)
	}
	return n
}
