package claim

import (
	"cmp"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Columns names the outbox table's columns. Every field defaults to the name
// the relay's own migrations use, shown in its comment.
type Columns struct {
	ID            string // "id": bigint, the row's identity (marks, retries, leases and the admin commands name rows by it)
	Seq           string // "relay_seq": bigint drawn at insert from a sequence of the relay's with CACHE 1; claims, the floor and ordered delivery follow it (Store.Check proves it is set up)
	EventID       string // "event_id": the AMQP message id (uuid or text)
	AggregateType string // "aggregate_type"
	AggregateID   string // "aggregate_id"
	EventType     string // "event_type"
	Payload       string // "payload": jsonb, the message body (JSON null when PayloadBytes holds it)
	PayloadBytes  string // "payload_bytes": bytea or NULL, a body that is not JSON, published as it is
	ContentType   string // "content_type": text or NULL, the content-type (default application/json, or application/octet-stream for PayloadBytes)
	Headers       string // "headers": jsonb object or NULL, extra AMQP headers
	Exchange      string // "exchange": per-row exchange or NULL for the default
	RoutingKey    string // "routing_key": per-row routing key or NULL for the default
	Status        string // "status"
	Attempts      string // "attempts": integer
	AvailableAt   string // "available_at": timestamptz, retry schedule and lease deadline
	LeaseID       string // "lease_id": uuid of the claim holding the row
	LastError     string // "last_error": text of the last failed attempt
	CreatedAt     string // "created_at": timestamptz, becomes the AMQP timestamp
	PublishedAt   string // "published_at": timestamptz
}

func (c Columns) withDefaults() Columns {
	return Columns{
		ID:            cmp.Or(c.ID, "id"),
		Seq:           cmp.Or(c.Seq, "relay_seq"),
		EventID:       cmp.Or(c.EventID, "event_id"),
		AggregateType: cmp.Or(c.AggregateType, "aggregate_type"),
		AggregateID:   cmp.Or(c.AggregateID, "aggregate_id"),
		EventType:     cmp.Or(c.EventType, "event_type"),
		Payload:       cmp.Or(c.Payload, "payload"),
		PayloadBytes:  cmp.Or(c.PayloadBytes, "payload_bytes"),
		ContentType:   cmp.Or(c.ContentType, "content_type"),
		Headers:       cmp.Or(c.Headers, "headers"),
		Exchange:      cmp.Or(c.Exchange, "exchange"),
		RoutingKey:    cmp.Or(c.RoutingKey, "routing_key"),
		Status:        cmp.Or(c.Status, "status"),
		Attempts:      cmp.Or(c.Attempts, "attempts"),
		AvailableAt:   cmp.Or(c.AvailableAt, "available_at"),
		LeaseID:       cmp.Or(c.LeaseID, "lease_id"),
		LastError:     cmp.Or(c.LastError, "last_error"),
		CreatedAt:     cmp.Or(c.CreatedAt, "created_at"),
		PublishedAt:   cmp.Or(c.PublishedAt, "published_at"),
	}
}

func (c Columns) named() [][2]string {
	return [][2]string{
		{"ID", c.ID}, {"Seq", c.Seq}, {"EventID", c.EventID}, {"AggregateType", c.AggregateType},
		{"AggregateID", c.AggregateID}, {"EventType", c.EventType}, {"Payload", c.Payload},
		{"PayloadBytes", c.PayloadBytes}, {"ContentType", c.ContentType},
		{"Headers", c.Headers}, {"Exchange", c.Exchange}, {"RoutingKey", c.RoutingKey},
		{"Status", c.Status}, {"Attempts", c.Attempts}, {"AvailableAt", c.AvailableAt},
		{"LeaseID", c.LeaseID}, {"LastError", c.LastError}, {"CreatedAt", c.CreatedAt},
		{"PublishedAt", c.PublishedAt},
	}
}

// Statuses are the values of the status column.
type Statuses struct {
	Pending   string // "pending": waiting to be published, or leased
	Published string // "published": confirmed by RabbitMQ
	Failed    string // "failed": dead-lettered after MaxAttempts, kept for inspection
}

func (s Statuses) withDefaults() Statuses {
	return Statuses{
		Pending:   cmp.Or(s.Pending, "pending"),
		Published: cmp.Or(s.Published, "published"),
		Failed:    cmp.Or(s.Failed, "failed"),
	}
}

// Config configures a Store. The zero value is usable: every field documents
// its default.
type Config struct {
	// Table is the outbox table, optionally schema-qualified ("app.outbox").
	// Default "outbox", resolved through the connection's search_path.
	Table string
	// Columns maps the table's column names; see Columns for the defaults.
	Columns Columns
	// Statuses are the status column's values; see Statuses for the defaults.
	Statuses Statuses
	// Lease is how long a claim holds its rows before anyone may claim them
	// again. It must outlast a batch's publish and confirm. Default 30s.
	Lease time.Duration
	// MaxAttempts is how many times an event is claimed for publishing before
	// a failure dead-letters it. Default 25.
	MaxAttempts int
	// RetryMin is the delay after the first failed attempt; each further
	// failure doubles it, up to RetryMax, with ±25% jitter. Default 1s.
	RetryMin time.Duration
	// RetryMax caps the retry delay. Default 5m.
	RetryMax time.Duration
	// MaxBatchBytes bounds a batch by size as well as by count: Claim stops
	// taking events once their payloads and headers would total more than
	// this many bytes (the first event is always taken, whatever its size).
	// With the relay's workers, it bounds the memory that events in flight
	// take, whatever the backlog. Default 16 MiB.
	MaxBatchBytes int
	// QueryTimeout bounds every statement the store runs. PostgreSQL must
	// enforce it (ConfigurePool sets statement_timeout to it): a client that
	// merely stops waiting leaves the statement running, and a claim that
	// commits after its caller gave up holds its rows until the lease
	// expires. The store's own deadline is QueryTimeout plus a grace of
	// one second, so the server's abort comes first. Default 10s.
	QueryTimeout time.Duration
	// Jitter returns a number in [0, 1) for the retry jitter. Default
	// math/rand/v2.Float64; tests may pin it.
	Jitter func() float64
	// Now is the store's clock, for when parked rows fall due (see
	// Advance). Default time.Now; tests may pin it.
	Now func() time.Time
	// SweepInterval is how often Advance sweeps the pending index below
	// the floor for rows that became pending there by other means than a
	// relay's own (requeued by hand, say; Rescan sweeps at once). A sweep
	// walks the index from its head, a range at a time: while a long
	// transaction holds back vacuum it reads every row version left since.
	// Default 10m; negative: only when asked.
	SweepInterval time.Duration

	// Ordering is OrderNone (default: events are claimed oldest first,
	// whatever their aggregate) or OrderAggregate (each aggregate's events
	// are claimed in insert order (Columns.Seq), and an aggregate is claimable only while no
	// earlier event of it is in flight, backing off or, under DeadLetterBlock,
	// dead-lettered). Ordered claims need an index on OrderingKey then Columns.Seq;
	// Check proves it exists.
	Ordering Ordering
	// OrderingKey names the columns that identify an aggregate in ordered
	// mode. Default: Columns.AggregateType and Columns.AggregateID.
	OrderingKey []string
	// OrderedDeadLetter decides what a dead-lettered event does to the
	// later events of its aggregate in ordered mode: DeadLetterBlock
	// (default) holds them until the failed event is requeued or deleted;
	// DeadLetterContinue lets the next one go.
	OrderedDeadLetter DeadLetterPolicy
	// Pooled says the store's connections come through a transaction-mode
	// pooler such as PgBouncer, which gives a server connection to a client
	// for one transaction at a time. The store then keeps no session state:
	// ConfigurePool sets no startup parameter and has pgx cache statement
	// descriptions instead of preparing statements, and every statement is
	// sent with its settings (see Settings) through LocalSettings, in the
	// same round trip. The server then parses and plans every statement
	// anew, which costs it more per claim than a prepared statement
	// (docs/performance.md, "Behind PgBouncer"). Default false: a direct
	// connection or a session-mode pool.
	Pooled bool
	// DeleteConfirmed has MarkPublished, and the marks that ride on a
	// claim, delete the rows of confirmed events instead of setting them
	// published: no published row is kept, for --retention=0. A delete
	// writes a fifth of the WAL of a mark, which adds the row's new version
	// to the primary key's index and to the published rows' (docs/performance.md,
	// "What the statements write"). Default false: rows are kept as published
	// until DeletePublished removes them.
	DeleteConfirmed bool
	// Instance, if set, names the relay whose claims these are, for as
	// long as it lives: it returns the id of the instance lock
	// (lockkey.Relay, id) the relay holds now on a session that lives as
	// long as the relay does (its listening connection: see
	// notify.Config.Instance), or 0 while it holds none. A claim made under
	// an id carries it in its lease, and once that lock is gone another
	// relay's Rescue makes the claim's rows claimable at once instead of
	// when the lease expires. A claim made under 0 carries none and waits
	// for its lease. Default nil: no claim carries an instance.
	Instance func() uint32
}

// Ordering is the claim order; see Config.Ordering.
type Ordering string

// The orderings.
const (
	OrderNone      Ordering = "none"
	OrderAggregate Ordering = "aggregate"
)

// DeadLetterPolicy is what a dead-lettered event does to its aggregate in
// ordered mode; see Config.OrderedDeadLetter.
type DeadLetterPolicy string

// The dead-letter policies.
const (
	DeadLetterBlock    DeadLetterPolicy = "block"
	DeadLetterContinue DeadLetterPolicy = "continue"
)

// WithDefaults returns the configuration with every default filled in.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Ordered reports whether claims keep each aggregate's order.
func (c Config) Ordered() bool { return c.withDefaults().Ordering == OrderAggregate }

// statusValue limits status values to what can be written as a SQL literal
// without escaping, so the claim's predicate matches the partial index.
var statusValue = regexp.MustCompile(`^[A-Za-z0-9_ .-]{1,63}$`)

func (c Config) withDefaults() Config {
	c.Table = cmp.Or(c.Table, "outbox")
	c.Columns = c.Columns.withDefaults()
	c.Statuses = c.Statuses.withDefaults()
	c.Lease = cmp.Or(c.Lease, 30*time.Second)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 25)
	c.RetryMin = cmp.Or(c.RetryMin, time.Second)
	c.RetryMax = cmp.Or(c.RetryMax, 5*time.Minute)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, 10*time.Second)
	c.MaxBatchBytes = cmp.Or(c.MaxBatchBytes, 16<<20)
	c.Ordering = cmp.Or(c.Ordering, OrderNone)
	if len(c.OrderingKey) == 0 {
		c.OrderingKey = []string{c.Columns.AggregateType, c.Columns.AggregateID}
	}
	c.OrderedDeadLetter = cmp.Or(c.OrderedDeadLetter, DeadLetterBlock)
	c.SweepInterval = cmp.Or(c.SweepInterval, 10*time.Minute)
	return c
}

