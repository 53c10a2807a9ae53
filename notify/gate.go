package notify

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	tablewriters "github.com/outboxrelay/outboxrelay/internal/writers"
)

// GateLockClass is the first key of the advisory lock a busy relay holds
// and the outbox trigger tries, shared; the second is hashtext(channel).
// The trigger in migrations/ and sql/ spells it out. (Triggers of version 2
// try lockkey.GateV2 and read the gate sequence instead.)
const GateLockClass = lockkey.Gate

// GateApplicationName is the application_name of the session that holds
// the gate, for the length of the gate's transaction: pg_stat_activity
// shows it idle in transaction while the gate is closed, holding no lock
// but the gate's.
const GateApplicationName = "outboxrelay-gate"

// DefaultGateTTL is how long a closed gate stays closed unless refreshed.
const DefaultGateTTL = 2 * time.Second

// Open looks again for the producers it waits for after gateWritersPoll,
// doubling the pause up to gateWritersPollMax: their transactions are
// mostly the length of an insert and a commit, and reading pg_locks takes
// every lock partition's lock, so a long wait should not read it often.
const (
	gateWritersPoll    = time.Millisecond
	gateWritersPollMax = 50 * time.Millisecond
)

// Gate statements. $1 of the sequence statements is the gate sequence's
// schema-qualified, quoted name; its value is the time, in milliseconds
// since the epoch by PostgreSQL's clock, until which triggers of earlier
// versions skip NOTIFY.
const (
	gateOpenSQL  = `SELECT setval($1::regclass, 0, true)`
	gateCloseSQL = `SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $2, true)`
	gateCheckSQL = `SELECT pg_sequence_last_value($1::regclass)`
	// gateSettingsSQL: $1 the TTL in milliseconds, $2 GateApplicationName;
	// the lock may wait as long as it takes.
	gateSettingsSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true),
		set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true),
		set_config('application_name', $2, true)`
	// gateLockSQL: $1 the channel, $2 GateLockClass.
	gateLockSQL    = `SELECT pg_advisory_xact_lock($2::int4, hashtext($1))`
	gateRefreshSQL = `SELECT 1`
)

// GateDB runs the gate's statements; a *pgxpool.Pool satisfies it.
type GateDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Gate opens and closes the outbox trigger's notifications.
//
// NOTIFY serializes the commits of the transactions that send it, so the
// relay closes the gate while it is busy claiming anyway, and opens it
// before it waits. Closed, the gate is an exclusive advisory lock that the
// relay holds in a transaction of its own: the trigger tries the lock
// shared in its WHEN clause and, failing, is skipped: no trigger event, no
// function call, no NOTIFY. That failed try is all a producer pays while
// the gate is closed.
//
// The transaction's idle_in_transaction_session_timeout is TTL: a relay
// that stops refreshing the gate (Close again) has the server end it, and a
// relay that dies releases it with its connection, so neither silences the
// trigger for longer. Holding it takes one connection of db while closed.
//
// Close does not wait for the lock: producers that found the gate open
// keep it shared to their commit, and a request waiting behind them already
// makes every new try fail. The request waits, in the background, for as
// long as they run.
//
// Open ends that transaction and then waits for every transaction that
// held the table's ROW EXCLUSIVE lock at that moment, which covers every
// producer that may have found the gate closed; a claim after Open returns
// therefore sees every event whose producer did not notify.
//
// Close and Open also set the gate sequence, which triggers installed by
// earlier versions read.
type Gate struct {
	db       GateDB
	channel  string
	sequence string
	table    string
	ttl      time.Duration

	mu sync.Mutex // serializes Open and Close
	// held is the transaction holding the gate lock; pending the request
	// for it while not yet granted.
	held    pgx.Tx
	pending *lockRequest
}

// NewGate returns the gate of channel on the outbox table (an identifier
// such as pgx.Identifier{"public", "outbox"}), kept for earlier triggers in
// the sequence named by sequence (pgx.Identifier{"public",
// "outbox_wakeup"}). A ttl of 0 means DefaultGateTTL.
func NewGate(db GateDB, channel string, table, sequence pgx.Identifier, ttl time.Duration) (*Gate, error) {
	if channel == "" || len(channel) > maxChannelBytes {
		return nil, fmt.Errorf("notify: gate channel %q: must be 1 to %d bytes", channel, maxChannelBytes)
	}
	for what, id := range map[string]pgx.Identifier{"table": table, "sequence": sequence} {
		if len(id) == 0 || len(id) > 2 {
			return nil, fmt.Errorf("notify: gate %s %v: give a name, optionally schema-qualified", what, []string(id))
		}
		for _, part := range id {
			if part == "" {
				return nil, fmt.Errorf("notify: gate %s: empty name", what)
			}
		}
	}
	if ttl == 0 {
		ttl = DefaultGateTTL
	}
	if ttl < 0 {
		return nil, fmt.Errorf("notify: gate TTL %s is negative", ttl)
	}
	return &Gate{db: db, channel: channel, sequence: sequence.Sanitize(), table: table.Sanitize(), ttl: ttl}, nil
}

// TTL is how long Close keeps the gate closed.
func (g *Gate) TTL() time.Duration { return g.ttl }

// Check proves the gate sequence exists and is readable.
func (g *Gate) Check(ctx context.Context) error {
	if _, err := g.db.Exec(ctx, gateCheckSQL, g.sequence); err != nil {
		return fmt.Errorf("check gate %s: %w", g.sequence, err)
	}
	return nil
}

// Open makes the trigger notify again, then waits until every producer that
// may have found the gate closed has committed or rolled back. Producers
// arriving meanwhile notify. ctx bounds the wait.
func (g *Gate) Open(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// The lock first, and on a bound of its own: ending it must not wait
	// for a connection of db, and a relay leaving calls Open with little
	// time left.
	g.release()
	if _, err := g.db.Exec(ctx, gateOpenSQL, g.sequence); err != nil {
		return fmt.Errorf("open gate: %w", err)
	}
	if err := g.waitWriters(ctx); err != nil {
		return fmt.Errorf("open gate: %w", err)
	}
	return nil
}

// waitWriters waits until none of the transactions that hold the table's
// ROW EXCLUSIVE lock now still holds it. A lock is released after its
// transaction's commit is visible, so a claim sent after this returns sees
// their rows.
func (g *Gate) waitWriters(ctx context.Context) error {
	var writers []string // nil at first: every writer
	pause := gateWritersPoll
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		var err error
		if writers, err = tablewriters.Of(ctx, g.db, g.table, writers); err != nil {
			return fmt.Errorf("producers in flight: %w", err)
		}
		if len(writers) == 0 {
			return nil
		}
		t.Reset(pause)
		pause = min(2*pause, gateWritersPollMax)
		select {
		case <-ctx.Done():
			return fmt.Errorf("producers in flight: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Close stops the trigger's notifications for TTL. Call it again before TTL
// has passed to keep the gate closed.
//
// While the lock is held by another relay that closed the gate, or by
// producers that found it open and have not committed yet, Close's request
// waits for it in the background; a waiting request silences the trigger
// as a granted one does.
//
// The transaction holding the lock runs nothing else, so that it holds no
// other lock (a setval in it would keep the sequence from DDL until it
// ends): the sequence is set through db.
//
// An error from an earlier request for the lock, which failed in the
// background (its connection lost, say), is returned once the request has
// been made again: the gate is closed all the same.
func (g *Gate) Close(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	failed := g.hold(ctx)
	if _, err := g.db.Exec(ctx, gateCloseSQL, g.sequence, g.ttl.Milliseconds()); err != nil {
		// The caller takes the gate for open: so must the trigger.
		g.release()
		return fmt.Errorf("close gate: %w", err)
	}
	if failed != nil {
		return fmt.Errorf("close gate: the request for the lock failed, and was made again: %w", failed)
	}
	return nil
}

// gateLock is the outcome of a request for the gate lock.
type gateLock struct {
	tx  pgx.Tx // holding the lock; nil on error
	err error
}

// lockRequest is a request for the gate lock under way, in a goroutine of
// its own: its backend waits in the lock's queue for as long as the lock's
// holders run.
type lockRequest struct {
	done    chan gateLock // its outcome, once
	abandon context.CancelFunc
}

// cutWait bounds the wait for a request whose connection was cut to leave
// the server.
const cutWait = time.Second

// hold keeps the gate lock, or requests it; it returns the error of an
// earlier request that failed, which it makes again. A statement in the
// holding transaction restarts its idle timeout.
func (g *Gate) hold(ctx context.Context) error {
	failed := g.settle()
	switch {
	case g.pending != nil:
		return nil
	case g.held != nil:
		if _, err := g.held.Exec(ctx, gateRefreshSQL); err == nil {
			return nil
		}
		// The session ended (its idle timeout, say), and the lock with it.
		g.rollback()
	}
	lockCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	r := &lockRequest{done: make(chan gateLock, 1), abandon: abandon}
	g.pending = r
	go func() { r.done <- g.request(lockCtx) }()
	return failed
}

// request begins the gate's transaction and waits in it for the lock. A
// request that fails has left the server when it returns: one cut off by
// ctx while it waits has its connection closed by pgx, which first sends
// the server a cancel request, over a connection of its own, in the
// background, so the backend leaves the lock's queue a moment after the
// statement has returned; request waits for pgx's cleanup of the
// connection, which ends once the backend has gone (cutWait at most).
func (g *Gate) request(ctx context.Context) gateLock {
	tx, err := g.db.Begin(ctx)
	if err != nil {
		return gateLock{err: err}
	}
	b := &pgx.Batch{}
	b.Queue(gateSettingsSQL, strconv.FormatInt(max(g.ttl.Milliseconds(), 1), 10), GateApplicationName)
	b.Queue(gateLockSQL, g.channel, int32(GateLockClass))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		// Read while the connection is still this request's: the rollback
		// gives it back to the pool.
		var cleanup <-chan struct{}
		if conn := tx.Conn().PgConn(); conn.IsClosed() {
			cleanup = conn.CleanupDone()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
		if cleanup != nil {
			t := time.NewTimer(cutWait)
			defer t.Stop()
			select {
			case <-cleanup:
			case <-t.C:
			}
		}
		return gateLock{err: err}
	}
	return gateLock{tx: tx}
}

// settle takes the outcome of a request that has one, and returns its
// error.
func (g *Gate) settle() error {
	if g.pending == nil {
		return nil
	}
	select {
	case out := <-g.pending.done:
		g.pending.abandon()
		g.pending = nil
		g.held = out.tx
		return out.err
	default:
		return nil
	}
}

// release withdraws a request still waiting, and ends a held transaction:
// once it returns, the gate's session neither holds the lock nor waits for
// it (unless the server did not answer within cutWait).
func (g *Gate) release() {
	if r := g.pending; r != nil {
		g.pending = nil
		r.abandon()
		g.held = (<-r.done).tx // the lock, if it was granted first
	}
	if g.held != nil {
		g.rollback()
	}
}

// rollback ends the held transaction, whose session may be gone.
func (g *Gate) rollback() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = g.held.Rollback(ctx)
	g.held = nil
}
