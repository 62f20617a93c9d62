-- PostgreSQL statements. Every time is clock_timestamp() (the server's clock at the
-- moment of evaluation), never now() (start of the transaction) nor a client value.
-- Times are returned as microseconds since the epoch.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM fleetcron_schema;

-- name: lease_acquire
-- One statement, one round trip: insert the row, or take it over when it has expired at
-- the server's clock. Under READ COMMITTED a concurrent acquirer waits for the row lock and
-- re-evaluates the WHERE on the winner's row, so exactly one wins. The fence folds in the
-- clock so it keeps increasing even after the row was pruned.
WITH now AS (SELECT clock_timestamp() AS t)
INSERT INTO fleetcron_lease AS l
    (namespace, name, holder, fence, acquired_at, expires_at, min_until)
SELECT %(namespace)s, %(name)s, %(holder)s,
       (extract(epoch FROM now.t) * 1000000)::bigint,
       now.t,
       now.t + %(ttl_us)s * interval '1 microsecond',
       now.t + %(least_us)s * interval '1 microsecond'
FROM now
ON CONFLICT (namespace, name) DO UPDATE
   SET holder = excluded.holder,
       fence = greatest(l.fence + 1, excluded.fence),
       acquired_at = excluded.acquired_at,
       expires_at = excluded.expires_at,
       min_until = excluded.min_until
 WHERE l.expires_at <= excluded.acquired_at
RETURNING fence, (extract(epoch FROM acquired_at) * 1000000)::bigint;

-- name: lease_extend
WITH now AS (SELECT clock_timestamp() AS t)
UPDATE fleetcron_lease AS l
   SET expires_at = greatest(now.t + %(ttl_us)s * interval '1 microsecond', l.min_until)
  FROM now
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.holder = %(holder)s AND l.fence = %(fence)s
   AND l.expires_at > now.t
RETURNING l.name, l.holder, l.fence,
          (extract(epoch FROM l.acquired_at) * 1000000)::bigint,
          (extract(epoch FROM l.expires_at) * 1000000)::bigint,
          (extract(epoch FROM l.min_until) * 1000000)::bigint,
          (extract(epoch FROM now.t) * 1000000)::bigint;

-- name: lease_release
-- Never DELETE: the row keeps the fence. lock_at_least keeps it held until min_until.
WITH now AS (SELECT clock_timestamp() AS t)
UPDATE fleetcron_lease AS l
   SET expires_at = greatest(now.t, l.min_until)
  FROM now
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.holder = %(holder)s AND l.fence = %(fence)s
   AND l.expires_at > now.t;

-- name: lease_get
SELECT name, holder, fence,
       (extract(epoch FROM acquired_at) * 1000000)::bigint,
       (extract(epoch FROM expires_at) * 1000000)::bigint,
       (extract(epoch FROM min_until) * 1000000)::bigint,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_list
-- COLLATE "C": code-point order, as on every other backend, whatever the database locale.
SELECT name, holder, fence,
       (extract(epoch FROM acquired_at) * 1000000)::bigint,
       (extract(epoch FROM expires_at) * 1000000)::bigint,
       (extract(epoch FROM min_until) * 1000000)::bigint,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s
 ORDER BY name COLLATE "C";

-- name: lease_prune_preview
WITH now AS (SELECT clock_timestamp() AS t)
SELECT l.name FROM fleetcron_lease AS l, now
 WHERE l.namespace = %(namespace)s
   AND l.expires_at < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.min_until < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.fence < (extract(epoch FROM now.t) * 1000000)::bigint;

-- name: lease_prune
-- The fence condition keeps a re-created row's fence (the clock) above the deleted one.
WITH now AS (SELECT clock_timestamp() AS t)
DELETE FROM fleetcron_lease AS l USING now
 WHERE l.namespace = %(namespace)s
   AND l.expires_at < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.min_until < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.fence < (extract(epoch FROM now.t) * 1000000)::bigint
RETURNING l.name;

-- name: schema_init
CREATE TABLE IF NOT EXISTS fleetcron_schema (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: schema_record
INSERT INTO fleetcron_schema (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_lock
-- Serialises concurrent first starts; released at COMMIT.
SELECT pg_advisory_xact_lock(7310585240963158077);
