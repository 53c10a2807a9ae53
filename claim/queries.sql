-- Statements of the outbox store. {{.X}} stands for an identifier from the
-- configuration, quoted with pgx.Identifier, or for a validated status
-- literal; values are always parameters. The IN-list of ids is written as
-- = ANY (ARRAY (subquery)) so the planner keeps the index path on a large
-- table instead of a hash join over all of it.
--
-- Where rows are found by their ids, a test of their status is written
-- (status = …) IS TRUE: the planner cannot then take a partial index on
-- the status for the lookup, and uses the primary key. A partial index
-- whose columns lead with others (the ordering index) can only filter the
-- ids, reading all of it, including, while a long transaction holds back
-- vacuum, every entry of every row published since. The pending index is
-- no better, though it leads with the id: with the plain test in unordered
-- mode the claim's mean time rose from 0.7 ms to 51 ms within three
-- minutes of a pin at 1,000 events/s, against 1-3 ms through the primary
-- key (outboxrelay-bench --only horizon --horizon-pinned=3m
-- --horizon-window=30s), though it spent 14-18 ms less backend CPU per
-- 1,000 events at rest (steady 1,000/s, two interleaved runs).

-- name: claim
-- $1 batch size, $2 lease in milliseconds, $3 lease id, $4 byte budget,
-- $5 the floor, $6 parked rows due (ids of rows below the floor; floor.go).
-- Rows are taken in insert order (the seq column) while their payloads and
-- headers, as stored (pg_column_size reads a TOASTed value's size without
-- fetching it), fit in the budget; the first row is always taken. Stored
-- sizes can be smaller than the text sent to the relay (compression), so
-- Claim also counts the text it receives and gives back what overflows.
-- The pending index is walked from the floor, not from its head; the
-- parked rows are read through the primary key.
UPDATE {{.Table}} SET
    {{.AvailableAt}} = now() + $2 * interval '1 millisecond',
    {{.LeaseID}} = $3,
    {{.Attempts}} = {{.Attempts}} + 1
