-- The dead letters' own index. The relay's gauges (outboxrelay_outbox_events
-- {status="failed"}, outboxrelay_blocked_aggregates) and `outboxrelay status`
-- and `dead` count and list the failed rows; through this index that reads
-- the dead letters only, not a table of millions of published rows. It stays
-- as small as the dead letters: a claim, a mark or a retry never touches it.
CREATE INDEX outbox_failed_idx ON outbox (id) WHERE status = 'failed';
