-- The relay's own insert order: relay_seq, drawn at every insert from an
-- identity sequence of cache 1. Claims, the claims' floor and ordered
-- delivery follow it instead of id (claim/floor.go, docs/decisions/0005).
-- id stays the row's identity, and the application's to hand out: a
-- sequence with CACHE above 1, ids taken in blocks ahead of the insert (an
-- ORM's pooled or HiLo optimizer), nextval() called before the insert, or
-- ids the application chooses may commit in any order. relay_seq is taken
-- by the INSERT itself, while it holds the table's ROW EXCLUSIVE lock, one
-- value at a time, which is what the floor's frontier relies on. GENERATED
-- ALWAYS refuses a value given by the application.
--
-- Existing rows are numbered in id order, so a backlog keeps its order.
ALTER TABLE outbox ADD COLUMN relay_seq bigint;
UPDATE outbox SET relay_seq = o.n
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox) AS o
WHERE outbox.id = o.id;
ALTER TABLE outbox ALTER COLUMN relay_seq SET NOT NULL;
ALTER TABLE outbox ALTER COLUMN relay_seq ADD GENERATED ALWAYS AS IDENTITY (CACHE 1);
SELECT setval(pg_get_serial_sequence('outbox', 'relay_seq'), max(relay_seq)) FROM outbox HAVING max(relay_seq) IS NOT NULL;
COMMENT ON COLUMN outbox.relay_seq IS 'Insert order, drawn by the insert (cache 1); claims and ordered delivery follow it. The relay''s: never set it.';
COMMENT ON COLUMN outbox.id IS 'The event''s row identity; any source of ids will do.';

-- What the claim scans: pending rows in insert order.
DROP INDEX outbox_pending_idx;
CREATE INDEX outbox_pending_idx ON outbox (relay_seq) WHERE status = 'pending';
