-- The wake-up gate: producers send NOTIFY only while a relay may be waiting.
--
-- PostgreSQL serializes the commits of transactions that sent NOTIFY (each
-- holds one cluster-wide lock through its commit's WAL flush), which caps
-- notifying producers far below what they reach otherwise. A relay that is
-- busy claims continuously and needs no wake-up, so it closes the gate: it
-- sets outbox_wakeup to a deadline (milliseconds since the epoch, refreshed
-- while it stays busy) before which the trigger skips NOTIFY. Going idle it
-- opens the gate again (0), waits for every producer that may have read the
-- closed gate to finish, and claims once more, so no wake-up is lost. A
-- relay that dies with the gate closed leaves it to expire on its own.
--
-- The shared advisory lock the trigger takes before reading the gate is what
-- the relay waits on: key (1868722808, hashtext(channel)). The trigger only
-- ever tries it: producers never wait for a relay.
CREATE SEQUENCE outbox_wakeup MINVALUE 0 START 0;
SELECT setval('outbox_wakeup', 0, true); -- open
COMMENT ON SEQUENCE outbox_wakeup IS
    'outboxrelay wake-up gate: the outbox trigger skips NOTIFY until this time (ms since the epoch); 0 means always notify.';
-- Every producer's trigger reads it.
GRANT SELECT ON SEQUENCE outbox_wakeup TO PUBLIC;

-- TG_ARGV[0] is the channel, TG_ARGV[1] (optional) the schema-qualified gate
-- sequence. A missing gate fails open: the trigger notifies.
CREATE OR REPLACE FUNCTION outboxrelay_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_NARGS > 1 AND pg_try_advisory_xact_lock_shared(1868722808, hashtext(TG_ARGV[0])) THEN
        IF pg_sequence_last_value(to_regclass(TG_ARGV[1])) > date_part('epoch', clock_timestamp()) * 1000 THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

-- The trigger names the gate with its schema, so producers whose search_path
-- differs find it.
DO $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox '
        'FOR EACH STATEMENT EXECUTE FUNCTION outboxrelay_notify(%L, %L)',
        'outbox', format('%I.%I', current_schema(), 'outbox_wakeup'));
END
$$;
