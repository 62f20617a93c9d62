-- SQLite statements. The clock is SQLite's own 'now' (stable within one statement),
-- in microseconds at millisecond resolution. Each runs inside BEGIN IMMEDIATE.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM fleetcron_schema;

-- name: lease_acquire
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
INSERT INTO fleetcron_lease AS l
    (namespace, name, holder, fence, acquired_us, expires_us, min_until_us)
SELECT :namespace, :name, :holder, t, t, t + :ttl_us, t + :least_us FROM now WHERE true
ON CONFLICT (namespace, name) DO UPDATE
   SET holder = excluded.holder,
       fence = max(l.fence + 1, excluded.fence),
       acquired_us = excluded.acquired_us,
       expires_us = excluded.expires_us,
       min_until_us = excluded.min_until_us
 WHERE l.expires_us <= excluded.acquired_us
RETURNING fence, acquired_us;

-- name: lease_extend
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_lease
   SET expires_us = max((SELECT t FROM now) + :ttl_us, min_until_us)
 WHERE namespace = :namespace AND name = :name AND holder = :holder AND fence = :fence
   AND expires_us > (SELECT t FROM now)
RETURNING name, holder, fence, acquired_us, expires_us, min_until_us,
          (SELECT t FROM now);

-- name: lease_release
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_lease
   SET expires_us = max((SELECT t FROM now), min_until_us)
 WHERE namespace = :namespace AND name = :name AND holder = :holder AND fence = :fence
   AND expires_us > (SELECT t FROM now)
RETURNING 1;

-- name: lease_get
SELECT name, holder, fence, acquired_us, expires_us, min_until_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
  FROM fleetcron_lease
 WHERE namespace = :namespace AND name = :name;

-- name: lease_list
SELECT name, holder, fence, acquired_us, expires_us, min_until_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
  FROM fleetcron_lease
 WHERE namespace = :namespace
 ORDER BY name;

-- name: lease_prune_preview
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
SELECT name FROM fleetcron_lease, now
 WHERE namespace = :namespace
   AND expires_us < t - :older_than_us AND min_until_us < t - :older_than_us AND fence < t;

-- name: lease_prune
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
DELETE FROM fleetcron_lease
 WHERE namespace = :namespace
   AND expires_us < (SELECT t FROM now) - :older_than_us
   AND min_until_us < (SELECT t FROM now) - :older_than_us
   AND fence < (SELECT t FROM now)
RETURNING name;

-- name: schema_init
CREATE TABLE IF NOT EXISTS fleetcron_schema (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- name: schema_record
INSERT INTO fleetcron_schema (version, name) VALUES (:version, :name);
