-- The ordered claim (Config.Ordering "aggregate"). {{.X}} as in
-- queries.sql; {{key "p"}} lists the ordering key's columns of alias p,
-- {{keyAs "p"}} the same named k0, k1, …, {{keyOf "h"}} those names of
-- alias h, and {{size "p"}} the stored size of a row's payload and headers.
--
-- An aggregate's head is its first row, in insert order (the seq column),
-- that is pending or, under
-- the block policy, failed. An aggregate is claimable only while its head
-- is pending and due (available_at <= now()): a head that is leased,
-- backing off or dead-lettered blocks its aggregate with no state beyond
-- the rows themselves. From each claimable head the claim takes a run of
-- the aggregate's consecutive due rows; the relay publishes a run one event
-- at a time, each once its predecessor is confirmed.
--
-- The claim reads no row below the floor but the parked ones (floor.go), so
-- it walks none of the index entries that published rows leave behind
-- while vacuum is held back. Every pending row below the floor is parked,
-- so the candidates (the first pending rows above the floor, and every
-- parked row) hold each of their aggregates' pending rows from the
-- aggregate's first on: an aggregate's first candidate is its head, unless
-- a dead letter comes before it, which the failed rows' own index (by
-- aggregate, then seq) tells with one descent. A dead letter that a requeue
-- (or a hand) sets back to pending lies below the floor, unparked until
-- the relays' rescan: it keeps its last error, so the same index finds it
-- and it holds its aggregate back meanwhile.
--
-- The planner takes each step below for a row or two, however many it
-- holds: where two steps meet, they meet through an array, never a join,
-- which it would make a nested loop over hundreds of rows each.
--
-- Steps:
--   cand   the first $6 pending rows above the floor, and every parked row;
--   ranked each aggregate's candidates in seq order, with its first (its
--          head, when the aggregate has no dead letter before it) and
--          whether every one up to it is due;
--   runs   the rows whose head and predecessors are due, with no row of
--          their aggregate before them that a publish failed (a dead
--          letter under the block policy, or a pending row with an
--          error), rank by rank up to twice the batch;
--   locked FOR UPDATE SKIP LOCKED on the runs (PostgreSQL refuses FOR
--          UPDATE beside window functions, so the lock is taken here, a
--          level above the choice). A row changed by a claim that
--          committed meanwhile is re-checked and dropped;
--   kept   of each run, the prefix this claim locked: a run whose head
--          another claim holds is dropped whole;
--   sized  the count and byte budgets, filled rank by rank (the first event
--          of every run, oldest aggregates first, then the second, …) so a
--          batch spans as many aggregates as it can.
-- It returns each row with its key as text and, in every row, how many
-- heads the read found if it read all of its $6 rows, and whether the
-- claim left claimable rows beyond the batch ("more").

