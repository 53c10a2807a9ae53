package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// queryTimeout bounds each statement the benchmark runs itself (a drain's
// backlog is written in one statement).
const queryTimeout = 5 * time.Minute

// The application_name of the benchmark's own connections: its pool for
// its own statements, and the one that holds the schema's lock.
const (
	ownApp  = "outboxrelay-bench"
	lockApp = "outboxrelay-bench-lock"
)

// database is the benchmark's access to PostgreSQL: a small pool for its
// own statements and the URLs its children and producers connect with, all
// with search_path set to the benchmark schema.
type database struct {
	pool   *pgxpool.Pool
	lock   *pgx.Conn // holds the schema's advisory lock for the whole run
	base   *url.URL
	schema string
	table  string // the outbox table, schema-qualified and quoted
}

// openDatabase connects and creates the schema if it is missing (see
// prepareSchema).
func openDatabase(ctx context.Context, rawURL, schema string) (*database, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", redact.Error(err, rawURL))
	}
	d := &database{base: u, schema: schema, table: pgx.Identifier{schema, "outbox"}.Sanitize()}
	cfg, err := pgxpool.ParseConfig(d.url(ownApp))
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %w", redact.URL(rawURL), redact.Error(err, rawURL))
	}
	cfg.MaxConns = 4
	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(connectCtx, cfg)
	if err == nil {
		err = pool.Ping(connectCtx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("PostgreSQL at %s: %w", redact.URL(rawURL), redact.Error(err, rawURL))
	}
	d.pool = pool
	if err := d.lockSchema(connectCtx); err != nil {
		pool.Close()
		return nil, err
	}
	if err := d.prepareSchema(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// lockSchema takes a session advisory lock on the schema's name, so that a
// second benchmark on the same schema fails at once instead of truncating
// and dropping the outbox under the first.
func (d *database) lockSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.url(lockApp))
	if err != nil {
		return fmt.Errorf("lock schema: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('outboxrelay bench ' || $1))`, d.schema).Scan(&ok); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("lock schema: %w", err)
	}
	if !ok {
		conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("schema %s: another outboxrelay-bench is running on it; wait for it or pass another --schema", d.schema)
	}
	d.lock = conn
	return nil
}

// schemaMark is the comment of a schema the benchmark created. The
// benchmark truncates the outbox and drops the schema at the end, so it
// only ever works in a schema that carries this mark. It (and the lock
// key of lockSchema) keeps the words of the days the benchmark was the
// relay's "bench" subcommand, so that schemas kept then are still known.
const schemaMark = "outboxrelay bench scratch schema: outboxrelay bench truncates and drops it"

// prepareSchema creates the schema with its mark if it is missing, and
// refuses an existing schema without the mark (an application's schema, a
// real outbox).
func (d *database) prepareSchema(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var comment *string
	err := d.pool.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, d.schema).Scan(&comment)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return d.createSchema(ctx)
	case err != nil:
		return fmt.Errorf("inspect schema: %w", err)
	case comment == nil || *comment != schemaMark:
		return fmt.Errorf("schema %q exists and was not created by outboxrelay-bench, which truncates and drops its schema: choose another --schema", d.schema)
	}
	return nil
}

