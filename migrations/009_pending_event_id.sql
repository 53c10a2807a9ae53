-- Pending events by their event id, for the producer library's Cancel
-- (outbox.Writer.Cancel: DELETE ... WHERE event_id = ANY (...) AND status =
-- 'pending' AND attempts = 0 AND lease_id IS NULL), which would otherwise
-- read the whole table. Partial on the pending rows, as the claim index: a
-- row enters it at its insert and leaves it at its mark, so it stays as
-- small as the backlog (and the scheduled events). A claim's update does
-- not touch it (event_id and status do not change), so claims stay HOT
-- updates. The build reads the table once, holding off inserts meanwhile.
CREATE INDEX outbox_pending_event_id_idx ON outbox (event_id) WHERE status = 'pending';
