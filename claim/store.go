package claim

import (
	"cmp"
	"context"
	crand "crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed queries.sql
var queriesSQL string

//go:embed ordered.sql
var orderedSQL string

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
	EventID       string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       []byte
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
	q      queries
	// eventSize is a running average of the bytes per event Claim has
	// received, 0 before the first: a claim asks for no more events than
	// MaxBatchBytes takes at that size.
	eventSize atomic.Int64
	// cursor is where the next ordered claim's key walk starts: the id of
	// the last aggregate head the previous one chose.
	cursor atomic.Int64
	// depth chooses how many aggregates an ordered claim takes.
	depth depthGauge
	// seq is the id column's sequence, once LastInsertID has found it.
	seqMu sync.Mutex
	seq   *string
}

type queries struct {
	// table is the table's name, quoted: in statements, and as regclass
	// text for the catalog queries.
	table                                                                string
	claim, markPublished, retry, extend, release, deletePublished, check string
	checkOrdering, checkTrigger, sample                                  string
	insertSequence, lastInsertID, notifyWaiters                          string
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
	s := &Store{db: db, cfg: cfg, jitter: jitter, q: q}
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

func render(cfg Config) (queries, error) {
	table, _ := splitTable(cfg.Table)
	data := map[string]string{
		"Table":     pgx.Identifier(table).Sanitize(),
		"Pending":   literal(cfg.Statuses.Pending),
		"Published": literal(cfg.Statuses.Published),
		"Failed":    literal(cfg.Statuses.Failed),
		"Blocking":  literal(cfg.Statuses.Pending),
		"Design":    cfg.OrderedDesign,
	}
	if cfg.OrderedDeadLetter == DeadLetterBlock {
		data["Blocking"] += ", " + literal(cfg.Statuses.Failed)
	}
	for _, col := range cfg.Columns.named() {
		data[col[0]] = pgx.Identifier{col[1]}.Sanitize()
	}
	funcs := keyFuncs(cfg.OrderingKey)
	funcs["size"] = func(alias string) string {
		return fmt.Sprintf("pg_column_size(%[1]s.%[2]s) + coalesce(pg_column_size(%[1]s.%[3]s), 0)",
			alias, data["Payload"], data["Headers"])
	}
	named := map[string]string{}
	// Each file's preamble, before its first name, is commentary.
	parts := slices.Concat(strings.Split(queriesSQL, "-- name: ")[1:], strings.Split(orderedSQL, "-- name: ")[1:])
	for _, part := range parts {
		name, body, _ := strings.Cut(part, "\n")
		tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(body)
		if err != nil {
			return queries{}, fmt.Errorf("claim: parse %s: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return queries{}, fmt.Errorf("claim: render %s: %w", name, err)
		}
		named[strings.TrimSpace(name)] = strings.TrimSpace(b.String())
	}
	q := queries{
		table:           data["Table"],
		claim:           named["claim"],
		markPublished:   named["mark_published"],
		retry:           named["retry"],
		extend:          named["extend"],
		release:         named["release"],
		deletePublished: named["delete_published"],
		check:           named["check"],
		checkOrdering:   named["check_ordering"],
		checkTrigger:    named["check_trigger"],
		sample:          named["sample"],
		insertSequence:  named["insert_sequence"],
		lastInsertID:    named["last_insert_id"],
		notifyWaiters:   named["notify_waiters"],
	}
	if cfg.Ordering == OrderAggregate {
		q.claim = named["claim_ordered"]
	}
	return q, nil
}

// keyFuncs are the template functions that spell the ordering key: key
// lists its quoted columns of a table alias, keyAs the same named k0, k1,
// …, and keyOf those names of an alias.
func keyFuncs(cols []string) template.FuncMap {
	list := func(f func(i int, col string) string) string {
		parts := make([]string, len(cols))
		for i, c := range cols {
			parts[i] = f(i, c)
		}
		return strings.Join(parts, ", ")
	}
	return template.FuncMap{
		"key": func(alias string) string {
			return list(func(_ int, c string) string { return alias + "." + pgx.Identifier{c}.Sanitize() })
		},
		"keyAs": func(alias string) string {
			return list(func(i int, c string) string {
				return fmt.Sprintf("%s.%s AS k%d", alias, pgx.Identifier{c}.Sanitize(), i)
			})
		},
		"keyOf": func(alias string) string {
			return list(func(i int, _ string) string { return fmt.Sprintf("%s.k%d", alias, i) })
		},
	}
}

// literal quotes a status value validated by statusValue (no quotes, no
// backslashes) as a SQL string literal.
func literal(s string) string { return "'" + s + "'" }

// smallBatch is the room Claim makes for events before it knows how many
// came; a larger batch grows it.
const smallBatch = 16

// Claim leases up to limit claimable events, oldest first, and no more of
// them than fit in Config.MaxBatchBytes (but at least one). An empty batch
// means nothing is claimable now.
func (s *Store) Claim(ctx context.Context, limit int) (Batch, error) {
	return s.MarkAndClaim(ctx, nil, limit)
}

// MarkAndClaim marks published as MarkPublished does and then claims as
// Claim does, in one round trip and one transaction: the claim runs after
// the mark, and sees it (an ordered claim finds the aggregates the mark
// unblocked). A relay that settles one batch and claims the next saves a
// round trip and a commit. On an error nothing was claimed, and the marks
// were rolled back with the claim: the caller marks them again, which
// changes nothing where they went through. A DB that cannot send batches
// (it has no SendBatch, as *pgxpool.Pool has) gets the two statements one
// after the other.
func (s *Store) MarkAndClaim(ctx context.Context, published []int64, limit int) (Batch, error) {
	var lease LeaseID
	if _, err := crand.Read(lease[:]); err != nil {
		return Batch{}, fmt.Errorf("claim batch: lease id: %w", err)
	}
	lease[6] = lease[6]&0x0f | 0x40 // UUID version 4
	lease[8] = lease[8]&0x3f | 0x80 // RFC 4122 variant
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	// The statement weighs rows by their stored size, which compression
	// can make far smaller than what is sent: highly compressible events
	// would all pass, be sent, and be given back. So ask for no more than
	// the budget takes at the size events have had lately.
	if avg := s.eventSize.Load(); avg > 0 {
		limit = int(min(int64(limit), int64(s.cfg.MaxBatchBytes)/avg+1))
	}
	args := []any{limit, s.cfg.Lease.Milliseconds(), lease, s.cfg.MaxBatchBytes}
	ordered := s.cfg.Ordering == OrderAggregate
	if ordered {
		args = append(args, s.cursor.Load(), s.depth.heads(limit))
	}
	rows, err := s.claimRows(ctx, published, args)
	if err != nil {
		return Batch{}, err
	}
	// Room for a small batch only: at everyday rates a claim takes one
	// event or a few, and zeroing room for limit events on every claim was
	// a quarter of the claim's CPU (pprof, 1,000 one-event batches/s).
	events := make([]Event, 0, min(limit, smallBatch))
	var (
		size     int     // payload and header bytes kept
		received int     // payload and header bytes received
		overflow []int64 // claimed, but over the budget once received
		// firstBack maps an aggregate to its first row in overflow.
		firstBack map[string]int64
		batchMore bool // ordered: the statement's "more"
	)
	var keys []string // ordered: each row's aggregate
	if ordered {
		firstBack = map[string]int64{}
	}
	for rows.Next() {
		var (
			e                                  Event
			headers, exchange, routingKey      *string
			aggregateType, aggregateID, evType *string
		)
		var (
			payload *string
			cursor  *int64
			more    bool
		)
		dest := []any{&e.ID, &e.EventID, &aggregateType, &aggregateID, &evType,
			&payload, &headers, &exchange, &routingKey, &e.CreatedAt, &e.Attempts}
		if ordered {
			dest = append(dest, &e.OrderingKey, &cursor, &more)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return Batch{}, fmt.Errorf("claim batch: scan: %w", err)
		}
		if cursor != nil {
			s.cursor.Store(*cursor)
		}
		batchMore = batchMore || more
		if ordered {
			keys = append(keys, e.OrderingKey)
		}
		n := len(deref(payload)) + len(deref(headers))
		received += n
		if len(events) == 0 || size+n <= s.cfg.MaxBatchBytes {
			size += n
		} else {
			overflow = append(overflow, e.ID)
			if ordered {
				// A row given back holds its aggregate's later rows of
				// this batch back too.
				if first, ok := firstBack[e.OrderingKey]; !ok || e.ID < first {
					firstBack[e.OrderingKey] = e.ID
				}
			}
			continue
		}
		e.AggregateType, e.AggregateID, e.EventType = deref(aggregateType), deref(aggregateID), deref(evType)
		e.Exchange, e.RoutingKey = deref(exchange), deref(routingKey)
		if payload != nil {
			e.Payload = []byte(*payload)
		}
		if headers != nil {
			e.Headers = []byte(*headers)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return Batch{}, fmt.Errorf("claim batch: %w", err)
	}
	if got := len(events) + len(overflow); got > 0 {
		avg := int64(received/got + 1)
		if old := s.eventSize.Load(); old > 0 {
			avg = (3*old + avg) / 4
		}
		s.eventSize.Store(avg)
	}
	sortByID(events)
	if len(firstBack) > 0 {
		events, overflow = cutAfterOverflow(events, overflow, firstBack)
	}
	if len(overflow) > 0 {
		// If this fails, those rows are claimable again once the lease
		// lapses: later, never lost.
		_, _ = s.Release(ctx, lease, overflow)
	}
	more := len(events)+len(overflow) >= limit
	if ordered {
		more = batchMore
		s.depth.observe(limit, keys)
	}
	return Batch{Lease: lease, Events: events, LeaseFor: s.cfg.Lease, More: more}, nil
}

// claimRows runs the claim statement with args, after the mark of
// published if there are any: both are sent in one pgx batch, which pgx
// sends in one round trip with one Sync, so the two run in one implicit
// transaction, each statement under its own snapshot.
func (s *Store) claimRows(ctx context.Context, published []int64, args []any) (pgx.Rows, error) {
	if len(published) == 0 {
		rows, err := s.db.Query(ctx, s.q.claim, args...)
		if err != nil {
			return nil, fmt.Errorf("claim batch: %w", err)
		}
		return rows, nil
	}
	if s.sender == nil {
		if _, err := s.db.Exec(ctx, s.q.markPublished, published); err != nil {
			return nil, fmt.Errorf("mark published: %w", err)
		}
		return s.claimRows(ctx, nil, args)
	}
	b := &pgx.Batch{}
	if s.local != nil {
		s.local.queue(b)
	}
	b.Queue(s.q.markPublished, published)
	b.Queue(s.q.claim, args...)
	br := s.sender.SendBatch(ctx, b)
	if s.local != nil {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("claim batch: settings: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("mark published: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// cutAfterOverflow keeps an ordered batch gap-free once some of its rows
// went over the byte budget: every row of an aggregate after one given back
// is given back too. firstBack maps an aggregate to its first row given back.
func cutAfterOverflow(events []Event, overflow []int64, firstBack map[string]int64) ([]Event, []int64) {
	kept := events[:0]
	for _, e := range events {
		if first, ok := firstBack[e.OrderingKey]; ok && e.ID > first {
			overflow = append(overflow, e.ID)
			continue
		}
		kept = append(kept, e)
	}
	return kept, overflow
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func sortByID(events []Event) {
	slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.ID, b.ID) })
}

// MarkPublished marks events confirmed by RabbitMQ as published, in one
// statement. It returns how many rows changed; fewer than len(ids) means
// another relay got there first after this one's lease expired.
func (s *Store) MarkPublished(ctx context.Context, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.markPublished, ids)
	if err != nil {
		return 0, fmt.Errorf("mark published: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Retry puts failed events back with their error text, each after its retry
// delay, or dead-letters them (status failed) when they are permanent
// failures or have used MaxAttempts.
func (s *Store) Retry(ctx context.Context, lease LeaseID, failures []Failure) (RetryResult, error) {
	var res RetryResult
	if len(failures) == 0 {
		return res, nil
	}
	ids := make([]int64, len(failures))
	statuses := make([]string, len(failures))
	delays := make([]int64, len(failures))
	errs := make([]string, len(failures))
	for i, f := range failures {
		ids[i] = f.ID
		errs[i] = errorText(f.Err)
		if s.deadLetters(f) {
			statuses[i] = s.cfg.Statuses.Failed
			res.Dead++
			res.DeadIndex = append(res.DeadIndex, i)
			continue
		}
		statuses[i] = s.cfg.Statuses.Pending
		d := s.cfg.RetryDelay(f.Attempts, s.jitter())
		delays[i] = d.Milliseconds()
		res.Due = append(res.Due, d)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	if _, err := s.db.Exec(ctx, s.q.retry, ids, statuses, delays, errs, lease); err != nil {
		return RetryResult{}, fmt.Errorf("retry: %w", err)
	}
	return res, nil
}

// maxErrorText bounds what is kept of an error in last_error.
const maxErrorText = 2000

// errorText makes an error storable as text: valid UTF-8, no NUL bytes,
// bounded length.
func errorText(err error) string {
	if err == nil {
		err = errors.New("unknown error")
	}
	s := strings.ToValidUTF8(err.Error(), "?")
	s = strings.ReplaceAll(s, "\x00", "?")
	if len(s) > maxErrorText {
		s = s[:maxErrorText]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// Extend renews the lease on events still held by it, for another
// Config.Lease from now, and returns how many it renewed: the rows settled
// meanwhile (published, retried, released) or taken by another claim after
// the lease lapsed are left alone.
func (s *Store) Extend(ctx context.Context, lease LeaseID, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.extend, ids, lease, s.cfg.Lease.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("extend lease: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Release gives leased events back unpublished, without counting the attempt:
// they are claimable again at once.
func (s *Store) Release(ctx context.Context, lease LeaseID, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.release, ids, lease)
	if err != nil {
		return 0, fmt.Errorf("release: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeletePublished deletes up to limit published events older than retention
// and returns how many it deleted. Pending and failed events are never
// touched.
func (s *Store) DeletePublished(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.q.deletePublished, retention.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete published: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Check proves that the table and every configured column exist, so a wrong
// name fails at start-up rather than at the first claim.
func (s *Store) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	rows, err := s.db.Query(ctx, s.q.check)
	if err != nil {
		return fmt.Errorf("check table: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check table: %w", err)
	}
	if s.cfg.Ordering != OrderAggregate {
		return nil
	}
	cols := append(slices.Clone(s.cfg.OrderingKey), s.cfg.Columns.ID)
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

// ErrNoOrderingIndex is Check's error in ordered mode when no index leads
// with the ordering key and the id column: every ordered claim would then
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
