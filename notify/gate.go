package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// GateLockClass is the first key of the advisory lock the outbox trigger
// tries, shared, before it reads the gate; the second is hashtext(channel).
// It must match the trigger function in migrations/ and sql/.
const GateLockClass = 1868722808

// DefaultGateTTL is how long a closed gate stays closed unless refreshed.
const DefaultGateTTL = 2 * time.Second

// Gate statements. $1 is the gate sequence's schema-qualified, quoted name;
// the gate's value is the time, in milliseconds since the epoch by
// PostgreSQL's clock, until which the trigger skips NOTIFY.
const (
	gateOpenSQL    = `SELECT setval($1::regclass, 0, true)`
	gateBarrierSQL = `SELECT pg_advisory_xact_lock(1868722808, hashtext($1))`
	gateCloseSQL   = `SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $2, true)`
	gateCheckSQL   = `SELECT pg_sequence_last_value($1::regclass)`
)

// GateDB runs the gate's statements; a *pgxpool.Pool satisfies it.
type GateDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Gate opens and closes the outbox trigger's notifications.
//
// NOTIFY serializes the commits of the transactions that send it, so the
// relay closes the gate while it is busy claiming anyway, and opens it before
// it waits. Open makes the trigger notify and then waits for every producer
// that may have read the gate closed; a claim after Open returns therefore
// sees every event whose producer did not notify. Close lasts TTL: a relay
// that dies with the gate closed does not silence the trigger for longer.
//
// The trigger takes the gate's advisory lock with try-lock only: producers
// never wait for a relay, and a producer that finds it taken notifies.
type Gate struct {
	db       GateDB
	channel  string
	sequence string
	ttl      time.Duration
}

// NewGate returns the gate of channel, kept in the sequence named by
// sequence (an identifier such as pgx.Identifier{"public",
// "outbox_wakeup"}). A ttl of 0 means DefaultGateTTL.
func NewGate(db GateDB, channel string, sequence pgx.Identifier, ttl time.Duration) (*Gate, error) {
	if channel == "" || len(channel) > maxChannelBytes {
		return nil, fmt.Errorf("notify: gate channel %q: must be 1 to %d bytes", channel, maxChannelBytes)
	}
	if len(sequence) == 0 || len(sequence) > 2 {
		return nil, fmt.Errorf("notify: gate sequence %v: give a name, optionally schema-qualified", []string(sequence))
	}
	for _, part := range sequence {
		if part == "" {
			return nil, errors.New("notify: gate sequence: empty name")
		}
	}
	if ttl == 0 {
		ttl = DefaultGateTTL
	}
	if ttl < 0 {
		return nil, fmt.Errorf("notify: gate TTL %s is negative", ttl)
	}
	return &Gate{db: db, channel: channel, sequence: sequence.Sanitize(), ttl: ttl}, nil
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
// may have read the gate closed has committed or rolled back: those are the
// ones holding the gate's shared lock. Producers arriving meanwhile find the
// lock contended and notify. Both steps run in one round trip; a statement
// timeout on the connection bounds the wait.
func (g *Gate) Open(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue(gateOpenSQL, g.sequence)
	b.Queue(gateBarrierSQL, g.channel)
	if err := g.db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("open gate: %w", err)
	}
	return nil
}

// Close stops the trigger's notifications for TTL. Call it again before TTL
// has passed to keep the gate closed.
func (g *Gate) Close(ctx context.Context) error {
	if _, err := g.db.Exec(ctx, gateCloseSQL, g.sequence, g.ttl.Milliseconds()); err != nil {
		return fmt.Errorf("close gate: %w", err)
	}
	return nil
}
