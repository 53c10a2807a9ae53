-- Statements of the admin commands. {{.X}} stands for an identifier from the
-- configuration (the table, a column), quoted with pgx.Identifier; {{key
-- "a"}} lists the ordering key's columns of alias a and {{keyText "a"}} the
-- same cast to text. Every value, the status values included, is a
-- parameter.

-- name: status
-- $1 pending, $2 published, $3 failed. Each status is counted on its own,
-- so each count can read its partial index (pending, published, failed)
-- rather than the whole table. A pending row is in flight while a live
-- lease holds it, waits for a retry while no lease does, it was attempted
-- and it is not due yet, and is scheduled while it was never attempted and
-- is not due yet. The oldest pending event is among those due or
-- attempted, aged from its time if it was scheduled.
SELECT p.pending, (SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = $2),
    (SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = $3),
    p.in_flight, p.retrying, p.scheduled, p.oldest_age
FROM (
    SELECT count(*) AS pending,
        count(*) FILTER (WHERE {{.LeaseID}} IS NOT NULL AND {{.AvailableAt}} > now()) AS in_flight,
        count(*) FILTER (WHERE {{.LeaseID}} IS NULL AND {{.AvailableAt}} > now() AND {{.Attempts}} > 0) AS retrying,
        count(*) FILTER (WHERE {{.LeaseID}} IS NULL AND {{.AvailableAt}} > now() AND {{.Attempts}} = 0) AS scheduled,
        extract(epoch FROM now() - min(CASE WHEN {{.Attempts}} = 0 THEN greatest({{.CreatedAt}}::timestamptz, {{.AvailableAt}})
            ELSE {{.CreatedAt}}::timestamptz END) FILTER (WHERE {{.Attempts}} > 0 OR {{.AvailableAt}} <= now()))::float8 AS oldest_age
    FROM {{.Table}}
    WHERE {{.Status}} = $1) AS p;

-- name: failed_by_event_type
-- $1 failed.
SELECT {{.EventType}}::text AS event_type, count(*)
FROM {{.Table}}
WHERE {{.Status}} = $1
GROUP BY 1
ORDER BY 2 DESC, 1;

-- name: blocked
-- $1 pending, $2 failed, $3 how many aggregates to list. In ordered mode
-- under the block policy an aggregate is blocked when its head, its first
-- pending or failed row in insert order (relay_seq), is failed: its later events wait for it.
-- Starting from the failed rows (few, and in the ordering index) each
-- probe is an index descent. Every row carries the totals.
SELECT key, id, event_type, waiting, count(*) OVER (), (sum(waiting) OVER ())::bigint
FROM (
    SELECT ARRAY[{{keyText "f"}}]::text[] AS key, f.{{.ID}} AS id, f.{{.EventType}}::text AS event_type,
        (SELECT count(*) FROM {{.Table}} AS p
         WHERE p.{{.Status}} = $1 AND ({{key "p"}}) = ({{key "f"}}) AND p.{{.Seq}} > f.{{.Seq}}) AS waiting
    FROM {{.Table}} AS f
    WHERE f.{{.Status}} = $2
      AND NOT EXISTS (
          SELECT 1 FROM {{.Table}} AS e
          WHERE e.{{.Status}} IN ($1, $2) AND ({{key "e"}}) = ({{key "f"}}) AND e.{{.Seq}} < f.{{.Seq}})
) AS blocked
ORDER BY id
LIMIT $3;

-- name: dead
-- $1 failed, $2 event type, $3 aggregate type, $4 aggregate id (each NULL
-- for any), $5 created at least this many milliseconds ago (NULL for any),
-- $6 limit (NULL for all). The last column counts every match, whatever
-- the limit.
SELECT {{.ID}}, {{.EventID}}::text, {{.AggregateType}}::text, {{.AggregateID}}::text,
    {{.EventType}}::text, {{.Exchange}}::text, {{.RoutingKey}}::text, {{.Attempts}},
    {{.LastError}}::text, {{.CreatedAt}}::timestamptz, {{.ContentType}}::text, octet_length({{.PayloadBytes}})::bigint,
    count(*) OVER ()
FROM {{.Table}}
WHERE {{.Status}} = $1
  AND ($2::text IS NULL OR {{.EventType}} = $2)
  AND ($3::text IS NULL OR {{.AggregateType}} = $3)
  AND ($4::text IS NULL OR {{.AggregateID}} = $4)
  AND ($5::bigint IS NULL OR {{.CreatedAt}}::timestamptz < now() - $5 * interval '1 millisecond')
ORDER BY {{.ID}}
LIMIT $6::bigint;

-- name: requeue_preview
-- $1 failed, $2 ids, $3 event type (both NULL: every dead-lettered event).
-- What requeue would change, with the columns of dead.
SELECT {{.ID}}, {{.EventID}}::text, {{.AggregateType}}::text, {{.AggregateID}}::text,
    {{.EventType}}::text, {{.Exchange}}::text, {{.RoutingKey}}::text, {{.Attempts}},
    {{.LastError}}::text, {{.CreatedAt}}::timestamptz, {{.ContentType}}::text, octet_length({{.PayloadBytes}})::bigint,
    count(*) OVER ()
FROM {{.Table}}
WHERE {{.Status}} = $1
  AND ($2::bigint[] IS NULL OR {{.ID}} = ANY ($2))
  AND ($3::text IS NULL OR {{.EventType}} = $3)
ORDER BY {{.ID}};

-- name: requeue
-- $1 pending, $2 failed, $3 ids, $4 event type (both NULL: every
-- dead-lettered event). The event starts over: no attempts, due now, no
-- lease. last_error is kept (the next failure overwrites it) as the only
-- record of why it was dead-lettered.
UPDATE {{.Table}} SET
    {{.Status}} = $1,
    {{.Attempts}} = 0,
    {{.AvailableAt}} = now(),
    {{.LeaseID}} = NULL
WHERE {{.Status}} = $2
  AND ($3::bigint[] IS NULL OR {{.ID}} = ANY ($3))
  AND ($4::text IS NULL OR {{.EventType}} = $4)
RETURNING {{.ID}};

-- name: notify
-- $1 the relay's channel, $2 notify.RequeuePayload. Sent in the requeue's
-- transaction, so delivered on its commit: the relays look again below
-- their floor, where the requeued rows are.
SELECT pg_notify($1, $2);

-- name: emit
-- $1 aggregate type, $2 aggregate id (NULL: the sequence number), $3 event
-- type, $4 payload (NULL: {"demo": true, "n": <sequence number>}), $5
-- exchange, $6 routing key (NULL: the relay's defaults), $7 the first and
-- $8 the last sequence number. The table's trigger notifies the relay.
INSERT INTO {{.Table}} ({{.AggregateType}}, {{.AggregateID}}, {{.EventType}}, {{.Payload}}, {{.Exchange}}, {{.RoutingKey}})
SELECT $1::text, coalesce($2::text, n::text), $3::text,
    coalesce($4::jsonb, jsonb_build_object('demo', true, 'n', n)), $5::text, $6::text
FROM generate_series($7::bigint, $8::bigint) AS n;
