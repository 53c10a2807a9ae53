-- The inbox table of github.com/outboxrelay/outboxrelay/inbox: one row per
-- (consumer, message id) a consumer has seen. Plain DDL, idempotent: run it
-- with psql, or put it in your own migrations. inbox.Migrate runs the same
-- statements with the table name it is given. The key's columns compare
-- bytewise (COLLATE "C"): ids are opaque, and memcmp is the cheapest
-- comparison for the primary key's btree.
CREATE TABLE IF NOT EXISTS "inbox" (
    consumer     text        COLLATE "C" NOT NULL,
    message_id   text        COLLATE "C" NOT NULL,
    processed_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Cleanup finds records older than the dedupe window by updated_at. A BRIN
-- index: records are written in time order, so block ranges map to time
-- ranges; it adds about 15 bytes of WAL per message where a btree on
-- updated_at adds about 65, and it stays a few pages small. autosummarize
-- has autovacuum summarize each block range once it is full.
CREATE INDEX IF NOT EXISTS "inbox_updated_at_brin" ON "inbox" USING brin (updated_at)
    WITH (autosummarize = on);
