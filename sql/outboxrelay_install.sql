-- outboxrelay drop-in: make an existing outbox table work with the relay.
--
--   psql "$DATABASE_URL" -v table=outbox_events -f sql/outboxrelay_install.sql
--
-- `outboxrelay migrate --table …` runs the same installation, and
-- `outboxrelay sql --table …` prints this script with the variables set.
--
-- It adds only what the table lacks, in one transaction, and running it
-- again changes nothing; over a table the relay's migrations built, it adds
-- nothing but what the variables change (another channel, say):
--   * the columns the relay needs that the table lacks (each commented
--     'added by outboxrelay', so the uninstall script can find them);
--   * relay_seq, the relay's insert order, drawn at every insert from a
--     sequence of its own (CACHE 1), whatever gives the table its ids;
--   * a unique index on the id column and partial indexes on what the
--     relay claims, what its cleanup deletes, the dead letters it counts and
--     the pending rows by event id (what the producer library's Cancel finds),
--     unless an index with the same definition exists under any name;
--   * the trigger function outboxrelay_notify() and a statement-level
--     AFTER INSERT trigger that sends NOTIFY on the channel (one
--     notification per inserting transaction, constant payload) while a
--     relay listens and none is busy; a trigger on the table that already
--     calls outboxrelay_notify() (the migrations' outbox_notify, say) is
--     updated in place, keeping its name and enabled state, instead;
--   * the gate sequence (TABLE_wakeup) that relays also set for the
--     triggers of earlier versions;
--   * autovacuum scale factors of a hundredth, unless the table has its
--     own (migrations/008_outbox_autovacuum.sql says why).
--
-- Variables (-v name=value), with their defaults:
--   table              (required) the table's name
--   schema             public
--   channel            outbox      must match the relay's --channel
--   gate_sequence      TABLE_wakeup, in the table's schema; optionally
--                                  schema-qualified; must match the relay's
--                                  --gate-sequence
--   id_column          relay_id    bigint identifying a row (any source of ids:
--                                  a sequence of any cache, ids taken before
--                                  the insert or chosen by the application);
--                                  added as an identity column when missing;
--                                  an existing column must be an integer type
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
\if :{?schema} \else \set schema '' \endif
\if :{?channel} \else \set channel '' \endif
\if :{?gate_sequence} \else \set gate_sequence '' \endif
\if :{?id_column} \else \set id_column '' \endif
\if :{?event_id_column} \else \set event_id_column '' \endif
\if :{?status_column} \else \set status_column '' \endif
\if :{?created_at_column} \else \set created_at_column '' \endif
\if :{?status_pending} \else \set status_pending '' \endif
\if :{?status_published} \else \set status_published '' \endif
\if :{?status_failed} \else \set status_failed '' \endif
\if :{?ordering} \else \set ordering '' \endif
\if :{?ordering_key} \else \set ordering_key '' \endif

BEGIN;

SELECT set_config('outboxrelay.table', :'table', true),
       set_config('outboxrelay.schema', :'schema', true),
       set_config('outboxrelay.channel', :'channel', true),
       set_config('outboxrelay.gate_sequence', :'gate_sequence', true),
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
    tbl       text := coalesce(current_setting('outboxrelay.table', true), '');
    sch       text := coalesce(nullif(current_setting('outboxrelay.schema', true), ''), 'public');
    chan      text := coalesce(nullif(current_setting('outboxrelay.channel', true), ''), 'outbox');
    gate_seq  text := coalesce(current_setting('outboxrelay.gate_sequence', true), '');
    id_col    text := coalesce(nullif(current_setting('outboxrelay.id_column', true), ''), 'relay_id');
    ev_col    text := coalesce(nullif(current_setting('outboxrelay.event_id_column', true), ''), 'event_id');
    st_col    text := coalesce(nullif(current_setting('outboxrelay.status_column', true), ''), 'status');
    ca_col    text := coalesce(nullif(current_setting('outboxrelay.created_at_column', true), ''), 'created_at');
    pending   text := coalesce(nullif(current_setting('outboxrelay.status_pending', true), ''), 'pending');
    published text := coalesce(nullif(current_setting('outboxrelay.status_published', true), ''), 'published');
    failed    text := coalesce(nullif(current_setting('outboxrelay.status_failed', true), ''), 'failed');
    ordering  text := coalesce(nullif(current_setting('outboxrelay.ordering', true), ''), 'none');
    key_cols  text[] := string_to_array(replace(coalesce(nullif(current_setting('outboxrelay.ordering_key', true), ''), 'aggregate_type,aggregate_id'), ' ', ''), ',');
    -- The trigger function. The migrations install the same text
    -- (migrations/007_notify_listening.sql): an unchanged body is left
    -- alone. TG_ARGV[0] is the channel; a second argument (the gate
    -- sequence) says the trigger is gated: it notifies only while a relay
    -- listens (holds the listen lock, 1868722811) and none is busy (holds
    -- the gate lock, 1868722809). The trigger's WHEN clause makes the same
    -- test first, so the function runs only when it will notify.
    body      constant text := $body$
BEGIN
    IF TG_NARGS > 1 AND (pg_try_advisory_xact_lock_shared(1868722811, hashtext(TG_ARGV[0]))
                         OR NOT pg_try_advisory_xact_lock_shared(1868722809, hashtext(TG_ARGV[0]))) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$body$;
    rel       regclass;
    seq       regclass;
    fn        regprocedure;
    col       record;
    idx       record;
    trg       record;
    keep      name;
    id_type   regtype;
    want      text;
    name      text;
    valid     boolean;
    matches   text[];
    ours      boolean;
    ddl       text[] := '{}';
    stmt      text;
    gate_when text;
    enabled   "char";
BEGIN
    IF tbl = '' THEN
        RAISE EXCEPTION 'outboxrelay: name the table: psql -v table=NAME -f outboxrelay_install.sql';
    END IF;
    -- One installation at a time: the relay's start-up and outboxrelay
    -- migrate take this lock (as a session lock) around their runs of this
    -- block and the concurrent index builds that follow.
    PERFORM pg_advisory_xact_lock(1868722809);
    rel := to_regclass(format('%I.%I', sch, tbl));
    IF rel IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: table %.% does not exist', sch, tbl;
    END IF;
    IF ordering NOT IN ('none', 'aggregate') THEN
        RAISE EXCEPTION 'outboxrelay: ordering %: want none or aggregate', ordering;
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
            ('payload_bytes', 'bytea'),
            ('content_type', 'text'),
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

    -- The relay's insert order, relay_seq: claims, their floor and ordered
    -- delivery follow it, so that ids may come from anywhere
    -- (migrations/011_relay_seq.sql says why). Added with a sequence of its
    -- own, CACHE 1, that its default draws from at every insert; the rows
    -- still to relay (pending and failed) are numbered in id order, the
    -- others keep NULL.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = 'relay_seq' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN relay_seq bigint', rel);
        EXECUTE format('COMMENT ON COLUMN %s.relay_seq IS %L', rel, 'added by outboxrelay');
        EXECUTE format('CREATE SEQUENCE %I.%I CACHE 1 OWNED BY %s.relay_seq', sch, left(tbl, 50) || '_relay_seq', rel);
        seq := to_regclass(format('%I.%I', sch, left(tbl, 50) || '_relay_seq'));
        EXECUTE format('UPDATE %s AS t SET relay_seq = o.n FROM (SELECT %I AS id, row_number() OVER (ORDER BY %I) AS n FROM %s WHERE %I IN (%L, %L)) AS o WHERE t.%I = o.id',
            rel, id_col, id_col, rel, st_col, pending, failed, id_col);
        EXECUTE format('SELECT setval(%L, max(relay_seq)) FROM %s HAVING max(relay_seq) IS NOT NULL', seq, rel);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN relay_seq SET DEFAULT nextval(%L::regclass)', rel, seq);
        RAISE NOTICE 'outboxrelay: added column relay_seq, drawn from sequence %', seq;
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
    END IF;

    -- Autovacuum by the hundredth part, as the migrations set it for their
    -- table (migrations/008_outbox_autovacuum.sql says why), unless the
    -- table has a vacuum scale factor of its own.
    IF NOT EXISTS (SELECT 1 FROM pg_class AS c, unnest(c.reloptions) AS o
                    WHERE c.oid = rel AND o LIKE 'autovacuum_vacuum_scale_factor=%') THEN
        EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02)', rel);
        RAISE NOTICE 'outboxrelay: autovacuum scale factors set';
    END IF;

    -- Definitions are compared as PostgreSQL prints them, so an index or a
    -- trigger built by the migrations or by an earlier run, under another
    -- name, counts. The wanted ones are first built on an empty copy of the
    -- table's columns, dropped at commit, and printed from there.
    EXECUTE format('CREATE TEMP TABLE outboxrelay_probe (LIKE %s) ON COMMIT DROP', rel);

    -- The indexes: on the id column (unique), and partial ones on
    -- what the relay claims, what cleanup deletes, the dead letters it
    -- counts and, in ordered mode, the rows that can hold an aggregate back
    -- (walked from aggregate to aggregate and along each one's events).
    FOR idx IN
        SELECT * FROM (VALUES
            ('_relay_id_idx',        true,  format('(%I)', id_col)),
            ('_relay_pending_idx',   false, format('(relay_seq) WHERE %I = %L', st_col, pending)),
            ('_relay_published_idx', false, format('(published_at) WHERE %I = %L', st_col, published)),
            ('_relay_failed_idx',    false, format('(%I) WHERE %I = %L', id_col, st_col, failed)),
            -- The pending rows by event id, for the producer library's
            -- Cancel.
            ('_relay_event_id_idx', false, format('(%I) WHERE %I = %L', ev_col, st_col, pending)),
            ('_relay_ordering_idx',  false, CASE WHEN ordering = 'aggregate' THEN format('(%s, relay_seq) WHERE %I IN (%L, %L)',
                (SELECT string_agg(format('%I', c), ', ' ORDER BY n) FROM unnest(key_cols) WITH ORDINALITY AS k (c, n)),
                st_col, pending, failed) END),
            -- The rows a publish failed, by aggregate: dead letters, and
            -- pending rows with an error (retried or requeued). Whether one
            -- holds an aggregate back is told without walking the
            -- aggregate's rows in the index above, where rows published
            -- while vacuum is held back leave their entries.
            ('_relay_failed_key_idx', false, CASE WHEN ordering = 'aggregate' THEN format('(%s, relay_seq) WHERE %I = %L OR (%I = %L AND last_error IS NOT NULL)',
                (SELECT string_agg(format('%I', c), ', ' ORDER BY n) FROM unnest(key_cols) WITH ORDINALITY AS k (c, n)),
                st_col, failed, st_col, pending) END)
        ) AS i (suffix, is_unique, definition)
        WHERE definition IS NOT NULL
    LOOP
        EXECUTE format('CREATE %s INDEX outboxrelay_probe%s ON pg_temp.outboxrelay_probe %s',
            CASE WHEN idx.is_unique THEN 'UNIQUE' ELSE '' END, idx.suffix, idx.definition);
        want := substring(pg_get_indexdef(format('pg_temp.outboxrelay_probe%s', idx.suffix)::regclass) FROM ' USING .*$');
        name := left(tbl, 40) || idx.suffix;
        -- The indexes with the wanted definition (a unique one serves where
        -- a plain one is wanted, not the other way round; a failed
        -- concurrent build, invalid, serves nothing), this script's own
        -- name first.
        SELECT array_agg(i.indexrelid::regclass::text ORDER BY c.relname <> name, c.relname), coalesce(bool_or(c.relname = name), false)
          INTO matches, ours
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE i.indrelid = rel AND i.indisvalid AND (i.indisunique OR NOT idx.is_unique)
           AND substring(pg_get_indexdef(i.indexrelid) FROM ' USING .*$') = want;
        IF cardinality(matches) > 1 AND ours THEN
            -- Ours duplicates another one (an earlier version of this
            -- script added it beside the migrations' own): every insert
            -- pays for both.
            ddl := ddl || format('DROP INDEX %s %s', '{concurrently}', matches[1]);
            RAISE NOTICE 'outboxrelay: dropping index %, which duplicated %', matches[1], matches[2];
        END IF;
        -- An index under this script's name that is not among them is one
        -- an earlier version built with another definition (on the id
        -- column, before relay_seq), or one whose concurrent build failed:
        -- dropped, and built again unless another one serves.
        SELECT i.indisvalid INTO valid FROM pg_index AS i WHERE i.indexrelid = to_regclass(format('%I.%I', sch, name));
        IF valid IS NOT NULL AND NOT ours THEN
            ddl := ddl || format('DROP INDEX %s IF EXISTS %I.%I', '{concurrently}', sch, name);
            RAISE NOTICE 'outboxrelay: dropping index %, whose definition is not the one the relay needs', name;
        END IF;
        CONTINUE WHEN matches IS NOT NULL;
        ddl := ddl || format('CREATE %s INDEX %s IF NOT EXISTS %I ON %s %s',
            CASE WHEN idx.is_unique THEN 'UNIQUE' ELSE '' END, '{concurrently}', name, rel, idx.definition);
        RAISE NOTICE 'outboxrelay: creating index %', name;
    END LOOP;
    -- The index statements run now, or, where the caller made the table
    -- pg_temp.outboxrelay_deferred_indexes, after this transaction and
    -- CONCURRENTLY, so that producers keep writing meanwhile (outboxrelay
    -- migrate, and the relay's start-up, do that).
    FOREACH stmt IN ARRAY ddl LOOP
        IF to_regclass('pg_temp.outboxrelay_deferred_indexes') IS NOT NULL THEN
            INSERT INTO pg_temp.outboxrelay_deferred_indexes (statement) VALUES (replace(stmt, '{concurrently}', 'CONCURRENTLY'));
        ELSE
            EXECUTE replace(stmt, '{concurrently}', '');
        END IF;
    END LOOP;

    -- The gate sequence, which relays set for the triggers of earlier
    -- versions; created open (0).
    -- Its name is taken as written, as the relay takes --gate-sequence:
    -- schema.name splits at the dot, and neither part is case-folded.
    gate_seq := CASE
        WHEN gate_seq = '' THEN format('%I.%I', sch, tbl || '_wakeup')
        WHEN cardinality(string_to_array(gate_seq, '.')) = 1 THEN format('%I.%I', sch, gate_seq)
        WHEN cardinality(string_to_array(gate_seq, '.')) = 2 THEN format('%I.%I', split_part(gate_seq, '.', 1), split_part(gate_seq, '.', 2))
    END;
    IF gate_seq IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: gate_sequence %: want name or schema.name', current_setting('outboxrelay.gate_sequence');
    END IF;
    seq := to_regclass(gate_seq);
    IF seq IS NULL THEN
        EXECUTE format('CREATE SEQUENCE %s MINVALUE 0 START 0', gate_seq);
        seq := to_regclass(gate_seq);
        PERFORM setval(seq, 0, true);
        EXECUTE format('COMMENT ON SEQUENCE %s IS %L', seq,
            'outboxrelay wake-up gate: the outbox trigger skips NOTIFY until this time (ms since the epoch); 0 means always notify.');
        -- Every producer's trigger of an earlier version reads it.
        EXECUTE format('GRANT SELECT ON SEQUENCE %s TO PUBLIC', seq);
        RAISE NOTICE 'outboxrelay: created gate sequence %', seq;
    END IF;
    -- Named with its schema, so producers whose search_path differs find it.
    gate_seq := format('%I.%I', (SELECT nspname FROM pg_namespace AS n JOIN pg_class AS c ON c.relnamespace = n.oid WHERE c.oid = seq),
        (SELECT relname FROM pg_class WHERE oid = seq));

    fn := to_regprocedure(format('%I.outboxrelay_notify()', sch));
    IF fn IS NULL OR (SELECT prosrc FROM pg_proc WHERE oid = fn) IS DISTINCT FROM body THEN
        EXECUTE format('CREATE OR REPLACE FUNCTION %I.outboxrelay_notify() RETURNS trigger LANGUAGE plpgsql AS %L', sch, body);
        fn := to_regprocedure(format('%I.outboxrelay_notify()', sch));
    END IF;

    -- The trigger tries the listen lock, then the gate lock, in its WHEN
    -- clause: while no relay listens, or one is busy, a producer pays that
    -- and no trigger event is queued nor the function called
    -- (migrations/006_gate_when.sql and 007_notify_listening.sql).
    gate_when := format('NOT pg_try_advisory_xact_lock_shared(1868722811, hashtext(%L)) AND pg_try_advisory_xact_lock_shared(1868722809, hashtext(%L))',
        chan, chan);
    EXECUTE format('CREATE TRIGGER outboxrelay_probe AFTER INSERT ON pg_temp.outboxrelay_probe FOR EACH STATEMENT '
        'WHEN (%s) EXECUTE FUNCTION %s(%L, %L)', gate_when, fn::regproc, chan, gate_seq);
    SELECT substring(pg_get_triggerdef(oid) FROM ' FOR EACH .*$') INTO want
      FROM pg_trigger WHERE tgrelid = 'pg_temp.outboxrelay_probe'::regclass;

    -- One trigger on the table calls the function: the migrations'
    -- outbox_notify if there is one, else this script's outboxrelay_notify,
    -- else whichever comes first by name. It is replaced only where its
    -- definition differs, keeping its name and enabled state (replacing a
    -- trigger enables it); any other trigger calling the function is a
    -- duplicate that would notify twice, and is dropped.
    SELECT t.tgname INTO keep FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
     WHERE t.tgrelid = rel AND NOT t.tgisinternal AND p.proname = 'outboxrelay_notify'
     ORDER BY t.tgname <> 'outbox_notify', t.tgname <> 'outboxrelay_notify', t.tgname LIMIT 1;
    FOR trg IN
        SELECT t.tgname, t.tgenabled, t.tgfoid, substring(pg_get_triggerdef(t.oid) FROM ' FOR EACH .*$') AS def
          FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
         WHERE t.tgrelid = rel AND NOT t.tgisinternal AND p.proname = 'outboxrelay_notify' AND t.tgname <> keep
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trg.tgname, rel);
        RAISE NOTICE 'outboxrelay: dropped trigger %, which duplicated %', trg.tgname, keep;
    END LOOP;
    keep := coalesce(keep, 'outboxrelay_notify');
    SELECT t.tgenabled INTO enabled FROM pg_trigger AS t WHERE t.tgrelid = rel AND t.tgname = keep;
    IF NOT FOUND OR (SELECT substring(pg_get_triggerdef(t.oid) FROM ' FOR EACH .*$') IS DISTINCT FROM want
                       FROM pg_trigger AS t WHERE t.tgrelid = rel AND t.tgname = keep) THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON %s FOR EACH STATEMENT WHEN (%s) EXECUTE FUNCTION %s(%L, %L)',
            keep, rel, gate_when, fn::regproc, chan, gate_seq);
        CASE enabled
            WHEN 'D' THEN EXECUTE format('ALTER TABLE %s DISABLE TRIGGER %I', rel, keep);
            WHEN 'A' THEN EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', rel, keep);
            WHEN 'R' THEN EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER %I', rel, keep);
            ELSE NULL;
        END CASE;
        RAISE NOTICE 'outboxrelay: trigger % notifies channel %', keep, chan;
    END IF;
END
$install$;

COMMIT;
