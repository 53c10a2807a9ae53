package notify

// The listen lock: while a Listener listens it holds the advisory lock
// (ListenLockClass, hashtext(channel)) exclusive, on its listening
// connection, so the lock lives exactly as long as its LISTEN does. The
// outbox trigger tries the lock shared in its WHEN clause, and notifies
// only when that try fails: while no relay listens (none runs, or none is
// connected), producers skip NOTIFY, which serializes their commits. A
// producer that skipped keeps the lock shared to its commit, so a listener
// taking the lock waits for every such producer to end, and the wake-up it
// signals then leads to a claim that sees their events.
//
// One listener of a channel holds the lock at a time; notifications reach
// every listener all the same. One that finds the lock held by another
// tries again every listenLockRetry (with a Pinger: on its heartbeat), so
// when the holder's session ends another listener takes over; meanwhile
// inserts are found as any unnotified insert is (the relay's sequence check,
// the fallback poll).

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
)

// ListenLockClass is the first key of the listen lock; the second is
// hashtext(channel). The trigger in migrations/ and sql/ spells it out.
const ListenLockClass = lockkey.Listen

// listenLockRetry is how often a listener without the listen lock tries
// for it again (the heartbeat's interval while it lacks the lock).
const listenLockRetry = time.Second

// listenLockWait bounds a listener's wait for the lock behind producers
// that hold it shared (those that found no relay listening): while it
// waits, its connection delivers no notification. A longer producer
// transaction makes it try again later.
const listenLockWait = 250 * time.Millisecond

// Listen lock statements: $1 ListenLockClass, $2 the channel.
const (
	listenTryLockSQL = `SELECT pg_try_advisory_lock($1::int4, hashtext($2))`
	// listenLockHeldSQL: whether another session holds the lock, in this
	// database (advisory locks are per database).
	listenLockHeldSQL = `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = hashtext($2)::oid
		  AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`
	// listenLockSQL waits for the lock for at most $3 (lock_timeout, set
	// first: the listening connection waits on no other lock).
	listenLockSQL = `SELECT set_config('lock_timeout', $3, false), pg_advisory_lock($1::int4, hashtext($2))`
)

// HoldsListenLock reports whether this listener holds the listen lock now.
func (l *Listener) HoldsListenLock() bool { return l.holdsLock.Load() }

// takeListenLock takes the listen lock on the listening connection unless
// it holds it, and reports whether it took it now. It waits behind
// producers that hold the lock shared, for listenLockWait at most, but not
// behind another listener holding it. A failure is logged and left for the
// next try.
func (l *Listener) takeListenLock(ctx context.Context, conn *pgx.Conn) bool {
	if l.holdsLock.Load() {
		return false
	}
	class := int32(ListenLockClass)
	var got bool
	err := conn.QueryRow(ctx, listenTryLockSQL, class, l.cfg.Channel).Scan(&got)
	if err == nil && !got {
		var held bool
		if err = conn.QueryRow(ctx, listenLockHeldSQL, class, l.cfg.Channel).Scan(&held); err == nil && !held {
			var ignored string
			err = conn.QueryRow(ctx, listenLockSQL, class, l.cfg.Channel,
				listenLockWait.String()).Scan(&ignored, nil)
			got = err == nil
		}
	}
	var pgErr *pgconn.PgError
	switch {
	case got:
		l.holdsLock.Store(true)
		l.log.Debug("listener holds the listen lock: producers notify", "channel", l.cfg.Channel)
		return true
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
		l.log.Debug("listen lock busy with producers; trying again later", "channel", l.cfg.Channel)
	case err != nil && ctx.Err() == nil:
		l.log.Warn("taking the listen lock failed; trying again later", l.errAttr(err))
	default:
		l.log.Debug("another listener holds the listen lock", "channel", l.cfg.Channel)
	}
	return false
}