-- name: claim_ordered
-- $1 batch size, $2 lease in milliseconds, $3 lease id, $4 byte budget,
-- $5 the floor, $6 how many pending rows above it to read, $7 every parked
-- row (due or not: a parked row not due blocks its aggregate).
WITH
cand AS (
    SELECT * FROM (
        SELECT p.{{.ID}} AS id, p.{{.Seq}} AS seq, {{keyAs "p"}}, p.{{.AvailableAt}} <= now() AS ready, {{size "p"}} AS size
        FROM {{.Table}} AS p
        WHERE p.{{.Status}} = {{.Pending}} AND p.{{.Seq}} > $5
        ORDER BY p.{{.Seq}}
        LIMIT $6) AS above
    UNION ALL
    -- The parked rows, through the primary key ((…) IS TRUE: queries.sql).
    SELECT p.{{.ID}}, p.{{.Seq}}, {{keyAs "p"}}, p.{{.AvailableAt}} <= now(), {{size "p"}}
    FROM {{.Table}} AS p
    WHERE p.{{.ID}} = ANY ($7::bigint[]) AND (p.{{.Status}} = {{.Pending}}) IS TRUE
),
ranked AS (
    SELECT c.*, row_number() OVER w AS rank, bool_and(c.ready) OVER w AS ok, first_value(c.id) OVER w AS head,
        first_value(c.seq) OVER w AS head_seq
    FROM cand AS c
    WINDOW w AS (PARTITION BY {{keyOf "c"}} ORDER BY c.seq)
),
runs AS (
    SELECT * FROM (
        SELECT r.id, r.head, r.head_seq, r.rank, r.size, row_number() OVER (ORDER BY r.rank, r.head_seq) AS pos
        FROM ranked AS r
        -- An aggregate's rows that pass are a prefix of its ranks (ok, and
        -- the test below, hold for a row's predecessors if for the row),
        -- so no row gets a pos below its rank: a row ranked past twice the
        -- batch is dropped here, before the test and the ordering, which a
        -- deep aggregate's thousands of candidates would otherwise go
        -- through.
        WHERE r.ok AND r.rank <= 2 * $1
          -- Nothing the candidates miss comes before r in its aggregate: a
          -- dead letter (under the block policy), or a requeued one, pending
          -- with its error below the floor and not yet parked (every other
          -- pending row before r is a candidate). The index of the rows a
          -- publish failed, by aggregate, answers with one descent.
          AND NOT EXISTS (
            SELECT 1 FROM {{.Table}} AS b
            WHERE ({{key "b"}}) = ({{keyOf "r"}}) AND b.{{.Seq}} < r.seq
              AND (
              {{- if .BlockFailed}}b.{{.Status}} = {{.Failed}} OR {{end -}}
              (b.{{.Status}} = {{.Pending}} AND b.{{.LastError}} IS NOT NULL
               AND b.{{.Seq}} <= $5 AND b.{{.ID}} <> ALL (coalesce($7, '{}')::bigint[])))
        )) AS o
    -- Room for twice the batch, in the order it is filled: rows another
    -- claim holds are skipped, and a batch does not lock what it cannot take.
    WHERE pos <= 2 * $1
),
locked AS (
    SELECT t.{{.ID}} AS id FROM {{.Table}} AS t
    WHERE t.{{.ID}} = ANY (ARRAY (SELECT id FROM runs))
      AND (t.{{.Status}} = {{.Pending}}) IS TRUE AND t.{{.AvailableAt}} <= now()
    FOR UPDATE SKIP LOCKED
),
kept AS (
    -- Of each run, the prefix this claim locked. The runs and the locks
    -- meet through an array, not a join: the planner takes each for a row
    -- or two and would join them in a nested loop over hundreds.
    SELECT id, head, head_seq, rank, size FROM (
        SELECT r.*, row_number() OVER (PARTITION BY r.head ORDER BY r.rank) AS got
        FROM runs AS r
        WHERE r.id = ANY (ARRAY (SELECT id FROM locked))) AS k
    WHERE got = rank
),
sized AS (
    SELECT id, rank, n <= $1 AND (n = 1 OR upto <= $4) AS taken FROM (
        SELECT id, rank, row_number() OVER w AS n, sum(size) OVER w AS upto
        FROM kept
        WINDOW w AS (ORDER BY rank, head_seq)) AS s
)
UPDATE {{.Table}} AS o SET
    {{.AvailableAt}} = now() + $2 * interval '1 millisecond',
    {{.LeaseID}} = $3,
    {{.Attempts}} = o.{{.Attempts}} + 1
WHERE o.{{.ID}} = ANY (ARRAY (SELECT id FROM sized WHERE taken))
RETURNING o.{{.ID}}, o.{{.Seq}}, o.{{.EventID}}::text, o.{{.AggregateType}}::text, o.{{.AggregateID}}::text,
    o.{{.EventType}}::text, o.{{.Payload}}::text, o.{{.Headers}}::text, o.{{.Exchange}}::text,
    o.{{.RoutingKey}}::text, o.{{.CreatedAt}}::timestamptz, o.{{.Attempts}}, o.{{.PayloadBytes}}, o.{{.ContentType}}::text,
    -- The key as text; how many heads a full read found (NULL when the
    -- read came back short of $6 rows: no more are pending); then "more",
    -- a head left out of the batch, which another claim can take.
    ROW({{key "o"}})::text,
    CASE WHEN (SELECT count(*) FROM cand) >= $6 THEN (SELECT count(*) FROM ranked WHERE rank = 1 AND ready) END,
    EXISTS (SELECT 1 FROM sized WHERE rank = 1 AND NOT taken);

-- name: check_ordering
-- $1 the table (regclass text), $2 the ordering key's columns then the seq
-- column. Proves a valid index leads with them, so no claim scans the table.
SELECT EXISTS (
    SELECT 1 FROM pg_index AS i
    WHERE i.indrelid = $1::regclass AND i.indisvalid
      AND (SELECT array_agg(a.attname::text ORDER BY k.ord)
           FROM unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
           JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE k.ord <= cardinality($2::text[])) = $2::text[]);
