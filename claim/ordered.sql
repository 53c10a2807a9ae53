-- The ordered claim (Config.Ordering "aggregate"). {{.X}} as in
-- queries.sql; {{key "p"}} lists the ordering key's columns of alias p,
-- {{keyAs "p"}} the same named k0, k1, …, {{keyOf "h"}} those names of
-- alias h, and {{size "p"}} the stored size of a row's payload and headers.
-- {{.Blocking}} are the statuses that hold an aggregate back: pending, and
-- failed under the block policy.
--
-- An aggregate's head is its first row, by id, of a blocking status. An
-- aggregate is claimable only while its head is pending and due
-- (available_at <= now()): a head that is leased, backing off or
-- dead-lettered (block policy) blocks its aggregate with no state beyond
-- the rows themselves. From each claimable head the claim takes a run of
-- the aggregate's consecutive due rows; the relay publishes a run one event
-- at a time, each once its predecessor is confirmed.
--
-- Steps:
--   heads  the claimable heads, at most $6 (design below): $1 while
--          aggregates are shallow; fewer, with longer runs, while they
--          are deep (the store's depth gauge);
--   runs   each head and up to ceil($1 / heads) - 1 more rows of its
--          aggregate, through the ordering index;
--   cut    each run up to its first row that is not due;
--   locked FOR UPDATE SKIP LOCKED on what is left (PostgreSQL refuses FOR
--          UPDATE beside DISTINCT or window functions, so the lock is taken
--          here, a level above the choice). A row changed by a claim that
--          committed meanwhile is re-checked and dropped;
--   kept   of each run, the prefix this claim locked: a run whose head
--          another claim holds is dropped whole;
--   sized  the count and byte budgets, filled rank by rank (the first event
--          of every run, then the second, …) so a batch spans as many
--          aggregates as it can.
-- It returns each row with its key as text and, in every row, the cursor
-- (the last head's id, where the next claim's walk starts) and "more":
-- whether claimable heads are left beyond the batch.

-- name: claim_ordered
-- $1 batch size, $2 lease in milliseconds, $3 lease id, $4 byte budget,
-- $5 cursor (a row id; 0 or a deleted row starts from the first key),
-- $6 the most heads to take (at most $1).
WITH RECURSIVE
start AS (
    SELECT {{keyAs "s"}} FROM {{.Table}} AS s WHERE s.{{.ID}} = $5::bigint
),
{{- if eq .Design "distinct"}}
-- Seed 003's approach B: DISTINCT ON picks every aggregate's head out of
-- all blocking rows; the oldest claimable heads go first.
heads AS (
    SELECT * FROM (
        SELECT DISTINCT ON ({{key "p"}}) {{keyAs "p"}}, p.{{.ID}} AS id, p.{{.ID}} AS n,
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now() AS ready,
            {{size "p"}} AS size
        FROM {{.Table}} AS p
        WHERE p.{{.Status}} IN ({{.Blocking}})
        ORDER BY {{key "p"}}, p.{{.ID}}) AS d
    WHERE ready
    ORDER BY id
    LIMIT $6
),
-- With every head in hand, "more" is only a guess: a full batch.
more AS (
    SELECT count(*) >= $6 AS more FROM heads
),
{{- else}}
-- The key walk: a loose index scan over the ordering index that visits one
-- aggregate per step, from the key after the cursor's round the table and
-- back to it, so every aggregate gets its turn (round robin) whatever its
-- backlog. It stops as soon as it has found $6 claimable heads: a claim
-- costs one index descent per aggregate it passes, never one per row.
walk AS (
    (SELECT x.* FROM (
        (SELECT {{keyAs "p"}}, p.{{.ID}} AS id,
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now() AS ready,
            {{size "p"}} AS size, false AS wrapped, 1 AS n
         FROM {{.Table}} AS p
         WHERE p.{{.Status}} IN ({{.Blocking}}) AND ({{key "p"}}) > (SELECT {{keyOf "start"}} FROM start)
         ORDER BY {{key "p"}}, p.{{.ID}} LIMIT 1)
        UNION ALL
        (SELECT {{keyAs "p"}}, p.{{.ID}},
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now(), {{size "p"}}, true, 1
         FROM {{.Table}} AS p
         WHERE p.{{.Status}} IN ({{.Blocking}})
         ORDER BY {{key "p"}}, p.{{.ID}} LIMIT 1)
        LIMIT 1) AS x)
    UNION ALL
    SELECT x.* FROM walk AS w CROSS JOIN LATERAL (
        (SELECT {{keyAs "p"}}, p.{{.ID}} AS id,
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now() AS ready,
            {{size "p"}} AS size, w.wrapped, w.n + 1 AS n
         FROM {{.Table}} AS p
         WHERE p.{{.Status}} IN ({{.Blocking}}) AND ({{key "p"}}) > ({{keyOf "w"}})
         ORDER BY {{key "p"}}, p.{{.ID}} LIMIT 1)
        UNION ALL
        (SELECT {{keyAs "p"}}, p.{{.ID}},
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now(), {{size "p"}}, true, w.n + 1
         FROM {{.Table}} AS p
         WHERE NOT w.wrapped AND p.{{.Status}} IN ({{.Blocking}})
         ORDER BY {{key "p"}}, p.{{.ID}} LIMIT 1)
        LIMIT 1) AS x
    WHERE NOT coalesce(x.wrapped AND ({{keyOf "x"}}) > (SELECT {{keyOf "start"}} FROM start), false)
),
heads AS (
    SELECT * FROM walk WHERE ready LIMIT $6
),
-- Whether the walk finds another claimable head within a short stretch
-- ($1 / 4 + 1 aggregates) past the batch's last: only then is another
-- worker's claim worth its walk. A walk that ran out short of $6 heads
-- has nothing more to give.
more AS (
    SELECT coalesce((
        SELECT w.ready FROM walk AS w
        WHERE w.n > (SELECT max(n) FROM heads)
          AND (w.ready OR w.n >= (SELECT max(n) FROM heads) + $1 / 4 + 1)
        LIMIT 1), false) AS more
),
{{- end}}
runs AS (
    -- The head itself, then the rest of its run: with as many heads as the
    -- batch takes, the run is the head alone, and LIMIT 0 reads nothing.
    SELECT h.id, h.id AS head, h.n AS hn, true AS ready, h.size
    FROM heads AS h
    UNION ALL
    SELECT r.id, h.id, h.n, r.ready, r.size
    FROM heads AS h CROSS JOIN LATERAL (
        SELECT p.{{.ID}} AS id,
            p.{{.Status}} = {{.Pending}} AND p.{{.AvailableAt}} <= now() AS ready,
            {{size "p"}} AS size
        FROM {{.Table}} AS p
        WHERE ({{key "p"}}) = ({{keyOf "h"}}) AND p.{{.Status}} IN ({{.Blocking}}) AND p.{{.ID}} > h.id
        ORDER BY p.{{.ID}}
        LIMIT (SELECT ceil($1::float8 / count(*))::bigint - 1 FROM heads)) AS r
),
cut AS (
    SELECT id, head, hn, rank, size FROM (
        SELECT r.*, row_number() OVER w AS rank, bool_and(r.ready) OVER w AS ok
        FROM runs AS r
        WINDOW w AS (PARTITION BY r.head ORDER BY r.id)) AS c
    WHERE ok
),
locked AS (
    SELECT t.{{.ID}} AS id FROM {{.Table}} AS t
    WHERE t.{{.ID}} = ANY (ARRAY (SELECT id FROM cut))
      AND t.{{.Status}} = {{.Pending}} AND t.{{.AvailableAt}} <= now()
    FOR UPDATE SKIP LOCKED
),
kept AS (
    SELECT id, rank, hn, size FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.head ORDER BY c.rank) AS got
        FROM cut AS c JOIN locked AS l ON l.id = c.id) AS k
    WHERE got = rank
),
sized AS (
    SELECT id, row_number() OVER w AS n, sum(size) OVER w AS upto
    FROM kept
    WINDOW w AS (ORDER BY rank, hn)
)
UPDATE {{.Table}} AS o SET
    {{.AvailableAt}} = now() + $2 * interval '1 millisecond',
    {{.LeaseID}} = $3,
    {{.Attempts}} = o.{{.Attempts}} + 1
WHERE o.{{.ID}} = ANY (ARRAY (SELECT id FROM sized WHERE n <= $1 AND (n = 1 OR upto <= $4)))
RETURNING o.{{.ID}}, o.{{.EventID}}::text, o.{{.AggregateType}}::text, o.{{.AggregateID}}::text,
    o.{{.EventType}}::text, o.{{.Payload}}::text, o.{{.Headers}}::text, o.{{.Exchange}}::text,
    o.{{.RoutingKey}}::text, o.{{.CreatedAt}}::timestamptz, o.{{.Attempts}},
    ROW({{key "o"}})::text, (SELECT id FROM heads ORDER BY n DESC LIMIT 1), (SELECT more FROM more);

-- name: check_ordering
-- $1 the table (regclass text), $2 the ordering key's columns then the id
-- column. Proves a valid index leads with them, so no claim scans the table.
SELECT EXISTS (
    SELECT 1 FROM pg_index AS i
    WHERE i.indrelid = $1::regclass AND i.indisvalid
      AND (SELECT array_agg(a.attname::text ORDER BY k.ord)
           FROM unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
           JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE k.ord <= cardinality($2::text[])) = $2::text[]);