func (d *database) createSchema(ctx context.Context) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	name := pgx.Identifier{d.schema}.Sanitize()
	if _, err := tx.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	// COMMENT takes no parameters; the mark is a constant without quotes.
	if _, err := tx.Exec(ctx, "COMMENT ON SCHEMA "+name+" IS '"+schemaMark+"'"); err != nil {
		return fmt.Errorf("mark schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// url is the database URL with the benchmark schema as search_path and the
// given application_name, by which the backends of a connection are found.
func (d *database) url(applicationName string) string {
	u := *d.base
	q := u.Query()
	q.Set("search_path", d.schema)
	q.Set("application_name", applicationName)
	u.RawQuery = q.Encode()
	return u.String()
}

// Close closes the pool.
func (d *database) Close() {
	d.pool.Close()
	if d.lock != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.lock.Close(ctx)
	}
}

func (d *database) exec(ctx context.Context, what, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if _, err := d.pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (d *database) queryInt(ctx context.Context, what, sql string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	if err := d.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}

// truncate empties the outbox and restarts its ids.
func (d *database) truncate(ctx context.Context) error {
	return d.exec(ctx, "truncate outbox", "TRUNCATE "+d.table+" RESTART IDENTITY")
}

// insertBacklog writes events first … first+n-1 as pending rows in one
// statement.
func (d *database) insertBacklog(ctx context.Context, first int64, n int, p payloads) error {
	return d.exec(ctx, "insert backlog", `INSERT INTO `+d.table+` (event_id, aggregate_type, aggregate_id, event_type, payload)
		SELECT `+eventIDSQL+`, '`+aggregateType+`', n::text, '`+eventType+`', jsonb_build_object('n', n, 'pad', repeat('x', $3::int))
		FROM generate_series($1::bigint, $2::bigint) AS n`, first, first+int64(n)-1, p.padLen())
}

// insertScheduled writes events first … first+n-1 as pending rows in one
// statement, event first+i due at due + i·step.
func (d *database) insertScheduled(ctx context.Context, first int64, n int, due time.Time, step time.Duration, p payloads) error {
	return d.exec(ctx, "insert scheduled events", `INSERT INTO `+d.table+` (event_id, aggregate_type, aggregate_id, event_type, payload, available_at)
		SELECT `+eventIDSQL+`, '`+aggregateType+`', n::text, '`+eventType+`', jsonb_build_object('n', n, 'pad', repeat('x', $3::int)),
			$4::timestamptz + (n - $1) * $5::bigint * interval '1 microsecond'
		FROM generate_series($1::bigint, $2::bigint) AS n`, first, first+int64(n)-1, p.padLen(), due, step.Microseconds())
}

// insertShapedBacklog writes the events first … first+shape.total()-1 as
// pending rows in one statement, in slot order (see Shape): event 1 of
// every aggregate, then event 2, …, each with its seq in the payload.
func (d *database) insertShapedBacklog(ctx context.Context, first int64, shape Shape, p payloads) error {
	return d.exec(ctx, "insert ordered backlog", `INSERT INTO `+d.table+` (event_id, aggregate_type, aggregate_id, event_type, payload)
		SELECT `+eventIDSQL+`, '`+aggregateType+`', a::text, '`+eventType+`', jsonb_build_object('n', n, 'pad', repeat('x', $4::int), 'seq', s)
		FROM (SELECT $1::bigint + (s - 1) * $2::bigint + a AS n, a, s
			FROM generate_series(1, $3::bigint) AS s, generate_series(0, $2::bigint - 1) AS a) AS e
		ORDER BY n`, first, shape.Aggregates, shape.Events, p.padLen())
}

// hasOrderingIndex reports whether the outbox has the valid ordering index
// an ordered relay creates when it migrates.
func (d *database) hasOrderingIndex(ctx context.Context) (bool, error) {
	names, err := d.orderingIndexes(ctx)
	return len(names) > 0, err
}

// orderingIndexesSQL lists the valid indexes on $1 that lead with the
// aggregate's columns and relay_seq, as the ordered relay needs (whatever
// their names: the migrations' of earlier versions, or the install's),
// schema-qualified and quoted.
const orderingIndexesSQL = `SELECT coalesce(array_agg(i.indexrelid::regclass::text), '{}') FROM pg_index AS i
	WHERE i.indrelid = to_regclass($1) AND i.indisvalid
	  AND (SELECT array_agg(a.attname::text ORDER BY k.ord)
	       FROM unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
	       JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
	       WHERE k.ord <= 3) = '{aggregate_type,aggregate_id,relay_seq}'`

// orderingIndexes lists the ordering indexes on the table.
func (d *database) orderingIndexes(ctx context.Context) ([]string, error) {
	var names []string
	if err := d.pool.QueryRow(ctx, orderingIndexesSQL, d.table).Scan(&names); err != nil {
		return nil, fmt.Errorf("look up ordering index: %w", err)
	}
	return names, nil
}

// dropOrderingIndex drops the ordering indexes, if any. No relay may be
// running.
func (d *database) dropOrderingIndex(ctx context.Context) error {
	names, err := d.orderingIndexes(ctx)
	for _, name := range names {
		if err == nil {
			err = d.exec(ctx, "drop ordering index", "DROP INDEX IF EXISTS "+name)
		}
	}
	return err
}

// pending counts the rows waiting to be published.
func (d *database) pending(ctx context.Context) (int64, error) {
	return d.queryInt(ctx, "count pending", "SELECT count(*) FROM "+d.table+" WHERE status = 'pending'")
}

// setTriggers enables or disables the outbox's user triggers.
func (d *database) setTriggers(ctx context.Context, enabled bool) error {
	action := "DISABLE"
	if enabled {
		action = "ENABLE"
	}
	return d.exec(ctx, "outbox triggers", "ALTER TABLE "+d.table+" "+action+" TRIGGER USER")
}

// backends lists the pids of the backends whose application_name is name.
func (d *database) backends(ctx context.Context, name string) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := d.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name)
	if err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out, nil
}

// databaseBackends lists the pids of the client backends connected to the
// benchmark's database, but for the benchmark's own (its pool and its
// lock): the relay's, the producers', and whatever else connects to it.
func (d *database) databaseBackends(ctx context.Context) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	rows, err := d.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend'
		  AND application_name <> ALL ($1::text[])`, []string{ownApp, lockApp})
	if err != nil {
		return nil, fmt.Errorf("list the database's backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("list the database's backends: %w", err)
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out, nil
}

// deadTuples is the outbox's n_dead_tup in pg_stat_user_tables.
func (d *database) deadTuples(ctx context.Context) (int64, error) {
	return d.queryInt(ctx, "read dead tuples", "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relid = to_regclass($1)", d.table)
}

// walWritten is how many bytes of WAL the server has written since it was
// made: the position of its current WAL insert, as a number.
func (d *database) walWritten(ctx context.Context) (int64, error) {
	return d.queryInt(ctx, "read the WAL position", "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
}

// dropSchema drops the benchmark schema and everything in it.
func (d *database) dropSchema(ctx context.Context) error {
	return d.exec(ctx, "drop schema", "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE")
}