// Validate reports the first setting that cannot work, naming it, as a
// *ConfigError. It checks the values as given, after defaults are filled
// in.
func (c Config) Validate() error {
	c = c.withDefaults()
	if _, err := splitTable(c.Table); err != nil {
		return err
	}
	for _, col := range c.Columns.named() {
		if strings.ContainsRune(col[1], 0) {
			return configErrorf("Columns."+col[0], "claim: Columns.%s: contains a NUL byte", col[0])
		}
	}
	st := c.Statuses
	for _, s := range [][2]string{{"Pending", st.Pending}, {"Published", st.Published}, {"Failed", st.Failed}} {
		if !statusValue.MatchString(s[1]) {
			return configErrorf("Statuses."+s[0], "claim: Statuses.%s %q: want 1 to 63 letters, digits, spaces or _ . -", s[0], s[1])
		}
	}
	if st.Pending == st.Published || st.Pending == st.Failed || st.Published == st.Failed {
		return configErrorf("Statuses", "claim: Statuses: pending, published and failed must differ")
	}
	switch {
	case c.Lease <= 0:
		return configErrorf("Lease", "claim: Lease %s: must be positive", c.Lease)
	case c.MaxAttempts < 1:
		return configErrorf("MaxAttempts", "claim: MaxAttempts %d: must be at least 1", c.MaxAttempts)
	case c.RetryMin <= 0:
		return configErrorf("RetryMin", "claim: RetryMin %s: must be positive", c.RetryMin)
	case c.RetryMax < c.RetryMin:
		return configErrorf("RetryMax", "claim: RetryMax %s: must be at least RetryMin (%s)", c.RetryMax, c.RetryMin)
	case c.QueryTimeout <= 0:
		return configErrorf("QueryTimeout", "claim: QueryTimeout %s: must be positive", c.QueryTimeout)
	case c.MaxBatchBytes < 1:
		return configErrorf("MaxBatchBytes", "claim: MaxBatchBytes %d: must be at least 1", c.MaxBatchBytes)
	case c.Ordering != OrderNone && c.Ordering != OrderAggregate:
		return configErrorf("Ordering", "claim: Ordering %q: want %q or %q", c.Ordering, OrderNone, OrderAggregate)
	case c.OrderedDeadLetter != DeadLetterBlock && c.OrderedDeadLetter != DeadLetterContinue:
		return configErrorf("OrderedDeadLetter", "claim: OrderedDeadLetter %q: want %q or %q", c.OrderedDeadLetter, DeadLetterBlock, DeadLetterContinue)
	}
	seen := map[string]bool{}
	for _, col := range c.OrderingKey {
		switch {
		case col == "" || strings.ContainsRune(col, 0):
			return configErrorf("OrderingKey", "claim: OrderingKey %q: want column names, none empty", c.OrderingKey)
		case seen[col]:
			return configErrorf("OrderingKey", "claim: OrderingKey %q: column %q is named twice", c.OrderingKey, col)
		case col == c.Columns.ID || col == c.Columns.Seq:
			return configErrorf("OrderingKey", "claim: OrderingKey %q: column %q identifies or orders events and cannot be part of an aggregate's key", c.OrderingKey, col)
		}
		seen[col] = true
	}
	return nil
}

