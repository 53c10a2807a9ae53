-- outboxrelay drop-in: make an existing outbox table work with the relay.
--
--   psql "$DATABASE_URL" -v table=outbox_events -f sql/outboxrelay_install.sql
--
-- Idempotent: running it again changes nothing. It installs, in one
-- transaction:
--   * the columns the relay needs that the table lacks (each commented
--     'added by outboxrelay', so the uninstall script can find them);
--   * a unique index on the ordering column and partial indexes on what the
--     relay claims, what its cleanup deletes and the dead letters it counts;
--   * the trigger function outboxrelay_notify() and a statement-level
--     AFTER INSERT trigger that sends NOTIFY on the channel (one
--     notification per inserting transaction, constant payload) unless a
--     busy relay holds its gate lock, and the sequence TABLE_wakeup that
--     relays also set for the triggers of earlier versions.
--
-- Variables (-v name=value), with their defaults:
--   table              (required) the table's name
--   schema             public
--   channel            outbox      must match the relay's --channel
--   id_column          relay_id    bigint giving insert order; added as an
--                                  identity column when missing; an existing
--                                  column must be an integer type
--   event_id_column    event_id    the AMQP message id; added as a uuid when
--                                  missing (an existing uuid id works: -v
--                                  event_id_column=id)
--   status_column      status      added as text when missing
--   created_at_column  created_at  added as timestamptz when missing
--   status_pending     pending     the status column's values; must match
--   status_published   published   the relay's --status-* flags
--   status_failed      failed
--   ordering           none        aggregate: also create the index the
--                                  relay's --ordering aggregate needs
--   ordering_key       aggregate_type,aggregate_id
--                                  the columns identifying an aggregate,
--                                  comma-separated; must match the relay's
--                                  --ordering-key (e.g. -v ordering_key=entity_key)
--
-- Then run the relay with --no-migrate --table (schema.)table and the
-- --column-* and --status-* flags that name what differs from its defaults.

\set ON_ERROR_STOP on
\if :{?table} \else \set table '' \endif
\if :{?schema} \else \set schema public \endif
\if :{?channel} \else \set channel outbox \endif
\if :{?id_column} \else \set id_column relay_id \endif
\if :{?event_id_column} \else \set event_id_column event_id \endif
\if :{?status_column} \else \set status_column status \endif
\if :{?created_at_column} \else \set created_at_column created_at \endif
\if :{?status_pending} \else \set status_pending pending \endif
\if :{?status_published} \else \set status_published published \endif
\if :{?status_failed} \else \set status_failed failed \endif
\if :{?ordering} \else \set ordering none \endif
\if :{?ordering_key} \else \set ordering_key aggregate_type,aggregate_id \endif

BEGIN;

SELECT set_config('outboxrelay.table', :'table', true),
       set_config('outboxrelay.schema', :'schema', true),
       set_config('outboxrelay.channel', :'channel', true),
       set_config('outboxrelay.id_column', :'id_column', true),
       set_config('outboxrelay.event_id_column', :'event_id_column', true),
       set_config('outboxrelay.status_column', :'status_column', true),
       set_config('outboxrelay.created_at_column', :'created_at_column', true),
       set_config('outboxrelay.status_pending', :'status_pending', true),
       set_config('outboxrelay.status_published', :'status_published', true),
       set_config('outboxrelay.status_failed', :'status_failed', true),
       set_config('outboxrelay.ordering', :'ordering', true),
       set_config('outboxrelay.ordering_key', :'ordering_key', true)
\gset outboxrelay_ignored_

DO $install$
DECLARE
    tbl       text := current_setting('outboxrelay.table');
    sch       text := current_setting('outboxrelay.schema');
    chan      text := current_setting('outboxrelay.channel');
    id_col    text := current_setting('outboxrelay.id_column');
    ev_col    text := current_setting('outboxrelay.event_id_column');
    st_col    text := current_setting('outboxrelay.status_column');
    ca_col    text := current_setting('outboxrelay.created_at_column');
    pending   text := current_setting('outboxrelay.status_pending');
    published text := current_setting('outboxrelay.status_published');
    failed    text := current_setting('outboxrelay.status_failed');
    ordering  text := current_setting('outboxrelay.ordering');
    key_cols  text[] := string_to_array(replace(current_setting('outboxrelay.ordering_key'), ' ', ''), ',');
    rel       regclass;
    col       record;
    id_type   regtype;
    enabled   "char";