WHERE {{.ID}} = ANY (ARRAY (
    SELECT id FROM (
        SELECT id, row_number() OVER w AS n,
            sum(pg_column_size(payload) + coalesce(pg_column_size(payload_bytes), 0) + coalesce(pg_column_size(headers), 0)) OVER w AS upto
        FROM (
            SELECT * FROM (
                SELECT {{.ID}} AS id, {{.Seq}} AS seq, {{.Payload}} AS payload, {{.PayloadBytes}} AS payload_bytes, {{.Headers}} AS headers FROM {{.Table}}
                WHERE {{.ID}} = ANY ($6::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE AND {{.AvailableAt}} <= now()
                FOR UPDATE SKIP LOCKED) AS parked
            UNION ALL
            SELECT * FROM (
                SELECT {{.ID}} AS id, {{.Seq}} AS seq, {{.Payload}} AS payload, {{.PayloadBytes}} AS payload_bytes, {{.Headers}} AS headers FROM {{.Table}}
                WHERE {{.Status}} = {{.Pending}} AND {{.AvailableAt}} <= now() AND {{.Seq}} > $5
                ORDER BY {{.Seq}}
                LIMIT $1
                FOR UPDATE SKIP LOCKED) AS fresh) AS locked
        WINDOW w AS (ORDER BY seq)) AS sized
    WHERE n <= $1 AND (n = 1 OR upto <= $4)))
RETURNING {{.ID}}, {{.Seq}}, {{.EventID}}::text, {{.AggregateType}}::text, {{.AggregateID}}::text,
    {{.EventType}}::text, {{.Payload}}::text, {{.Headers}}::text, {{.Exchange}}::text,
    {{.RoutingKey}}::text, {{.CreatedAt}}::timestamptz, {{.Attempts}}, {{.PayloadBytes}}, {{.ContentType}}::text;

-- name: mark_published
-- $1 ids. Any confirmed publish counts, even one whose lease expired meanwhile.
UPDATE {{.Table}} SET
    {{.Status}} = {{.Published}},
    {{.PublishedAt}} = now(),
    {{.LeaseID}} = NULL
WHERE {{.ID}} = ANY ($1::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE;

-- name: delete_confirmed
-- $1 ids. The mark under Config.DeleteConfirmed: the row of a confirmed
-- event is deleted instead of kept as published. As for mark_published,
-- any confirmed publish counts, even one whose lease expired meanwhile.
DELETE FROM {{.Table}}
WHERE {{.ID}} = ANY ($1::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE;

-- name: retry
-- $1 ids, $2 new statuses, $3 delays in milliseconds, $4 errors, $5 lease id.
-- Returns the rows put back pending, with their seq and milliseconds until
-- each is due, for the floor to park those below it.
UPDATE {{.Table}} AS o SET
    {{.Status}} = f.status,
    {{.AvailableAt}} = now() + f.delay_ms * interval '1 millisecond',
    {{.LastError}} = f.error,
    {{.LeaseID}} = NULL
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[]) AS f (id, status, delay_ms, error)
WHERE o.{{.ID}} = f.id AND o.{{.LeaseID}} = $5 AND (o.{{.Status}} = {{.Pending}}) IS TRUE
RETURNING o.{{.ID}}, o.{{.Seq}}, CASE WHEN f.status = {{.Pending}} THEN f.delay_ms ELSE -1 END;

-- name: extend
-- $1 ids, $2 lease id, $3 lease in milliseconds. Renews a claim still in
-- flight; rows settled meanwhile no longer carry the lease.
UPDATE {{.Table}} SET
    {{.AvailableAt}} = now() + $3 * interval '1 millisecond'
WHERE {{.ID}} = ANY ($1::bigint[]) AND {{.LeaseID}} = $2 AND ({{.Status}} = {{.Pending}}) IS TRUE;

-- name: release
-- $1 ids, $2 lease id. The attempt did not happen: give it back. Returns
-- the rows given back with their seq, for the floor to park those below it.
UPDATE {{.Table}} SET
    {{.AvailableAt}} = now(),
    {{.LeaseID}} = NULL,
    {{.Attempts}} = greatest({{.Attempts}} - 1, 0)
WHERE {{.ID}} = ANY ($1::bigint[]) AND {{.LeaseID}} = $2 AND ({{.Status}} = {{.Pending}}) IS TRUE
RETURNING {{.ID}}, {{.Seq}};

-- name: delete_published
-- $1 retention in milliseconds, $2 batch size, $3 where to start: the
-- published_at cleanup has reached, so that a pass does not walk again the
-- index entries of the rows earlier passes deleted, which vacuum cannot
-- remove while a long transaction may still see them. Returns how many
-- rows it deleted and the latest published_at among them.
WITH gone AS (
    DELETE FROM {{.Table}}
    WHERE {{.ID}} = ANY (ARRAY (
        SELECT {{.ID}} FROM {{.Table}}
        WHERE {{.Status}} = {{.Published}}
          AND {{.PublishedAt}} >= $3
          AND {{.PublishedAt}} < now() - $1 * interval '1 millisecond'
        ORDER BY {{.PublishedAt}}
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING {{.PublishedAt}} AS at)
SELECT count(*), max(at) FROM gone;

-- name: advance
-- One round trip per advance (floor.go). $1 the seq column's sequence
-- (regclass text), $2 the floor, $3 the frontier known before this
-- statement (or, while its move waits for writers, the last value the move
-- covers), $4 how many rows. The sequence's last value,
-- read first; the transactions that have drawn from it and not ended (the
-- inserts; nextval holds the sequence's lock to the transaction's end),
-- read after it (the subquery refers to that value, so it runs once the
-- value is read); and,
-- when the floor is below $3, the first pending rows above the floor in seq
-- order, each with its id, lease, milliseconds until it is due (0 or less:
-- due now) and, in ordered mode, its aggregate, as arrays.
SELECT w.last, w.writers, h.seqs, h.ids, h.leases, h.due_ms, h.keys
FROM (
    SELECT s.last, ({{inserting}} AND s.last IS NOT NULL) AS writers
    FROM (SELECT coalesce(pg_sequence_last_value($1::regclass), 0) AS last) AS s
) AS w, (
    SELECT coalesce(array_agg(r.seq ORDER BY r.seq), '{}') AS seqs,
        coalesce(array_agg(r.id ORDER BY r.seq), '{}') AS ids,
        coalesce(array_agg(r.lease ORDER BY r.seq), '{}') AS leases,
        coalesce(array_agg(r.due_ms ORDER BY r.seq), '{}') AS due_ms,
        coalesce(array_agg(r.key ORDER BY r.seq), '{}') AS keys
    FROM (
        SELECT {{.Seq}} AS seq, {{.ID}} AS id, {{.LeaseID}}::text AS lease,
            extract(epoch FROM {{.AvailableAt}} - now())::float8 * 1000 AS due_ms, {{keyText "t"}} AS key
        FROM {{.Table}} AS t
        WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $2 AND $2 < $3
        ORDER BY {{.Seq}}
        LIMIT $4
    ) AS r
) AS h;

-- name: parked
-- $1 parked ids. Those still pending, with milliseconds until each is due,
-- read through the primary key.
SELECT {{.ID}}, extract(epoch FROM {{.AvailableAt}} - now())::float8 * 1000
FROM {{.Table}}
WHERE {{.ID}} = ANY ($1::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE;

-- name: sweep
-- $1, $2 a seq range below the floor. Its pending rows, with milliseconds
-- until each is due and, in ordered mode, its aggregate.
SELECT {{.ID}}, extract(epoch FROM {{.AvailableAt}} - now())::float8 * 1000, {{keyText "t"}}
FROM {{.Table}} AS t
WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $1 AND {{.Seq}} <= $2;

-- name: check
-- Proves the table and every mapped column exist, reading no row.
SELECT {{.ID}}, {{.Seq}}, {{.EventID}}, {{.AggregateType}}, {{.AggregateID}}, {{.EventType}},
    {{.Payload}}, {{.PayloadBytes}}, {{.ContentType}}, {{.Headers}}, {{.Exchange}}, {{.RoutingKey}}, {{.Status}}, {{.Attempts}},
    {{.AvailableAt}}, {{.LeaseID}}, {{.LastError}}, {{.CreatedAt}}, {{.PublishedAt}}
FROM {{.Table}} LIMIT 0;

-- name: sample
-- $1 the table (regclass text); $2 whether dead-lettered events block
-- their aggregates (ordered mode under the block policy); $3 the floor;
-- $4 the parked rows (floor.go). The table's gauges in one statement, so
-- one snapshot: pending rows are counted above the floor, through the
-- pending index, and below it among the parked rows, through the primary
-- key (every pending row below the floor is parked), so the count reads
-- none of the index entries a long transaction keeps vacuum from removing;
-- scheduled rows (never attempted, not yet due, no lease) are counted the
-- same way, above the floor reading the pending rows there (a scheduled row
-- the floor passed is parked);
-- failed rows are counted through their partial index; the oldest pending
-- event is the first parked row or else the first row above the floor,
-- among those due or attempted (a scheduled event waiting for its time is
-- not late), aged from its time if it was scheduled;
-- the planner's row count (refreshed by autovacuum and ANALYZE) stands for
-- the whole table; and the blocked aggregates are read through the failed
-- index only when $2 holds (the subquery is an InitPlan, evaluated only
-- when the CASE reaches it).
SELECT
    (SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $3)
        + (SELECT count(*) FROM {{.Table}} WHERE {{.ID}} = ANY ($4::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE),
    (SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $3
        AND {{.Attempts}} = 0 AND {{.LeaseID}} IS NULL AND {{.AvailableAt}} > now())
        + (SELECT count(*) FROM {{.Table}} WHERE {{.ID}} = ANY ($4::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE
            AND {{.Attempts}} = 0 AND {{.LeaseID}} IS NULL AND {{.AvailableAt}} > now()),
    (SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = {{.Failed}}),
    (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = $1::regclass),
    coalesce(extract(epoch FROM clock_timestamp() - coalesce(
        (SELECT CASE WHEN {{.Attempts}} = 0 THEN greatest({{.CreatedAt}}::timestamptz, {{.AvailableAt}}) ELSE {{.CreatedAt}}::timestamptz END
         FROM {{.Table}}
         WHERE {{.ID}} = ANY ($4::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE
           AND ({{.Attempts}} > 0 OR {{.AvailableAt}} <= now()) ORDER BY {{.Seq}} LIMIT 1),
        (SELECT CASE WHEN {{.Attempts}} = 0 THEN greatest({{.CreatedAt}}::timestamptz, {{.AvailableAt}}) ELSE {{.CreatedAt}}::timestamptz END
         FROM {{.Table}}
         WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $3
           AND ({{.Attempts}} > 0 OR {{.AvailableAt}} <= now()) ORDER BY {{.Seq}} LIMIT 1))), 0)::float8,
    CASE WHEN $2::bool THEN (SELECT count(*) FROM (
        SELECT DISTINCT {{key "o"}} FROM {{.Table}} AS o WHERE o.{{.Status}} = {{.Failed}}) AS blocked)
    ELSE 0 END;

-- name: insert_sequence
-- $1 the table (regclass text), $2 the seq column's name as it is. The
-- sequence that numbers the table's inserts, if the column owns one
-- (identity, serial, or OWNED BY); NULL otherwise.
SELECT pg_get_serial_sequence($1, $2);

-- name: check_seq
-- $1 the table (regclass text), $2 the seq column's name as it is. What the
-- floor depends on (floor.go): the column's sequence (NULL if it owns
-- none), that sequence's cache size, and whether every insert that does
-- not name the column draws from it (an identity column, or a default of
-- nextval of that sequence, and no other).
SELECT s.seq, q.seqcache,
    a.attidentity <> '' OR (pg_get_expr(d.adbin, d.adrelid) ~ '^nextval\(''([^'']|'''')*''::regclass\)$'
        AND EXISTS (SELECT 1 FROM pg_depend AS p WHERE p.classid = 'pg_attrdef'::regclass AND p.objid = d.oid
                      AND p.refclassid = 'pg_class'::regclass AND p.refobjid = to_regclass(s.seq)))
FROM pg_attribute AS a
LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
CROSS JOIN LATERAL (SELECT pg_get_serial_sequence($1, $2) AS seq) AS s
LEFT JOIN pg_sequence AS q ON q.seqrelid = to_regclass(s.seq)
WHERE a.attrelid = $1::regclass AND a.attname = $2 AND NOT a.attisdropped;

-- name: last_insert_id
-- $1 the sequence (regclass text). The last value it handed out: it grows
-- with every insert, committed or not, and is read outside MVCC, so it
-- measures the producers whatever the relay has claimed. 0 before the
-- first.
SELECT coalesce(pg_sequence_last_value($1::regclass), 0);

-- name: notify_waiters
-- How many transactions wait to commit behind the lock PostgreSQL takes on
-- every commit that sent NOTIFY (async.c, PreCommit_Notify: an exclusive
-- lock on the shared object pg_database/0, held through the commit's WAL
-- flush). Waiters mean notifying producers are queued one behind another:
-- the cost the gate exists to lift. pg_locks is readable by every role.
SELECT count(*)::int FROM pg_locks
 WHERE locktype = 'object' AND database = 0
   AND classid = 'pg_database'::regclass AND objid = 0 AND NOT granted;
