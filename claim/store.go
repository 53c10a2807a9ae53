package claim

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outboxrelay/internal/sqltmpl"
)

// DB is what the store needs of a connection pool; *pgxpool.Pool has it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// batchSender sends statements in one round trip; *pgxpool.Pool is one.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Event is one claimed outbox row.
type Event struct {
	ID            int64
	Seq           int64 // its insert order (Columns.Seq): a batch is sorted by it
	EventID       string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       []byte // JSON
	PayloadBytes  []byte // the body as bytes when it is not JSON (Payload is then JSON null), or nil
	ContentType   string // the row's content-type, "" for none (the default)
	Headers       []byte // a JSON object, or nil
	Exchange      string // "" for the default exchange
	RoutingKey    string // "" for the default routing key
	CreatedAt     time.Time
	Attempts      int // this claim included
	// OrderingKey identifies the event's aggregate in ordered mode (the
	// ordering key's columns as a row literal); "" when claims are not
	// ordered.
	OrderingKey string
}

// LeaseID identifies one claim; only its holder may retry or release the rows.
type LeaseID [16]byte

// UUIDValue encodes the lease id as a PostgreSQL uuid parameter. pgx would
// find the [16]byte underneath by reflection, at each claim.
func (l LeaseID) UUIDValue() (pgtype.UUID, error) {
	return pgtype.UUID{Bytes: l, Valid: true}, nil
}

// String formats the lease id as a UUID.
func (l LeaseID) String() string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", l[0:4], l[4:6], l[6:8], l[8:10], l[10:16])
}

// Batch is the result of one claim.
type Batch struct {
	Lease  LeaseID
	Events []Event // in id order
	// LeaseFor is how long the claim holds its rows, counted from the
	// moment the claim statement started (Config.Lease); Extend renews it.
	LeaseFor time.Duration
	// More reports that claimable events were left beyond the batch, so
	// another claim now would find some: in unordered mode, that the batch
	// came back full; in ordered mode, that the claim's key walk found
	// another claimable aggregate just past the batch's last. A full ordered
	// batch often leaves nothing claimable: every other aggregate's head is
	// in flight.
	More bool
}

// Failure is an event whose publish failed.
type Failure struct {
	ID       int64
	Attempts int   // Event.Attempts of the claim that failed
	Err      error // kept in the last_error column
	// Permanent dead-letters the event now: it can never succeed as it is.
	Permanent bool
}

// RetryResult is what Retry did.
type RetryResult struct {
	Dead int             // events dead-lettered
	Due  []time.Duration // for each event put back, the delay until it is due
	// DeadIndex holds the index in failures of each event dead-lettered.
	DeadIndex []int
}

// Store runs the outbox statements against one table.
type Store struct {
	db  DB
	cfg Config
	// sender is db's way of sending a batch of statements, if it has one
	// (MarkAndClaim); local, under Config.Pooled, the settings db applies
	// to each statement, which a batch sent to sender must apply itself.
	sender batchSender
	local  *LocalSettings
	jitter func() float64
	now    func() time.Time
	q      queries
	// floor is where claims start (floor.go).
	floor floor
	// cleanupFrom is the published_at cleanup has reached, and
	// cleanupReset when it last started from the oldest row
	// (DeletePublished).
	cleanupMu    sync.Mutex
	cleanupFrom  time.Time
	cleanupReset time.Time
	// eventSize is a running average of the bytes per event Claim has
	// received, 0 before the first: a claim asks for no more events than
	// MaxBatchBytes takes at that size.
	eventSize atomic.Int64
	// scan is how many pending rows an ordered claim reads.
	scan orderedScan
	// seq is the seq column's sequence, once LastInsertID or Advance has
	// found it.
	seqMu sync.Mutex
	seq   *string
	// rescue watches the rows other relays hold and remembers the claims
	// whose outcome is unknown (rescue.go).
	rescue rescuer
}

