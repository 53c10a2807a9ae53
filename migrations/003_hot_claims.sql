-- Room on every page for a row's next version. A claim changes only columns
-- no index covers (available_at, lease_id, attempts), so with free space on
-- the row's page PostgreSQL updates it in place (a HOT update): no new index
-- entries and less WAL. On the benchmark's 100,000-event drain this cut the
-- database's CPU per event by about a fifth. The outbox is a queue whose
-- published rows are pruned, so the extra space stays small. Applies to
-- pages written from now on.
ALTER TABLE outbox SET (fillfactor = 50);
