-- outboxrelay drop-in, undone: removes the NOTIFY trigger, its gate sequence
-- (TABLE_wakeup) and the relay's indexes from a table set up with
-- outboxrelay_install.sql, and the trigger function once no table uses it.
--
--   psql "$DATABASE_URL" -v table=outbox_events -f sql/outboxrelay_uninstall.sql
--
-- The columns the install added hold data, so they stay unless asked for:
-- -v drop_columns=on drops every column commented 'added by outboxrelay'.
-- Variables: table (required), schema (public), drop_columns (off).
-- Idempotent: running it again changes nothing.

\set ON_ERROR_STOP on
\if :{?table} \else \set table '' \endif
\if :{?schema} \else \set schema public \endif
\if :{?drop_columns} \else \set drop_columns off \endif

BEGIN;

SELECT set_config('outboxrelay.table', :'table', true),
       set_config('outboxrelay.schema', :'schema', true),
       set_config('outboxrelay.drop_columns', :'drop_columns', true)
\gset outboxrelay_ignored_

DO $uninstall$
DECLARE
    tbl  text := current_setting('outboxrelay.table');
    sch  text := current_setting('outboxrelay.schema');
    drop_cols boolean := current_setting('outboxrelay.drop_columns')::boolean;
    rel  regclass;
    col  record;
    idx  text;
BEGIN
    IF tbl = '' THEN
        RAISE EXCEPTION 'outboxrelay: name the table: psql -v table=NAME -f outboxrelay_uninstall.sql';
    END IF;
    rel := to_regclass(format('%I.%I', sch, tbl));
    IF rel IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: table %.% does not exist', sch, tbl;
    END IF;

    EXECUTE format('DROP TRIGGER IF EXISTS outboxrelay_notify ON %s', rel);
    FOREACH idx IN ARRAY ARRAY['_relay_id_idx', '_relay_pending_idx', '_relay_published_idx', '_relay_failed_idx',
                               '_relay_event_id_idx', '_relay_ordering_idx', '_relay_failed_key_idx'] LOOP
        EXECUTE format('DROP INDEX IF EXISTS %I.%I', sch, left(tbl, 40) || idx);
    END LOOP;
    IF to_regprocedure(format('%I.outboxrelay_notify()', sch)) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgfoid = to_regprocedure(format('%I.outboxrelay_notify()', sch))) THEN
        EXECUTE format('DROP FUNCTION %I.outboxrelay_notify()', sch);
    END IF;

    EXECUTE format('DROP SEQUENCE IF EXISTS %I.%I', sch, tbl || '_wakeup');

    IF drop_cols THEN
        FOR col IN
            SELECT a.attname FROM pg_attribute a
            WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
              AND col_description(rel, a.attnum) = 'added by outboxrelay'
        LOOP
            EXECUTE format('ALTER TABLE %s DROP COLUMN %I', rel, col.attname);
        END LOOP;
    END IF;
END
$uninstall$;

COMMIT;
