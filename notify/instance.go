package notify

// The instance lock: a Listener with Config.Instance holds the advisory
// lock (InstanceLockClass, id) exclusive on its listening connection, id a
// random 32-bit number drawn for that connection, so the lock lives
// exactly as long as the connection does. It names the relay process
// while that process lives: the claim store stamps the id on its leases
// (claim.Config.Instance), and another relay that finds the lock gone from
// pg_locks knows that the claims under it will never be settled by their
// relay, and takes their rows over (claim.Store.Rescue).
//
// Each connection draws a new id: after a partition the server may keep
// the old connection's session, and its lock, until it notices the
// connection gone, and the new connection could not take the old id
// meanwhile. A drawn id that another session holds (two relays drew the
// same number) is drawn again.

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
)

// InstanceLockClass is the first key of the instance lock; the second is
// the instance id, as an int4 (pg_locks shows it as an unsigned objid).
const InstanceLockClass = lockkey.Relay

// instanceDraws bounds the ids a connection draws: with a few relays
// holding ids among four billion, a second draw is already unlikely.
const instanceDraws = 8

// instanceLockTimeout bounds the statement that takes the lock; a
// connection that does not answer within it is left to the heartbeat.
const instanceLockTimeout = 5 * time.Second

// instanceLockSQL tries the lock: $1 InstanceLockClass, $2 the id as int4.
const instanceLockSQL = `SELECT pg_try_advisory_lock($1::int4, $2::int4)`

// Instance returns the id of the instance lock the listener holds now,
// and 0 while it holds none: Config.Instance is off, the listener is not
// connected, or its connection was found lost. An id, once given up, is
// never returned again by this listener unless drawn anew.
func (l *Listener) Instance() uint32 { return l.instance.Load() }

// takeInstanceLock draws an id and takes its lock on conn, a new listening
// connection, unless Config.Instance is off. A failure is logged: the
// listener then holds no id until its next connection, and the claims made
// meanwhile carry none (they wait for their lease if the relay dies).
func (l *Listener) takeInstanceLock(ctx context.Context, conn *pgx.Conn) {
	if !l.cfg.Instance {
		return
	}
	stmtCtx, cancel := context.WithTimeout(ctx, instanceLockTimeout)
	defer cancel()
	for range instanceDraws {
		id := rand.Uint32()
		if id == 0 {
			continue // 0 means none
		}
		var got bool
		if err := conn.QueryRow(stmtCtx, instanceLockSQL, int32(InstanceLockClass), int32(id)).Scan(&got); err != nil {
			if ctx.Err() == nil { // not the session's end
				l.log.Warn("taking the instance lock failed; claims carry no instance until the next connection", l.errAttr(err))
			}
			return
		}
		if got {
			l.instance.Store(id)
			l.log.Debug("listener holds the instance lock", "instance", id)
			return
		}
	}
	l.log.Warn("no free instance id drawn; claims carry no instance until the next connection", "draws", instanceDraws)
}
