-- outboxrelay least-privilege role: what the relay needs at run time, and
-- nothing more, once the schema exists (applied by `outboxrelay migrate` or
-- by sql/outboxrelay_install.sql, as an owner).
--
--   psql "$DATABASE_URL" -v role=outboxrelay -f sql/outboxrelay_role.sql
--   psql "$DATABASE_URL" -c "ALTER ROLE outboxrelay PASSWORD '…'"   -- or your own auth
--
-- Then run the relay as that role with --no-migrate. Idempotent.
--
-- The role may:
--   * read, update and delete rows of the outbox table (claim, mark, retry,
--     release, cleanup); it may not insert, and it owns nothing;
--   * read and set the wake-up gate sequence (TABLE_wakeup), and read the
--     sequence of relay_seq (the claims' frontier, the producers' insert
--     rate);
--   * use the schema, connect, LISTEN, NOTIFY (its heartbeat), take
--     advisory locks (the gate) and read pg_locks (the producers in flight
--     when the gate opens), which every role may.
-- It may not create, alter or drop anything: no DDL at run time.
--
-- Variables (-v name=value), with their defaults:
--   role      outboxrelay   created if missing, LOGIN without a password:
--                           give it one, or let pg_hba.conf admit it
--   schema    public
--   table     outbox        the outbox table (the drop-in's table name)

\set ON_ERROR_STOP on
\if :{?role} \else \set role outboxrelay \endif
\if :{?schema} \else \set schema public \endif
\if :{?table} \else \set table outbox \endif

BEGIN;

SELECT set_config('outboxrelay.role', :'role', true),
       set_config('outboxrelay.schema', :'schema', true),
       set_config('outboxrelay.table', :'table', true)
\gset outboxrelay_ignored_

DO $role$
DECLARE
    rol text := current_setting('outboxrelay.role');
    sch text := current_setting('outboxrelay.schema');
    tbl text := current_setting('outboxrelay.table');
    rel regclass;
    seq regclass;
BEGIN
    rel := to_regclass(format('%I.%I', sch, tbl));
    IF rel IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: table %.% does not exist: run the migrations or the install script first', sch, tbl;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = rol) THEN
        EXECUTE format('CREATE ROLE %I LOGIN', rol);
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), rol);
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', sch, rol);
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON %s TO %I', rel, rol);
    -- The sequence of relay_seq, read (never advanced): the frontier of
    -- the claims' floor, and the producers' insert rate, which steers the
    -- gate.
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attname = 'relay_seq' AND NOT attisdropped) THEN
        seq := pg_get_serial_sequence(rel::text, 'relay_seq')::regclass;
    END IF;
    IF seq IS NULL THEN
        RAISE EXCEPTION 'outboxrelay: %.% has no relay_seq drawn from a sequence: run the migrations or the install script first', sch, tbl;
    END IF;
    EXECUTE format('GRANT SELECT ON SEQUENCE %s TO %I', seq, rol);
    seq := to_regclass(format('%I.%I', sch, tbl || '_wakeup'));
    IF seq IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, UPDATE ON SEQUENCE %s TO %I', seq, rol);
    ELSE
        RAISE NOTICE 'outboxrelay: no gate sequence %.%: the relay will run without the gate', sch, tbl || '_wakeup';
    END IF;
END
$role$;

COMMIT;