BEGIN
    IF tbl = '' THEN
        RAISE EXCEPTION 'outboxrelay: name the table: psql -v table=NAME -f outboxrelay_install.sql';
    END IF;
    rel := to_regclass(format('%I.%I', sch, tbl));
    IF rel IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: table %.% does not exist', sch, tbl;
    END IF;

    SELECT atttypid::regtype INTO id_type
    FROM pg_attribute WHERE attrelid = rel AND attname = id_col AND NOT attisdropped;
    IF id_type IS NOT NULL AND id_type NOT IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN
        RAISE EXCEPTION 'outboxrelay: column %.% is %, not an integer type: name a new ordering column with -v id_column=relay_id',
            tbl, id_col, id_type;
    END IF;

    FOR col IN
        SELECT * FROM (VALUES
            (id_col,         'bigint GENERATED BY DEFAULT AS IDENTITY'),
            (ev_col,         'uuid NOT NULL DEFAULT gen_random_uuid()'),
            (st_col,         format('text NOT NULL DEFAULT %L', pending)),
            (ca_col,         'timestamptz NOT NULL DEFAULT now()'),
            ('headers',      'jsonb'),
            ('exchange',     'text'),
            ('routing_key',  'text'),
            ('attempts',     'integer NOT NULL DEFAULT 0'),
            ('available_at', 'timestamptz NOT NULL DEFAULT now()'),
            ('lease_id',     'uuid'),
            ('last_error',   'text'),
            ('published_at', 'timestamptz')
        ) AS c (name, definition)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = col.name AND NOT attisdropped) THEN
            EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', rel, col.name, col.definition);
            EXECUTE format('COMMENT ON COLUMN %s.%I IS %L', rel, col.name, 'added by outboxrelay');
            RAISE NOTICE 'outboxrelay: added column %', col.name;
        END IF;
    END LOOP;

    EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %s (%I)',
        left(tbl, 40) || '_relay_id_idx', rel, id_col);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (%I) WHERE %I = %L',
        left(tbl, 40) || '_relay_pending_idx', rel, id_col, st_col, pending);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (published_at) WHERE %I = %L',
        left(tbl, 40) || '_relay_published_idx', rel, st_col, published);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (%I) WHERE %I = %L',
        left(tbl, 40) || '_relay_failed_idx', rel, id_col, st_col, failed);

    -- Ordered mode walks this index from aggregate to aggregate and along
    -- each aggregate's events; only the rows that can hold an aggregate
    -- back (pending and failed) are in it.
    IF ordering NOT IN ('none', 'aggregate') THEN
        RAISE EXCEPTION 'outboxrelay: ordering %: want none or aggregate', ordering;
    END IF;
    IF ordering = 'aggregate' THEN
        IF cardinality(key_cols) = 0 OR '' = ANY (key_cols) THEN
            RAISE EXCEPTION 'outboxrelay: ordering_key %: want comma-separated column names', current_setting('outboxrelay.ordering_key');
        END IF;
        FOR i IN 1 .. cardinality(key_cols) LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = key_cols[i] AND NOT attisdropped) THEN
                RAISE EXCEPTION 'outboxrelay: ordering_key column %.% does not exist', tbl, key_cols[i];
            END IF;
        END LOOP;
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (%s, %I) WHERE %I IN (%L, %L)',
            left(tbl, 40) || '_relay_ordering_idx', rel,
            (SELECT string_agg(format('%I', c), ', ' ORDER BY n) FROM unnest(key_cols) WITH ORDINALITY AS k (c, n)),
            id_col, st_col, pending, failed);
    END IF;

    -- The wake-up gate (see migrations/002_wakeup_gate.sql and
    -- 005_gate_lock.sql): a busy relay holds an advisory lock that silences
    -- NOTIFY; the trigger notifies when it can take the lock shared, or when
    -- the gate is missing. The sequence is for triggers of earlier versions.
    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I.%I MINVALUE 0 START 0', sch, tbl || '_wakeup');
    PERFORM setval(format('%I.%I', sch, tbl || '_wakeup'), 0, true); -- open
    EXECUTE format('COMMENT ON SEQUENCE %I.%I IS %L', sch, tbl || '_wakeup',
        'outboxrelay wake-up gate: the outbox trigger skips NOTIFY until this time (ms since the epoch); 0 means always notify.');
    EXECUTE format('GRANT SELECT ON SEQUENCE %I.%I TO PUBLIC', sch, tbl || '_wakeup');

    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION %I.outboxrelay_notify() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            IF TG_NARGS > 1 AND NOT pg_try_advisory_xact_lock_shared(1868722809, hashtext(TG_ARGV[0])) THEN
                RETURN NULL;
            END IF;
            PERFORM pg_notify(TG_ARGV[0], '');
            RETURN NULL;
        END
        $body$$fn$, sch);
    -- The trigger tries the gate lock in its WHEN clause, so a closed gate
    -- costs a producer that one failed try: no trigger event is queued and
    -- the function is not called (migrations/006_gate_when.sql). Replacing
    -- a trigger enables it; one the operator disabled, or enabled ALWAYS or
    -- REPLICA, is put back so.
    SELECT tgenabled INTO enabled FROM pg_trigger WHERE tgrelid = rel AND tgname = 'outboxrelay_notify';
    EXECUTE format('CREATE OR REPLACE TRIGGER outboxrelay_notify AFTER INSERT ON %s FOR EACH STATEMENT '
        'WHEN (pg_try_advisory_xact_lock_shared(1868722809, hashtext(%L))) EXECUTE FUNCTION %I.outboxrelay_notify(%L, %L)',
        rel, chan, sch, chan, format('%I.%I', sch, tbl || '_wakeup'));
    CASE enabled
        WHEN 'D' THEN EXECUTE format('ALTER TABLE %s DISABLE TRIGGER outboxrelay_notify', rel);
        WHEN 'A' THEN EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outboxrelay_notify', rel);
        WHEN 'R' THEN EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER outboxrelay_notify', rel);
        ELSE NULL;
    END CASE;
END
$install$;

COMMIT;
