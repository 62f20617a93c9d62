-- MySQL 8 / MariaDB 10.6+ statements. The clock is UTC_TIMESTAMP(6), the server's.
-- A block may hold several statements; they are sent together (one round trip) and the
-- last result set is the block's result. Connections use CLIENT_FOUND_ROWS, so an UPDATE
-- reports the rows it matched, not only those it changed.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM fleetcron_schema;

-- name: lease_acquire
-- The conditional UPDATE decides (a concurrent acquirer blocks on the row lock and re-reads
-- the committed row, so exactly one wins); the SELECT returns the row whoever holds it, and
-- the operation compares the holder. UTC_TIMESTAMP(6) is constant within a statement.
UPDATE fleetcron_lease
   SET holder = %(holder)s,
       fence = GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))),
       acquired_at = UTC_TIMESTAMP(6),
       expires_at = TIMESTAMPADD(MICROSECOND, %(ttl_us)s, UTC_TIMESTAMP(6)),
       min_until = TIMESTAMPADD(MICROSECOND, %(least_us)s, UTC_TIMESTAMP(6))
 WHERE namespace = %(namespace)s AND name = %(name)s AND expires_at <= UTC_TIMESTAMP(6);
SELECT fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at)
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_create
-- First use of a name: make the row exist, expired, so the next acquire can take it. Never
-- INSERT IGNORE, which would turn truncation into a warning.
INSERT INTO fleetcron_lease (namespace, name, holder, fence, acquired_at, expires_at, min_until)
VALUES (%(namespace)s, %(name)s, '', 0, '1970-01-01', '1970-01-01', '1970-01-01')
ON DUPLICATE KEY UPDATE fence = fence;

-- name: lease_extend
-- FOUND_ROWS makes the UPDATE's count the rows it matched: 0 means not ours any more.
UPDATE fleetcron_lease
   SET expires_at = GREATEST(TIMESTAMPADD(MICROSECOND, %(ttl_us)s, UTC_TIMESTAMP(6)), min_until)
 WHERE namespace = %(namespace)s AND name = %(name)s
   AND holder = %(holder)s AND fence = %(fence)s AND expires_at > UTC_TIMESTAMP(6);
SELECT name, holder, fence,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until),
       -- the UPDATE's clock: expires = now + ttl (min_until is never later, as least <= most)
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) - %(ttl_us)s
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s
   AND holder = %(holder)s AND fence = %(fence)s;

-- name: lease_release
UPDATE fleetcron_lease
   SET expires_at = GREATEST(UTC_TIMESTAMP(6), min_until)
 WHERE namespace = %(namespace)s AND name = %(name)s
   AND holder = %(holder)s AND fence = %(fence)s AND expires_at > UTC_TIMESTAMP(6);

-- name: lease_get
SELECT name, holder, fence,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_list
SELECT name, holder, fence,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s
 ORDER BY name;

-- name: lease_prune_preview
SELECT name FROM fleetcron_lease
 WHERE namespace = %(namespace)s
   AND expires_at < TIMESTAMPADD(MICROSECOND, -%(older_than_us)s, UTC_TIMESTAMP(6))
   AND min_until < TIMESTAMPADD(MICROSECOND, -%(older_than_us)s, UTC_TIMESTAMP(6))
   AND fence < TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));

-- name: lease_prune
-- Select then delete in one transaction, so the names returned are the rows deleted.
START TRANSACTION;
CREATE TEMPORARY TABLE IF NOT EXISTS fc_pruned (name VARBINARY(800) NOT NULL);
DELETE FROM fc_pruned;
INSERT INTO fc_pruned
SELECT name FROM fleetcron_lease
 WHERE namespace = %(namespace)s
   AND expires_at < TIMESTAMPADD(MICROSECOND, -%(older_than_us)s, UTC_TIMESTAMP(6))
   AND min_until < TIMESTAMPADD(MICROSECOND, -%(older_than_us)s, UTC_TIMESTAMP(6))
   AND fence < TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
   FOR UPDATE;
DELETE l FROM fleetcron_lease AS l JOIN fc_pruned AS p ON l.name = p.name
 WHERE l.namespace = %(namespace)s;
COMMIT;
SELECT name FROM fc_pruned;

-- name: schema_init
CREATE TABLE IF NOT EXISTS fleetcron_schema (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(200) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;

-- name: schema_record
INSERT INTO fleetcron_schema (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_lock
-- DDL commits implicitly in MySQL, so concurrent first starts serialise on a named lock.
SELECT GET_LOCK('fleetcron.migrate', 60);

-- name: migration_unlock
SELECT RELEASE_LOCK('fleetcron.migrate');
