-- The trigger notifies only while a relay is listening.
--
-- Until now a producer notified unless a busy relay held the gate lock, so
-- with no relay running (a deploy, a crash, an outage of the relay's host)
-- every insert took PostgreSQL's NOTIFY lock, which serializes commits:
-- 32 producers kept 31-36 % of their trigger-off rate. A relay's listener
-- now holds the listen lock, (1868722811, hashtext(channel)), exclusive and
-- for as long as its LISTEN session lives; the trigger tries it shared in
-- its WHEN clause first. Succeeding, no relay listens: the trigger is
-- skipped, and the producer keeps the lock shared to its commit, so a
-- listener taking the lock waits for every producer that did not notify and
-- then claims, finding their events. Failing, a relay listens (or is about
-- to: a waiting request fails the try too), and the gate lock decides as
-- before. A relay that dies releases the listen lock with its session.
--
-- The function gets the same test, for triggers without a WHEN clause. Each
-- trigger on outbox that calls it is replaced keeping its name, its channel
-- and gate sequence, and its enabled state (an operator's DISABLE, or
-- ENABLE ALWAYS or REPLICA, stays).
CREATE OR REPLACE FUNCTION outboxrelay_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_NARGS > 1 AND (pg_try_advisory_xact_lock_shared(1868722811, hashtext(TG_ARGV[0]))
                         OR NOT pg_try_advisory_xact_lock_shared(1868722809, hashtext(TG_ARGV[0]))) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

DO $$
DECLARE
    t    record;
    args text[];
    rest bytea;
    cut  int;
BEGIN
    FOR t IN
        SELECT tg.tgname, tg.tgenabled, tg.tgargs FROM pg_trigger AS tg
         WHERE tg.tgrelid = 'outbox'::regclass AND NOT tg.tgisinternal
           AND tg.tgfoid = 'outboxrelay_notify()'::regprocedure
    LOOP
        -- tgargs holds the arguments, each ended by a zero byte.
        args := '{}';
        rest := t.tgargs;
        WHILE length(rest) > 0 LOOP
            cut := position('\x00'::bytea IN rest);
            args := args || convert_from(substring(rest FROM 1 FOR cut - 1), current_setting('server_encoding'));
            rest := substring(rest FROM cut + 1);
        END LOOP;
        CONTINUE WHEN cardinality(args) < 2; -- not gated: it always notifies
        EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON outbox FOR EACH STATEMENT '
            'WHEN (NOT pg_try_advisory_xact_lock_shared(1868722811, hashtext(%L)) AND pg_try_advisory_xact_lock_shared(1868722809, hashtext(%L))) '
            'EXECUTE FUNCTION outboxrelay_notify(%L, %L)',
            t.tgname, args[1], args[1], args[1], args[2]);
        CASE t.tgenabled
            WHEN 'D' THEN EXECUTE format('ALTER TABLE outbox DISABLE TRIGGER %I', t.tgname);
            WHEN 'A' THEN EXECUTE format('ALTER TABLE outbox ENABLE ALWAYS TRIGGER %I', t.tgname);
            WHEN 'R' THEN EXECUTE format('ALTER TABLE outbox ENABLE REPLICA TRIGGER %I', t.tgname);
            ELSE NULL;
        END CASE;
    END LOOP;
END
$$;