// New validates cfg and renders the store's statements for its table.
func New(db DB, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	q, err := render(cfg)
	if err != nil {
		return nil, err
	}
	jitter := cfg.Jitter
	if jitter == nil {
		jitter = rand.Float64
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	s := &Store{db: db, cfg: cfg, jitter: jitter, now: now, q: q}
	s.sender, _ = db.(batchSender)
	if cfg.Pooled {
		conn, ok := db.(Conn)
		if !ok {
			return nil, errors.New("claim: Config.Pooled needs a DB that sends batches and begins transactions, as *pgxpool.Pool does")
		}
		s.local = NewLocalSettings(conn, cfg.Settings())
		s.db = s.local
	}
	return s, nil
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Check proves that the table and every configured column exist, so a wrong
// name fails at start-up rather than at the first claim.
func (s *Store) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	rows, err := s.db.Query(ctx, s.q.check)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn {
		return fmt.Errorf("check table: %w (the relay's migrations add the columns it needs; to a table of your own, "+
			"sql/outboxrelay_install.sql of this version or outboxrelay migrate --table adds them)", err)
	}
	if err != nil {
		return fmt.Errorf("check table: %w", err)
	}
	if err := s.checkSeq(ctx); err != nil {
		return err
	}
	if s.cfg.Ordering != OrderAggregate {
		return nil
	}
	cols := append(slices.Clone(s.cfg.OrderingKey), s.cfg.Columns.Seq)
	rows, err = s.db.Query(ctx, s.q.checkOrdering, s.q.table, cols)
	if err != nil {
		return fmt.Errorf("check ordering index: %w", err)
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return fmt.Errorf("check ordering index: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: ordered claims need a valid index on (%s) of %s; "+
			"the relay's migrations create it in ordered mode, sql/outboxrelay_install.sql with -v ordering=aggregate",
			ErrNoOrderingIndex, strings.Join(cols, ", "), s.cfg.Table)
	}
	return nil
}

// ErrUnsafeSeq is Check's error when the seq column is not what the floor
// needs (floor.go): a column whose default draws, at every insert, from a
// sequence of its own with CACHE 1. A sequence that hands out values in
// blocks, or a column filled by anything but its insert, lets rows commit
// below the floor, where no claim looks for them.
var ErrUnsafeSeq = errors.New("the seq column cannot order the claims")

// checkSeq proves the seq column is drawn at insert from a sequence of
// cache 1, and says how to make it so where it is not.
func (s *Store) checkSeq(ctx context.Context) error {
	col := s.cfg.Columns.Seq
	rows, err := s.db.Query(ctx, s.q.checkSeq, s.q.table, col)
	if err != nil {
		return fmt.Errorf("check seq column: %w", err)
	}
	type seqState struct {
		seq   *string
		cache *int64
		drawn *bool
	}
	st, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (st seqState, err error) {
		return st, r.Scan(&st.seq, &st.cache, &st.drawn)
	})
	if err != nil {
		return fmt.Errorf("check seq column: %w", err)
	}
	switch {
	case st.seq == nil:
		return fmt.Errorf("%w: %s.%s owns no sequence; sql/outboxrelay_install.sql (or outboxrelay migrate) creates one: "+
			"CREATE SEQUENCE ... CACHE 1 OWNED BY %[2]s.%[3]s and ALTER TABLE %[2]s ALTER COLUMN %[3]s SET DEFAULT nextval(...)",
			ErrUnsafeSeq, s.q.table, sqltmpl.Identifier(col))
	case st.cache == nil || *st.cache != 1:
		cache := "unknown"
		if st.cache != nil {
			cache = fmt.Sprint(*st.cache)
		}
		return fmt.Errorf("%w: sequence %s of %s.%s has CACHE %s, so sessions hand out its values in blocks and rows commit below "+
			"the claims' floor; run ALTER SEQUENCE %[2]s CACHE 1 (the relay owns this sequence; your ids may keep any cache)",
			ErrUnsafeSeq, *st.seq, s.q.table, sqltmpl.Identifier(col), cache)
	case st.drawn == nil || !*st.drawn:
		return fmt.Errorf("%w: %s.%s does not default to nextval of its sequence %s, so inserts may not draw from it; "+
			"run ALTER TABLE %[2]s ALTER COLUMN %[3]s SET DEFAULT nextval('%[4]s')",
			ErrUnsafeSeq, s.q.table, sqltmpl.Identifier(col), *st.seq)
	}
	return nil
}

// ErrNoOrderingIndex is Check's error in ordered mode when no index leads
// with the ordering key and the seq column: every ordered claim would then
// scan the table.
var ErrNoOrderingIndex = errors.New("no ordering index")

// Unblocks reports whether recording f, a failure of an ordered batch,
// lets the later events of its aggregate go: only when f is dead-lettered
// (permanent, or out of attempts) under DeadLetterContinue. Otherwise the
// failed event stays its aggregate's head, retried or dead, and holds the
// rest back.
func (s *Store) Unblocks(f Failure) bool {
	return s.cfg.OrderedDeadLetter == DeadLetterContinue && s.deadLetters(f)
}

func (s *Store) deadLetters(f Failure) bool {
	return f.Permanent || f.Attempts >= s.cfg.MaxAttempts
}
