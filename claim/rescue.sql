-- Statements that free the rows of claims no relay will settle before
-- their lease expires (rescue.go). {{.X}} as in queries.sql; the template
-- functions stamped, holder and liveInstances (render.go) spell the tests
-- below.
--
-- A lease the relay stamped with its instance (a version 8 UUID: the
-- character at position 15 of its text is '8': stamped) names the instance
-- in its first 8 hex digits; ('x' || those digits)::bit(32)::bigint reads
-- them as the unsigned number pg_locks shows as the instance lock's objid
-- (holder). The live instances are those whose lock (class $N, the
-- instance id) a session of this database holds: pg_locks, readable by any
-- role, read once per statement (liveInstances). Every statement here re-tests what it selected in
-- its UPDATE's own WHERE, so a row that a claim took meanwhile (committed
-- after the statement's snapshot) is left to it.
--
-- A rescue does not give the attempt back and keeps the lease: it only
-- makes the lease expire now, as it would have at its time. A late mark
-- from the relay it belonged to is still right (a confirmed publish is a
-- delivered event), and that relay's renewal, if it lives after all, takes
-- the rows back until another claim has them.

-- name: rescue_held
-- $1 rows seen leased by other relays' instances (ids), $2 this relay's
-- own instances, $3 the instance lock's class. Those still leased, not
-- due, under an instance that is neither this relay's nor live, fall due
-- now; read through the primary key. Returns each with its instance.
UPDATE {{.Table}} AS o SET
    {{.AvailableAt}} = now()
FROM ({{liveInstances "$3"}}) AS live
WHERE o.{{.ID}} = ANY ($1::bigint[]) AND (o.{{.Status}} = {{.Pending}}) IS TRUE
  AND o.{{.AvailableAt}} > now() AND {{stamped "o"}}
  AND {{holder "o"}} <> ALL (live.ids || $2::bigint[])
RETURNING o.{{.ID}}, {{holder "o"}};

-- name: rescue_instances
-- $1 the floor, $2 the parked rows (floor.go), $3 instances found dead,
-- $4 the instance lock's class. Every row still leased under one of them
-- and not due, found among the pending rows above the floor (the pending
-- index from the floor on) and the parked ones (the primary key), falls
-- due now, unless the instance is live again (a new relay drew its id).
-- Returns their ids.
UPDATE {{.Table}} AS o SET
    {{.AvailableAt}} = now()
FROM ({{liveInstances "$4"}}) AS live
WHERE o.{{.ID}} = ANY (ARRAY (
    SELECT {{.ID}} FROM {{.Table}}
    WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $1 AND {{.AvailableAt}} > now()
      AND {{stamped ""}}
      AND {{holder ""}} = ANY ($3::bigint[])
    UNION ALL
    SELECT {{.ID}} FROM {{.Table}}
    WHERE {{.ID}} = ANY ($2::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE AND {{.AvailableAt}} > now()
      AND {{stamped ""}}
      AND {{holder ""}} = ANY ($3::bigint[])))
  AND (o.{{.Status}} = {{.Pending}}) IS TRUE AND o.{{.AvailableAt}} > now()
  AND {{stamped "o"}}
  AND {{holder "o"}} = ANY ($3::bigint[])
  AND {{holder "o"}} <> ALL (live.ids)
RETURNING o.{{.ID}};

-- name: release_leases
-- $1 the leases of claims whose outcome the relay does not know, $2 the
-- floor, $3 the parked rows. Their rows, found among the pending rows
-- above the floor and the parked ones (a claim takes no other), are given
-- back as release gives them back: due now, the attempt not counted.
-- There is no index on the lease column (a claim would no longer be a HOT
-- update): the pending index is read from the floor on, never from its
-- head. Returns their ids.
UPDATE {{.Table}} SET
    {{.AvailableAt}} = now(),
    {{.LeaseID}} = NULL,
    {{.Attempts}} = greatest({{.Attempts}} - 1, 0)
WHERE {{.ID}} = ANY (ARRAY (
    SELECT {{.ID}} FROM {{.Table}}
    WHERE {{.Status}} = {{.Pending}} AND {{.Seq}} > $2 AND {{.LeaseID}} = ANY ($1::uuid[])
    UNION ALL
    SELECT {{.ID}} FROM {{.Table}}
    WHERE {{.ID}} = ANY ($3::bigint[]) AND ({{.Status}} = {{.Pending}}) IS TRUE AND {{.LeaseID}} = ANY ($1::uuid[])))
  AND {{.LeaseID}} = ANY ($1::uuid[]) AND ({{.Status}} = {{.Pending}}) IS TRUE
RETURNING {{.ID}};

-- name: probe
-- Whether the database answers at all, after it failed a claim.
SELECT 1;