// splitTable splits "schema.table" or "table" into its parts.
// TableIdentifier is Table split into its schema (if given) and name.
func (c Config) TableIdentifier() (pgx.Identifier, error) {
	parts, err := splitTable(c.withDefaults().Table)
	return pgx.Identifier(parts), err
}

func splitTable(name string) ([]string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, configErrorf("Table", "claim: Table %q: want table or schema.table", name)
	}
	for _, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) {
			return nil, configErrorf("Table", "claim: Table %q: want table or schema.table", name)
		}
	}
	return parts, nil
}

// RetryDelay is the wait before the next attempt of an event whose attempt
// number attempts just failed: RetryMin doubled per earlier attempt, capped
// at RetryMax, times a jitter factor in [0.75, 1.25).
func (c Config) RetryDelay(attempts int, jitter float64) time.Duration {
	c = c.withDefaults()
	d := c.RetryMin
	for i := 1; i < attempts && d < c.RetryMax; i++ {
		d *= 2
	}
	d = min(d, c.RetryMax)
	return time.Duration(float64(d) * (0.75 + 0.5*jitter))
}

// clientGrace is how much longer than QueryTimeout the store waits for a
// statement, so that the server's statement_timeout ends it first.
const clientGrace = time.Second

// Settings are the settings every statement of the store runs under:
//
//   - statement_timeout is QueryTimeout, so PostgreSQL aborts what the store
//     gives up on;
//   - synchronous_commit is off, because a claim, mark or retry lost in a
//     database crash only leads to an event being published again, never
//     to one being lost;
//   - enable_seqscan and enable_bitmapscan are off: every statement of the
//     store is meant to walk an index, and the planner, left alone, picks
//     plans that stop doing so as the outbox changes under them. pgx
//     prepares each statement once per connection, and PostgreSQL soon
//     caches a generic plan for it: planned while the table was small, the
//     mark became a sequential scan that every later mark repeated over the
//     whole, growing table (found by the benchmark: the relay's database
//     CPU per event grew about fourfold within 30 s at 1,000 events/s). A
//     bitmap scan, which the planner prefers for the claim while it
//     believes few rows are pending, reads every index entry left by rows
//     published since the last vacuum and never marks them dead: with
//     20,000 such entries it took 0.8 to 1.9 ms and 600 buffers per claim,
//     against 0.1 ms and 57 for the ordered index scan.
//   - plan_cache_mode is force_generic_plan: with the scans above ruled
//     out, the generic plans are the custom plans' shapes (the pending
//     index walked from the floor, lookups by id through the primary key),
//     but PostgreSQL estimates the claim's generic plan dearer than a
//     custom one and would plan the claim again at every execution: 0.3 to
//     0.8 ms of planning for 0.1 ms of execution, on the path of every
//     event at rest and several hundred times per 1,000 events at a steady
//     rate.
//   - jit is off: with the scans above ruled out, a statement that has no
//     index to walk (the table check, SELECT … LIMIT 0 every 15 s) is
//     costed above 10^10, far past jit_above_cost, and PostgreSQL compiled
//     and inlined it with LLVM at every execution: 100 to 200 ms of the
//     backend's CPU and 80 MB of its memory for a statement that reads no
//     row. The store's statements are short and read few rows; compiling
//     never pays for them.
func (c Config) Settings() map[string]string {
	c = c.withDefaults()
	return map[string]string{
		"statement_timeout":  strconv.FormatInt(c.QueryTimeout.Milliseconds(), 10),
		"synchronous_commit": "off",
		"enable_seqscan":     "off",
		"enable_bitmapscan":  "off",
		"plan_cache_mode":    "force_generic_plan",
		"jit":                "off",
	}
}

// ConfigurePool prepares the configuration of the pool a Store will use.
// On a direct connection (Pooled false) the Settings become startup
// parameters of every connection, and values already set in the connection
// string are kept. Pooled, it sets none (PgBouncer refuses them) and has
// pgx cache statement descriptions rather than prepare statements, which
// would outlive the transaction on a server connection another client gets
// next; the store sends its Settings with each statement instead.
func (c Config) ConfigurePool(pc *pgxpool.Config) {
	if c.Pooled {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		return
	}
	params := pc.ConnConfig.RuntimeParams
	for name, value := range c.Settings() {
		if params[name] == "" {
			params[name] = value
		}
	}
}

// ConfigError is the error Validate returns: the setting that cannot work,
// and why. Its text names the setting too.
type ConfigError struct {
	// Setting is the Config field, as Go spells it: "Table", "Lease",
	// "OrderingKey", "Columns.ID", "Statuses.Pending", or "Statuses" for
	// the three status values together.
	Setting string
	Err     error
}

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// configErrorf returns a *ConfigError of setting with the formatted text.
func configErrorf(setting, format string, args ...any) error {
	return &ConfigError{Setting: setting, Err: fmt.Errorf(format, args...)}
}
