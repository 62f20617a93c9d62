-- MySQL 8 / MariaDB 10.6+ statements. The clock is UTC_TIMESTAMP(6), the server's.
-- A block may hold several statements; they are sent together (one round trip) and the
-- last result set is the block's result. Connections use CLIENT_FOUND_ROWS, so an UPDATE
-- reports the rows it matched, not only those it changed. Rows are read by column name,
-- not position (fleetcron.stores.rows): a column computed for a record has the record's
-- name for it (AS now_us).

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
SELECT fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at) AS now_us
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_create
-- First use of a name: make the row exist, expired, so the next acquire can take it. Never
-- INSERT IGNORE, which would turn truncation into a warning.
INSERT INTO fleetcron_lease (namespace, name, holder, fence, acquired_at, expires_at, min_until)
VALUES (%(namespace)s, %(name)s, '', 0, '1970-01-01', '1970-01-01', '1970-01-01')
ON DUPLICATE KEY UPDATE fence = fence;

-- name: lease_extend
-- FOUND_ROWS makes the UPDATE's count the rows it matched: 0 means not ours any more. The
-- clock is read once, so the answer's now_us is the UPDATE's even when min_until decides.
SET @fc_t = CAST(UTC_TIMESTAMP(6) AS DATETIME(6));
UPDATE fleetcron_lease
   SET expires_at = GREATEST(TIMESTAMPADD(MICROSECOND, %(ttl_us)s, CAST(@fc_t AS DATETIME(6))),
                             min_until)
 WHERE namespace = %(namespace)s AND name = %(name)s
   AND holder = %(holder)s AND fence = %(fence)s AND expires_at > CAST(@fc_t AS DATETIME(6));
SELECT name, holder, fence,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at) AS acquired_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) AS expires_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until) AS min_until_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', CAST(@fc_t AS DATETIME(6))) AS now_us
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
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at) AS acquired_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) AS expires_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until) AS min_until_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_list
SELECT name, holder, fence,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at) AS acquired_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) AS expires_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', min_until) AS min_until_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
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

-- ---------------------------------------------------------------------------------------
-- The run ledger (docs/design/ledger.md). Each operation that must be atomic is one
-- multi-statement transaction sent in one round trip. Lock order, so blocks never
-- deadlock one another: job row -> job lease row -> run row (every insert of a run row
-- holds its job row, so an absent run row cannot appear under a claim's feet). The clock
-- is read once into @fc_t / @fc_now. SELECT … INTO leaves a variable unchanged when no row
-- matches, so every variable is reset first. Exactly one statement of a block returns a
-- result set. Run rows are (job, slot_us, state, attempt, fence, holder, run_id, trigger,
-- started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error,
-- output, now_us); job rows (job, paused, definition, fingerprint, high_water_us,
-- last_success_us, last_failure_us, updated_us, now_us).

-- name: store_now
SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));

-- name: run_claim
-- One slot (a batch sends one block per slot, one round trip); the rules of
-- fleetcron.stores.ledger.decide_claim. @fc_batch_t: the batch's clock, set by the runner
-- before the first block (every claim of a batch happens at one store time).
START TRANSACTION;
SET @fc_t = COALESCE(@fc_batch_t, UTC_TIMESTAMP(6));
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', @fc_t);
SET @fc_paused = NULL, @fc_stored = NULL, @fc_pre = NULL, @fc_lfence = NULL,
    @fc_lheld = NULL, @fc_state = NULL, @fc_attempt = NULL, @fc_rexp = NULL,
    @fc_retry = NULL;
-- 1. A slot the store's clock has not reached: nothing is read, locked or written.
SET @fc_go = IF(%(slot_us)s <= @fc_now, 1, 0);
-- The job row, made if missing, is locked first: a claim made for another definition than
-- the registered one is refused and writes nothing else (conflict), then 2. a paused
-- job's schedule.
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
SELECT %(namespace)s, %(job)s, FALSE, '{}', '', @fc_now FROM DUAL WHERE @fc_go = 1
ON DUPLICATE KEY UPDATE updated_us = updated_us;
SELECT paused, fingerprint INTO @fc_paused, @fc_stored FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s AND @fc_go = 1
   FOR UPDATE;
SET @fc_conflict = IF(@fc_go = 1 AND %(fingerprint)s IS NOT NULL
                      AND @fc_stored <> '' AND @fc_stored <> %(fingerprint)s, 1, 0);
SET @fc_go = IF(@fc_go = 1 AND @fc_conflict = 0
                AND NOT (COALESCE(@fc_paused, 0) = 1 AND %(pausable)s = 1), 1, 0);
-- A final row other than failed never changes again: refuse before touching the lease.
SELECT state INTO @fc_pre FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s AND @fc_go = 1;
SET @fc_go = IF(@fc_go = 1 AND COALESCE(@fc_pre IN ('running', 'failed', 'queued'), 1), 1, 0);
-- The job lease row (made expired if missing), then the run row, locked.
INSERT INTO fleetcron_lease (namespace, name, holder, fence, acquired_at, expires_at, min_until)
SELECT %(namespace)s, %(lease_name)s, '', 0, '1970-01-01', '1970-01-01', '1970-01-01'
  FROM DUAL WHERE @fc_go = 1
ON DUPLICATE KEY UPDATE fence = fence;
SELECT fence, IF(expires_at > CAST(@fc_t AS DATETIME(6)), 1, 0) INTO @fc_lfence, @fc_lheld
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(lease_name)s AND @fc_go = 1
   FOR UPDATE;
SELECT state, attempt, expires_us, retry_at_us
  INTO @fc_state, @fc_attempt, @fc_rexp, @fc_retry
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s AND @fc_go = 1
   FOR UPDATE;
-- 3. Absent or queued: attempt 1; running and expired: attempt + 1, or lost when none remain;
-- failed and due for a retry: attempt + 1; anything else: not claimed.
SET @fc_expired = IF(@fc_state = 'running' AND @fc_rexp <= @fc_now, 1, 0);
SET @fc_lost = IF(@fc_go = 1 AND @fc_expired = 1 AND @fc_attempt >= %(max_attempts)s, 1, 0);
-- 4. No row and past the claim's deadline: recorded as missed, not run.
SET @fc_miss = IF(@fc_go = 1 AND @fc_state IS NULL AND %(deadline_us)s IS NOT NULL
                  AND @fc_now > %(deadline_us)s, 1, 0);
SET @fc_can = IF(
    @fc_go = 1 AND @fc_lost = 0 AND @fc_miss = 0
    AND (@fc_state IS NULL OR @fc_state = 'queued' OR @fc_expired = 1
         OR (@fc_state = 'failed' AND @fc_retry <= @fc_now
             AND @fc_attempt < %(max_attempts)s)),
    1, 0);
-- 5. An exclusive claim needs the job lease free.
SET @fc_ok = IF(@fc_can = 1 AND NOT (%(exclusive)s AND @fc_lheld = 1), 1, 0);
-- The answer (fleetcron.models.CLAIM_STATUSES): the first rule that refused, or claimed.
SET @fc_why = CASE
    WHEN %(slot_us)s > @fc_now THEN 'not_due'
    WHEN @fc_conflict = 1 THEN 'conflict'
    WHEN COALESCE(@fc_paused, 0) = 1 AND %(pausable)s = 1 THEN 'paused'
    WHEN @fc_miss = 1 THEN 'missed'
    WHEN @fc_ok = 1 THEN 'claimed'
    WHEN @fc_can = 1 THEN 'busy'
    ELSE 'taken' END;
-- (assignments run left to right: the note names the attempt that was lost)
SET @fc_note = IF(@fc_expired = 1,
                  CONCAT('attempt ', @fc_attempt, ' lost: ', %(lost_error)s), NULL),
    @fc_attempt = IF(@fc_state IS NULL OR @fc_state = 'queued', 1, @fc_attempt + 1),
    @fc_fence = GREATEST(COALESCE(@fc_lfence, 0) + 1, @fc_now);
UPDATE fleetcron_run
   SET state = 'lost', finished_us = @fc_now, expires_us = NULL, error = %(lost_error)s
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   AND @fc_lost = 1;
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, `trigger`,
     started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
     error, output)
SELECT %(namespace)s, %(job)s, %(slot_us)s, 'missed', 0, 0, '', '', %(trigger)s, NULL,
       @fc_now, NULL, NULL, FALSE, NULL, %(missed_error)s, NULL
  FROM DUAL WHERE @fc_miss = 1;
-- 6. The run row becomes the new attempt.
UPDATE fleetcron_run
   SET state = 'running', attempt = @fc_attempt, fence = @fc_fence, holder = %(holder)s,
       run_id = %(run_id)s, `trigger` = %(trigger)s, started_us = @fc_now,
       finished_us = NULL, expires_us = @fc_now + %(ttl_us)s, retry_at_us = NULL,
       cancel_requested = FALSE, exit_code = NULL, error = @fc_note, output = NULL
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   AND @fc_ok = 1 AND @fc_state IS NOT NULL;
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, `trigger`,
     started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
     error, output)
SELECT %(namespace)s, %(job)s, %(slot_us)s, 'running', @fc_attempt, @fc_fence, %(holder)s,
       %(run_id)s, %(trigger)s, @fc_now, NULL, @fc_now + %(ttl_us)s, NULL, FALSE, NULL,
       @fc_note, NULL
  FROM DUAL WHERE @fc_ok = 1 AND @fc_state IS NULL;
-- 5. Exclusive claims take the job lease; the others only move its fence.
UPDATE fleetcron_lease
   SET holder = IF(%(exclusive)s, %(holder)s, holder),
       fence = @fc_fence,
       acquired_at = IF(%(exclusive)s, CAST(@fc_t AS DATETIME(6)), acquired_at),
       expires_at = IF(%(exclusive)s,
                       TIMESTAMPADD(MICROSECOND, %(ttl_us)s, CAST(@fc_t AS DATETIME(6))),
                       expires_at),
       min_until = IF(%(exclusive)s,
                      TIMESTAMPADD(MICROSECOND, %(least_us)s, CAST(@fc_t AS DATETIME(6))),
                      min_until)
 WHERE namespace = %(namespace)s AND name = %(lease_name)s AND @fc_ok = 1;
-- 7. The job's high-water mark (schedule progress only: not manual or backfill runs).
UPDATE fleetcron_job
   SET high_water_us = GREATEST(COALESCE(high_water_us, %(slot_us)s), %(slot_us)s)
 WHERE namespace = %(namespace)s AND job = %(job)s AND (@fc_ok = 1 OR @fc_miss = 1)
   AND %(progress)s = 1;
-- Exactly one row: the answer, then the claimed run's columns (NULL when not claimed),
-- then the registered fingerprint of a conflict.
SELECT @fc_why AS status, r.job, r.slot_us, r.state, r.attempt, r.fence, r.holder,
       r.run_id, r.`trigger`, r.started_us, r.finished_us, r.expires_us, r.retry_at_us,
       r.cancel_requested, r.exit_code, r.error, r.output, @fc_now AS now_us,
       IF(@fc_conflict = 1, @fc_stored, NULL) AS stored_fingerprint
  FROM (SELECT 1 AS one) AS answer
  LEFT JOIN fleetcron_run AS r
    ON r.namespace = %(namespace)s AND r.job = %(job)s AND r.slot_us = %(slot_us)s
   AND @fc_ok = 1;
COMMIT;

-- name: run_extend
START TRANSACTION;
SET @fc_t = UTC_TIMESTAMP(6);
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', @fc_t), @fc_lfence = NULL;
SELECT fence INTO @fc_lfence FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(lease_name)s
   FOR UPDATE;
UPDATE fleetcron_run SET expires_us = @fc_now + %(ttl_us)s
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   AND state = 'running' AND fence = %(fence)s AND expires_us > @fc_now;
SET @fc_ok = ROW_COUNT();
UPDATE fleetcron_lease
   SET expires_at = GREATEST(TIMESTAMPADD(MICROSECOND, %(ttl_us)s, CAST(@fc_t AS DATETIME(6))),
                             min_until)
 WHERE namespace = %(namespace)s AND name = %(lease_name)s
   AND fence = %(fence)s AND expires_at > CAST(@fc_t AS DATETIME(6)) AND @fc_ok > 0;
SELECT job, slot_us, state, attempt, fence, holder, run_id, `trigger`, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       @fc_now AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   AND @fc_ok > 0;
COMMIT;

-- name: run_finish
START TRANSACTION;
SET @fc_t = UTC_TIMESTAMP(6);
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', @fc_t),
    @fc_paused = NULL, @fc_lfence = NULL;
SELECT paused INTO @fc_paused FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s
   FOR UPDATE;
SELECT fence INTO @fc_lfence FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(lease_name)s
   FOR UPDATE;
UPDATE fleetcron_run
   SET state = %(state)s, finished_us = @fc_now, expires_us = NULL,
       retry_at_us = IF(%(state)s = 'failed', @fc_now + %(retry_after_us)s, NULL),
       exit_code = %(exit_code)s, error = %(error)s, output = %(output)s
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   AND state = 'running' AND fence = %(fence)s AND expires_us > @fc_now;
SET @fc_ok = ROW_COUNT();
UPDATE fleetcron_lease
   SET expires_at = GREATEST(CAST(@fc_t AS DATETIME(6)), min_until)
 WHERE namespace = %(namespace)s AND name = %(lease_name)s AND fence = %(fence)s
   AND @fc_ok > 0;
INSERT INTO fleetcron_job
    (namespace, job, paused, definition, fingerprint, last_success_us, last_failure_us,
     updated_us)
SELECT %(namespace)s, %(job)s, FALSE, '{}', '',
       IF(%(state)s = 'succeeded', @fc_now, NULL),
       IF(%(state)s IN ('failed', 'lost'), @fc_now, NULL), @fc_now
  FROM DUAL WHERE @fc_ok > 0
ON DUPLICATE KEY UPDATE
   last_success_us = IF(%(state)s = 'succeeded', @fc_now, last_success_us),
   last_failure_us = IF(%(state)s IN ('failed', 'lost'), @fc_now, last_failure_us);
COMMIT;
SELECT @fc_ok > 0;

-- name: run_record
-- Insert a final row where the slot has none (never overwrites); move the high-water mark.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)), @fc_have = 0;
-- never a row for a slot the store's clock has not reached: treat it as taken
SET @fc_have = IF(%(slot_us)s > @fc_now, 1, 0);
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
VALUES (%(namespace)s, %(job)s, FALSE, '{}', '', @fc_now)
ON DUPLICATE KEY UPDATE updated_us = updated_us;
SELECT 1 INTO @fc_have FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s
   FOR UPDATE;
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, `trigger`,
     started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
     error, output)
SELECT %(namespace)s, %(job)s, %(slot_us)s, %(state)s, 0, 0, '', '', %(trigger)s,
       NULL, @fc_now, NULL, NULL, FALSE, NULL, %(error)s, NULL
  FROM DUAL WHERE @fc_have = 0;
UPDATE fleetcron_job
   SET high_water_us = GREATEST(COALESCE(high_water_us, %(slot_us)s), %(slot_us)s)
 WHERE namespace = %(namespace)s AND job = %(job)s AND @fc_have = 0
   AND %(state)s <> 'queued';
COMMIT;
SELECT @fc_have = 0;

-- name: run_backfill
-- Queue a backfill run of each slot of the JSON array (distinct, oldest first) that has
-- no row and that the clock has reached; never overwrites. One transaction: every row is
-- written or none. The job row is locked first, as in every ledger block; since every
-- insert of a run row holds it, no row of the job appears between the check and the
-- insert, and the insert's count is the rows queued (CLIENT_FOUND_ROWS changes what an
-- update counts, not an insert).
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
VALUES (%(namespace)s, %(job)s, FALSE, '{}', '', @fc_now)
ON DUPLICATE KEY UPDATE updated_us = updated_us;
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, `trigger`,
     started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
     error, output)
SELECT %(namespace)s, %(job)s, k.slot_us, 'queued', 0, 0, '', '', 'backfill',
       NULL, @fc_now, NULL, NULL, FALSE, NULL, NULL, NULL
  FROM JSON_TABLE(%(slots)s, '$[*]' COLUMNS (slot_us BIGINT PATH '$')) AS k
 WHERE k.slot_us <= @fc_now  -- never a row for a slot the clock has not reached
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run AS r
                    WHERE r.namespace = %(namespace)s AND r.job = %(job)s
                      AND r.slot_us = k.slot_us)
 ORDER BY k.slot_us;
SET @fc_queued = ROW_COUNT();
COMMIT;
SELECT @fc_queued;

-- name: run_cancel
-- The job's running attempts whose lease has not expired (of slot_us only, unless NULL);
-- note, unless NULL, becomes their error. CLIENT_FOUND_ROWS: the count is the rows
-- matched, so an attempt asked before counts again.
UPDATE fleetcron_run SET cancel_requested = TRUE, error = COALESCE(%(note)s, error)
 WHERE namespace = %(namespace)s AND job = %(job)s AND state = 'running'
   AND (%(slot_us)s IS NULL OR slot_us = %(slot_us)s)
   AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));

-- name: run_settled
-- Which [job, slot_us] pairs of the JSON array have a row other than queued.
SELECT r.job, r.slot_us
  FROM JSON_TABLE(%(pairs)s, '$[*]' COLUMNS (
           job VARCHAR(800) CHARACTER SET utf8mb4 PATH '$[0]',
           slot_us BIGINT PATH '$[1]')) AS k
  JOIN fleetcron_run AS r
    ON r.namespace = %(namespace)s AND r.job = CAST(k.job AS BINARY)
   AND r.slot_us = k.slot_us
 WHERE r.state <> 'queued';

-- name: run_get
SELECT job, slot_us, state, attempt, fence, holder, run_id, `trigger`, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s;

-- name: run_list
SELECT job, slot_us, state, attempt, fence, holder, run_id, `trigger`, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s
 ORDER BY slot_us DESC, job
 LIMIT %(limit)s;

-- name: run_list_job
-- Without `output` the rows come without it (run_list_many: a status read's many rows).
SELECT job, slot_us, state, attempt, fence, holder, run_id, `trigger`, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error,
       CASE WHEN %(output)s THEN output END AS output,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s
 ORDER BY slot_us DESC
 LIMIT %(limit)s;

-- name: run_running
-- The namespace's running rows that are among the newest `limit` rows of their job (skip =
-- limit - 1: the row at that place, when the job has one, is the oldest of them), through
-- the index by state: a paged status read finds the runs in progress without reading the
-- rest of the ledger. The caller keeps the jobs it asked for.
SELECT r.job, r.slot_us, r.state, r.attempt, r.fence, r.holder, r.run_id, r.`trigger`,
       r.started_us, r.finished_us, r.expires_us, r.retry_at_us, r.cancel_requested,
       r.exit_code, r.error, r.output,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_run AS r FORCE INDEX (fleetcron_run_open)
 WHERE r.namespace = %(namespace)s AND r.state = 'running'
   AND r.slot_us >= coalesce(
         (SELECT n.slot_us FROM fleetcron_run AS n
           WHERE n.namespace = r.namespace AND n.job = r.job
           ORDER BY n.slot_us DESC
           LIMIT %(skip)s, 1),
         r.slot_us)
 ORDER BY r.job, r.slot_us DESC;

-- name: run_prune
-- Final rows beyond the newest `keep` of their job, or finished longer ago than the age;
-- the DELETE re-checks the state, so a row claimed again meanwhile is kept.
DELETE r FROM fleetcron_run AS r
  JOIN (SELECT ranked.job, ranked.slot_us
          FROM (SELECT job, slot_us, finished_us,
                       ROW_NUMBER() OVER (PARTITION BY job ORDER BY slot_us DESC) AS n
                  FROM fleetcron_run
                 WHERE namespace = %(namespace)s AND state NOT IN ('running', 'queued')) AS ranked
         WHERE ranked.n > %(keep)s
            OR ranked.finished_us < TIMESTAMPDIFF(MICROSECOND, '1970-01-01',
                                                  UTC_TIMESTAMP(6)) - %(older_than_us)s
       ) AS doomed
    ON r.job = doomed.job AND r.slot_us = doomed.slot_us
 WHERE r.namespace = %(namespace)s AND r.state NOT IN ('running', 'queued');

-- name: run_prune_job
-- Retention of one job: up to `limit` of its finished rows (final, no retry pending) beyond
-- its newest `keep` finished rows and finished before now - older_than_us, oldest slot
-- first, in one transaction. Every bound is found first by a walk of the primary key (the
-- DELETE itself would sort): @fc_prune_cut, the newest kept row's slot (keep_offset = keep
-- - 1; NULL when the job has fewer finished rows: then nothing goes); @fc_prune_bound, the
-- slots that may go (a slot is never later than its row's finish); @fc_prune_upto, the
-- limit-th candidate's slot (NULL when there are fewer). The bounds are plain reads
-- (SELECT … INTO): MariaDB reads a subquery of a SET with shared locks, held until COMMIT,
-- and the DELETE checks every condition again on the rows it removes.
START TRANSACTION;
SET @fc_prune_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT MAX(slot_us) INTO @fc_prune_cut
  FROM (SELECT slot_us FROM fleetcron_run
         WHERE namespace = %(namespace)s AND job = %(job)s
           AND state NOT IN ('running', 'queued')
           AND NOT (state = 'failed' AND retry_at_us IS NOT NULL)
         ORDER BY slot_us DESC
         LIMIT 1 OFFSET %(keep_offset)s) AS b;
SET @fc_prune_bound = IF(%(keep)s = 0, @fc_prune_now - %(older_than_us)s,
                         LEAST(@fc_prune_now - %(older_than_us)s, @fc_prune_cut));
SELECT MAX(slot_us) INTO @fc_prune_upto
  FROM (SELECT slot_us FROM fleetcron_run
         WHERE namespace = %(namespace)s AND job = %(job)s
           AND slot_us < @fc_prune_bound
           AND state NOT IN ('running', 'queued')
           AND NOT (state = 'failed' AND retry_at_us IS NOT NULL)
           AND finished_us < @fc_prune_now - %(older_than_us)s
         ORDER BY slot_us
         LIMIT 1 OFFSET %(limit_offset)s) AS b;
DELETE FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s
   AND slot_us < @fc_prune_bound
   AND slot_us <= COALESCE(@fc_prune_upto, @fc_prune_bound)
   AND state NOT IN ('running', 'queued')
   AND NOT (state = 'failed' AND retry_at_us IS NOT NULL)
   AND finished_us < @fc_prune_now - %(older_than_us)s
 LIMIT %(limit)s;
SET @fc_pruned = ROW_COUNT();
COMMIT;
SELECT @fc_pruned;

-- name: run_prune_job_preview
SET @fc_prune_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT MAX(slot_us) INTO @fc_prune_cut
  FROM (SELECT slot_us FROM fleetcron_run
         WHERE namespace = %(namespace)s AND job = %(job)s
           AND state NOT IN ('running', 'queued')
           AND NOT (state = 'failed' AND retry_at_us IS NOT NULL)
         ORDER BY slot_us DESC
         LIMIT 1 OFFSET %(keep_offset)s) AS b;
SET @fc_prune_bound = IF(%(keep)s = 0, @fc_prune_now - %(older_than_us)s,
                         LEAST(@fc_prune_now - %(older_than_us)s, @fc_prune_cut));
SELECT count(*) FROM (
    SELECT 1 FROM fleetcron_run
     WHERE namespace = %(namespace)s AND job = %(job)s
       AND slot_us < @fc_prune_bound
       AND state NOT IN ('running', 'queued')
       AND NOT (state = 'failed' AND retry_at_us IS NOT NULL)
       AND finished_us < @fc_prune_now - %(older_than_us)s
     LIMIT %(limit)s
) AS doomed;

-- name: job_delete
-- The job row, unless the job has a queued or running run (its run rows stay).
DELETE FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = %(namespace)s AND job = %(job)s
                      AND state IN ('queued', 'running'));

-- name: job_delete_preview
SELECT 1 FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = %(namespace)s AND job = %(job)s
                      AND state IN ('queued', 'running'));

-- name: job_register
-- The row is made (a placeholder, updated_us = -1) or locked first, so the row read next
-- is the one this call replaces, even against a concurrent first registration.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
VALUES (%(namespace)s, %(job)s, FALSE, '', '', -1)
ON DUPLICATE KEY UPDATE updated_us = updated_us;
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us, @fc_now AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s AND updated_us <> -1;
UPDATE fleetcron_job
   SET definition = %(definition)s, fingerprint = %(fingerprint)s, updated_us = @fc_now
 WHERE namespace = %(namespace)s AND job = %(job)s;
COMMIT;

-- name: job_pause
-- A job no replica registered yet gets its row now, without a definition: a registration
-- fills it in and keeps the pause.
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
VALUES (%(namespace)s, %(job)s, TRUE, '{}', '',
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)))
    ON DUPLICATE KEY UPDATE
       paused = TRUE, updated_us = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));

-- name: job_resume
UPDATE fleetcron_job
   SET paused = FALSE,
       updated_us = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
 WHERE namespace = %(namespace)s AND job = %(job)s;

-- name: job_forget
-- A resumed row that holds nothing but a pause recorded ahead (no definition, no progress,
-- no run row): it goes (stores/ledger.py placeholder).
DELETE FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s AND NOT paused
   AND fingerprint = '' AND definition IN ('', '{}')
   AND high_water_us IS NULL AND last_success_us IS NULL AND last_failure_us IS NULL
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = %(namespace)s AND job = %(job)s);

-- name: job_get
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s;

-- name: job_list
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s
 ORDER BY job;

-- name: job_page
-- A page of job_list: the rows after %(after)s, a range of the primary key (job is
-- VARBINARY: bytewise); without definitions, not their text.
SELECT job, paused, CASE WHEN %(definitions)s THEN definition ELSE '' END AS definition,
       fingerprint, high_water_us, last_success_us, last_failure_us, updated_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job > %(after)s
 ORDER BY job
 LIMIT %(limit)s;

-- name: job_namespaces
SELECT DISTINCT namespace FROM fleetcron_job;

-- name: run_due
-- Rows a replica should claim now, oldest slot first: queued (trigger, backfill), running
-- with an expired lease (holder vanished), failed with a retry that has come. Through the
-- index by state: for ORDER BY ... LIMIT the optimizer would walk the namespace's rows in
-- slot order (fleetcron_run_newest or the primary key) and, with fewer rows due than the
-- limit, read every finished run of the namespace at each poll.
SET @fc_due_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT job, slot_us, state, attempt, fence, holder, run_id, `trigger`, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       @fc_due_now AS now_us
  FROM fleetcron_run FORCE INDEX (fleetcron_run_open)
 WHERE namespace = %(namespace)s
   AND state IN ('queued', 'running', 'failed')
   AND (state = 'queued'
        OR (state = 'running' AND expires_us <= @fc_due_now)
        OR (state = 'failed' AND retry_at_us <= @fc_due_now))
   AND (%(jobs)s IS NULL
        OR job IN (SELECT CAST(k.job AS BINARY)
                     FROM JSON_TABLE(%(jobs)s, '$[*]' COLUMNS (
                              job VARCHAR(800) CHARACTER SET utf8mb4 PATH '$')) AS k))
 ORDER BY slot_us, job
 LIMIT %(limit)s;

-- ---------------------------------------------------------------------------------------
-- Replica heartbeats (docs/design/replicas.md). Rows are (replica_id, host, pid, version,
-- mode, jobs_fingerprint, started_us, last_seen_us, expires_us, now_us).

-- name: replica_beat
-- One transaction at one clock reading: delete up to prune_limit other rows of the
-- namespace that expired more than retain_us ago, upsert this replica's row (started_us
-- kept when it exists), and read it back.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
DELETE FROM fleetcron_replica
 WHERE namespace = %(namespace)s AND replica_id <> %(replica_id)s
   AND expires_us < @fc_now - %(retain_us)s
 ORDER BY expires_us
 LIMIT %(prune_limit)s;
INSERT INTO fleetcron_replica
    (namespace, replica_id, host, pid, version, mode, jobs_fingerprint, started_us,
     last_seen_us, expires_us)
VALUES (%(namespace)s, %(replica_id)s, %(host)s, %(pid)s, %(version)s, %(mode)s,
        %(jobs_fingerprint)s, @fc_now, @fc_now, @fc_now + %(ttl_us)s)
ON DUPLICATE KEY UPDATE
   host = %(host)s, pid = %(pid)s, version = %(version)s, mode = %(mode)s,
   jobs_fingerprint = %(jobs_fingerprint)s, last_seen_us = @fc_now,
   expires_us = @fc_now + %(ttl_us)s;
SELECT replica_id, host, pid, version, mode, jobs_fingerprint, started_us, last_seen_us,
       expires_us, @fc_now AS now_us
  FROM fleetcron_replica
 WHERE namespace = %(namespace)s AND replica_id = %(replica_id)s;
COMMIT;

-- name: replica_list
-- Live rows, and those gone (expired) within gone_within_us.
SELECT replica_id, host, pid, version, mode, jobs_fingerprint, started_us, last_seen_us,
       expires_us, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_replica
 WHERE namespace = %(namespace)s
   AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                    - %(gone_within_us)s
 ORDER BY replica_id;

-- name: replica_leave
DELETE FROM fleetcron_replica
 WHERE namespace = %(namespace)s AND replica_id = %(replica_id)s;

-- ---------------------------------------------------------------------------------------
-- The work queue (docs/design/queue.md). Each operation is one statement, or one
-- multi-statement transaction in one round trip, at one reading of the clock (@fc_now).
-- Item rows are (id, dedupe_key, payload, state, attempts, max_attempts, fence, holder,
-- available_us, created_us, finished_us, error, now_us). Batches come as one JSON array,
-- unpacked server-side by JSON_TABLE; the operation has already dropped the repeats of an
-- item within a batch. An item is held while it is claimed and its claim (available_us)
-- has not expired. Rows named by id (a JSON array) are joined with STRAIGHT_JOIN, the array
-- first: each row is found by its primary key, so a locking read or an UPDATE touches
-- the rows it names and waits for no other; the operation sends ids in ascending order,
-- so two batches lock their common rows in one order and never deadlock.
-- There is no UPDATE … RETURNING: a block first locks the rows it will change and keeps
-- their ids in a variable (SELECT … INTO, NULL when none), changes them, and answers from
-- that list. JSON_ARRAYAGG has no order; the answers do not need one (except the claim's,
-- which carries its own sort key).

-- name: queue_put
-- Items are [payload, dedupe_key, delay_us, max_attempts]. @fc_taken: the items whose
-- dedupe key the queue has, found by a plain SELECT, a consistent read that locks nothing
-- (an INSERT … SELECT reading the table would lock the rows and gaps it reads on MariaDB,
-- even under READ COMMITTED). The others are inserted in input order, so AUTO_INCREMENT
-- gives increasing ids in that order; one whose key a concurrent call put meanwhile meets
-- the unique key, and ON DUPLICATE KEY waits for that call and changes nothing (never
-- INSERT IGNORE, which would also hide truncation). NOT IN (not a join) lets the server
-- look the taken items up in a materialized set instead of scanning it for every item.
-- With no INSERT … RETURNING, this call's rows are told apart by `token` (random, unique
-- to the call), written into holder for the duration of the transaction only: nobody else
-- sees an uncommitted row, and ids above @fc_last (the highest committed before the
-- insert, read by a plain SELECT … INTO: a subquery of a SET would hold a shared lock on
-- the newest item, which a claim would then skip) bound the search to the newest rows. Returns (id, dedupe_key) of each new item.
-- The items are sent once, into @fc_items (cleared at the end): they may be megabytes.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)),
    @fc_items = %(items)s;
SELECT COALESCE(MAX(id), 0) INTO @fc_last FROM fleetcron_queue_item;
SELECT JSON_ARRAYAGG(k.ord) INTO @fc_taken
  FROM JSON_TABLE(@fc_items, '$[*]' COLUMNS (
           ord FOR ORDINALITY,
           dedupe_key VARCHAR(800) CHARACTER SET utf8mb4 PATH '$[1]' ERROR ON ERROR)) AS k
  JOIN fleetcron_queue_item AS d
    ON d.namespace = %(namespace)s AND d.queue = %(queue)s
   AND d.dedupe_key = CAST(k.dedupe_key AS BINARY);
INSERT INTO fleetcron_queue_item
    (namespace, queue, dedupe_key, payload, state, attempts, max_attempts, fence, holder,
     available_us, created_us)
SELECT %(namespace)s, %(queue)s, CAST(k.dedupe_key AS BINARY), k.payload, 'ready', 0,
       k.max_attempts, 0, %(token)s, @fc_now + k.delay_us, @fc_now
  FROM JSON_TABLE(@fc_items, '$[*]' COLUMNS (
           ord FOR ORDINALITY,
           payload LONGTEXT CHARACTER SET utf8mb4 PATH '$[0]' ERROR ON ERROR,
           dedupe_key VARCHAR(800) CHARACTER SET utf8mb4 PATH '$[1]' ERROR ON ERROR,
           delay_us BIGINT PATH '$[2]' ERROR ON ERROR,
           max_attempts INT PATH '$[3]' ERROR ON ERROR)) AS k
 WHERE k.ord NOT IN (SELECT t.ord FROM JSON_TABLE(COALESCE(@fc_taken, '[]'), '$[*]'
                                                  COLUMNS (ord INT PATH '$')) AS t)
 ORDER BY k.ord
ON DUPLICATE KEY UPDATE id = fleetcron_queue_item.id;
SELECT JSON_ARRAYAGG(id) INTO @fc_put FROM fleetcron_queue_item
 WHERE id > @fc_last AND holder = %(token)s;
UPDATE JSON_TABLE(COALESCE(@fc_put, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS p
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = p.id
   SET i.holder = NULL;
SELECT i.id, i.dedupe_key
  FROM JSON_TABLE(COALESCE(@fc_put, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS p
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = p.id;
COMMIT;
SET @fc_items = NULL;

-- name: queue_claim
-- Picks up to `limit` claimable items, oldest available_us first, then lowest id, locking
-- them and skipping rows another claim has locked, so claimers never wait on each other
-- and never share an item. In two steps, because InnoDB's locking range scan also locks
-- the first index record past the range, which belongs to the next queue or namespace:
-- a claim there would skip that item (SKIP LOCKED) for as long as this transaction lasts,
-- and a queue claimed without pause would starve the next one's oldest item. So:
-- @fc_seen: a plain read (no locks) of the `window` oldest claimable items (the claim
-- index in order: claimable_us is available_us while ready or claimed; FORCE INDEX: left
-- to itself the optimizer reads the index from the start of the queue, through every
-- finished item, NULL there), as a JSON array in claim order (GROUP_CONCAT is the one
-- ordered aggregate of both servers); the window is wider than `limit` so that claims
-- running at once each find items the others have not locked.
-- @fc_picked: [id, available_us before the claim] of the first `limit` of them locked by
-- primary key in that order (the nested loop reads the array in order, no sort, so no row
-- past the limit is read or locked), skipping locked ones and checking again that each
-- is still claimable. Each picked item whose expired claim used up its deliveries dies;
-- the others are delivered (two UPDATEs: MySQL may evaluate a multi-table UPDATE's
-- assignments in any order, so none reads a column another one sets). Returns the
-- delivered rows in claim order, read before COMMIT, while they are still this
-- transaction's.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT CONCAT('[', GROUP_CONCAT(JSON_ARRAY(c.id, c.claimable_us)
                                ORDER BY c.claimable_us, c.id SEPARATOR ','), ']')
  INTO @fc_seen
  FROM (SELECT id, claimable_us
          FROM fleetcron_queue_item FORCE INDEX (fleetcron_queue_item_claim)
         WHERE namespace = %(namespace)s AND queue = %(queue)s AND claimable_us <= @fc_now
         ORDER BY claimable_us, id
         LIMIT %(window)s) AS c;
SELECT JSON_ARRAYAGG(JSON_ARRAY(p.id, p.was)) INTO @fc_picked
  FROM (SELECT i.id, i.available_us AS was
          FROM JSON_TABLE(COALESCE(@fc_seen, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS s
               STRAIGHT_JOIN fleetcron_queue_item AS i FORCE INDEX (PRIMARY) ON i.id = s.id
         WHERE i.namespace = %(namespace)s AND i.queue = %(queue)s
           AND i.claimable_us <= @fc_now
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) AS p;
UPDATE JSON_TABLE(COALESCE(@fc_picked, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS p
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = p.id
   SET i.state = 'dead', i.finished_us = @fc_now,
       i.error = CONCAT(%(expired_head)s, i.attempts, %(expired_tail)s)
 WHERE i.state = 'claimed' AND i.attempts >= i.max_attempts;
UPDATE JSON_TABLE(COALESCE(@fc_picked, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS p
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = p.id
   SET i.state = 'claimed', i.attempts = i.attempts + 1,
       i.fence = GREATEST(i.fence + 1, @fc_now), i.holder = %(holder)s,
       i.available_us = @fc_now + %(visibility_us)s
 WHERE i.state <> 'dead';
SELECT i.id, i.dedupe_key, i.payload, i.state, i.attempts, i.max_attempts, i.fence,
       i.holder, i.available_us, i.created_us, i.finished_us, i.error, @fc_now AS now_us
  FROM JSON_TABLE(COALESCE(@fc_picked, '[]'), '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', was BIGINT PATH '$[1]')) AS p
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = p.id
 WHERE i.state = 'claimed'
 ORDER BY p.was, p.id;
COMMIT;

-- name: queue_extend
-- Claims are [item_id, fence]. The held ones are locked (waiting for a claim that is
-- taking one, then judged as it left it), then extended: the UPDATE's condition is the
-- lock's, on rows nobody else can change meanwhile. Returns (id, fence, available_us) of each.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT STRAIGHT_JOIN JSON_ARRAYAGG(JSON_ARRAY(i.id, i.fence)) INTO @fc_held
  FROM JSON_TABLE(%(claims)s, '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]')) AS c
  JOIN fleetcron_queue_item AS i ON i.id = c.id
 WHERE i.fence = c.fence AND i.namespace = %(namespace)s AND i.queue = %(queue)s
   AND i.state = 'claimed' AND i.available_us > @fc_now
   FOR UPDATE;
UPDATE JSON_TABLE(COALESCE(@fc_held, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS h
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = h.id
   SET i.available_us = @fc_now + %(visibility_us)s;
COMMIT;
SELECT h.id, h.fence, @fc_now + %(visibility_us)s AS available_us
  FROM JSON_TABLE(COALESCE(@fc_held, '[]'), '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]')) AS h;

-- name: queue_ack
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT STRAIGHT_JOIN JSON_ARRAYAGG(JSON_ARRAY(i.id, i.fence)) INTO @fc_held
  FROM JSON_TABLE(%(claims)s, '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]')) AS c
  JOIN fleetcron_queue_item AS i ON i.id = c.id
 WHERE i.fence = c.fence AND i.namespace = %(namespace)s AND i.queue = %(queue)s
   AND i.state = 'claimed' AND i.available_us > @fc_now
   FOR UPDATE;
UPDATE JSON_TABLE(COALESCE(@fc_held, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS h
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = h.id
   SET i.state = 'done', i.finished_us = @fc_now;
COMMIT;
SELECT h.id, h.fence
  FROM JSON_TABLE(COALESCE(@fc_held, '[]'), '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]')) AS h;

-- name: queue_nack
-- Nacks are [item_id, fence, error, retry_in_us]. The held ones are locked, with the
-- state each is given back in: dead when its deliveries are used up (holder and claim
-- expiry kept), else ready after its backoff, without holder. The UPDATE's condition is
-- the lock's, on rows nobody else can change meanwhile; every assignment reads only its
-- own column and ones no assignment sets. Returns (id, fence, state) of each.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT STRAIGHT_JOIN
       JSON_ARRAYAGG(JSON_ARRAY(i.id, i.fence,
                                IF(i.attempts >= i.max_attempts, 'dead', 'ready')))
  INTO @fc_held
  FROM JSON_TABLE(%(nacks)s, '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]')) AS n
  JOIN fleetcron_queue_item AS i ON i.id = n.id
 WHERE i.fence = n.fence AND i.namespace = %(namespace)s AND i.queue = %(queue)s
   AND i.state = 'claimed' AND i.available_us > @fc_now
   FOR UPDATE;
UPDATE JSON_TABLE(%(nacks)s, '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]',
           error LONGTEXT CHARACTER SET utf8mb4 PATH '$[2]' ERROR ON ERROR,
           retry_in_us BIGINT PATH '$[3]' ERROR ON ERROR)) AS n
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = n.id
   SET i.state = IF(i.attempts >= i.max_attempts, 'dead', 'ready'),
       i.finished_us = IF(i.attempts >= i.max_attempts, @fc_now, i.finished_us),
       i.holder = IF(i.attempts >= i.max_attempts, i.holder, NULL),
       i.available_us = IF(i.attempts >= i.max_attempts, i.available_us,
                           @fc_now + n.retry_in_us),
       i.error = n.error
 WHERE i.fence = n.fence AND i.namespace = %(namespace)s AND i.queue = %(queue)s
   AND i.state = 'claimed' AND i.available_us > @fc_now;
COMMIT;
SELECT h.id, h.fence, h.state
  FROM JSON_TABLE(COALESCE(@fc_held, '[]'), '$[*]' COLUMNS (
           id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]',
           state VARCHAR(16) CHARACTER SET ascii PATH '$[2]')) AS h;

-- name: queue_get
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = %(namespace)s AND queue = %(queue)s AND id = %(item_id)s;

-- name: queue_list
-- states: a JSON array of states, or NULL for any.
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = %(namespace)s AND queue = %(queue)s
   AND (%(states)s IS NULL
        OR state IN (SELECT s.state
                       FROM JSON_TABLE(%(states)s, '$[*]' COLUMNS (
                                state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin
                                      PATH '$')) AS s))
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: queue_stats
-- Per queue of the namespace (only `queue` when not NULL), by name: (queue, ready
-- (claimable now), scheduled, claimed (held), done, dead, oldest_us, now_us).
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT queue,
       SUM(state IN ('ready', 'claimed') AND available_us <= @fc_now) AS ready,
       SUM(state = 'ready' AND available_us > @fc_now) AS scheduled,
       SUM(state = 'claimed' AND available_us > @fc_now) AS claimed,
       SUM(state = 'done') AS done,
       SUM(state = 'dead') AS dead,
       MIN(IF(state IN ('ready', 'claimed') AND available_us <= @fc_now, available_us, NULL))
           AS oldest_us,
       @fc_now AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = %(namespace)s AND (%(queue)s IS NULL OR queue = %(queue)s)
 GROUP BY queue
 ORDER BY queue;

-- name: queue_prune
-- Up to `limit` finished items of the namespace (of one queue when `queue` is not NULL),
-- oldest finish first: picked by a plain SELECT walking the finished index in order (a
-- DELETE … ORDER BY … LIMIT would sort every finished item first; FORCE INDEX for the
-- claim's reason), then deleted by id, the DELETE checking the state again so that an
-- item requeued meanwhile stays.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6));
SELECT JSON_ARRAYAGG(d.id) INTO @fc_doomed
  FROM (SELECT id FROM fleetcron_queue_item FORCE INDEX (fleetcron_queue_item_finished)
         WHERE namespace = %(namespace)s AND (%(queue)s IS NULL OR queue = %(queue)s)
           AND state IN ('done', 'dead') AND finished_us <= @fc_now - %(older_than_us)s
         ORDER BY finished_us, id
         LIMIT %(limit)s) AS d;
DELETE i FROM JSON_TABLE(COALESCE(@fc_doomed, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = d.id
 WHERE i.state IN ('done', 'dead');
SET @fc_pruned = ROW_COUNT();
COMMIT;
SELECT @fc_pruned;

-- name: queue_requeue
-- ids: a JSON array of item ids; the dead ones are ready again at now, with their
-- deliveries back (error and fence kept). The matched count says how many.
UPDATE JSON_TABLE(%(ids)s, '$[*]' COLUMNS (id BIGINT PATH '$')) AS r
       STRAIGHT_JOIN fleetcron_queue_item AS i ON i.id = r.id
   SET i.state = 'ready', i.attempts = 0, i.holder = NULL,
       i.available_us = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)),
       i.finished_us = NULL
 WHERE i.namespace = %(namespace)s AND i.queue = %(queue)s AND i.state = 'dead';

-- ---------------------------------------------------------------------------------------
-- Checkpoints (ctx.checkpoint): a job's high-water mark, moved only under a fence at least
-- the one that last moved it.

-- name: checkpoint_get
-- (value, fence, updated_us, now_us), or no row when the checkpoint was never set.
SELECT value, fence, updated_us,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS now_us
  FROM fleetcron_checkpoint
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: checkpoint_set
-- One transaction at one clock reading: a conditional upsert, then the row read back under
-- the lock the upsert took (a concurrent set waits for COMMIT). An existing row keeps its
-- columns unless its fence is at most the given one. fence is assigned last: MySQL
-- assigns left to right, each assignment reading the ones before it, so the conditions
-- on value and updated_us plainly read the stored fence. The answer is the row's fence
-- being the given one: a refused set leaves a higher fence, a set writes the given one.
-- The upsert's count cannot tell: under CLIENT_FOUND_ROWS an insert and an update that
-- changes nothing (a refused set) both count 1. The value is sent once, into @fc_value
-- (cleared at the end): it may be 64 KiB.
START TRANSACTION;
SET @fc_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)),
    @fc_value = %(value)s;
INSERT INTO fleetcron_checkpoint (namespace, name, value, fence, updated_us)
VALUES (%(namespace)s, %(name)s, @fc_value, %(fence)s, @fc_now)
ON DUPLICATE KEY UPDATE
   value = IF(fence <= %(fence)s, @fc_value, value),
   updated_us = IF(fence <= %(fence)s, @fc_now, updated_us),
   fence = GREATEST(fence, %(fence)s);
SELECT fence = %(fence)s
  FROM fleetcron_checkpoint
 WHERE namespace = %(namespace)s AND name = %(name)s;
COMMIT;
SET @fc_value = NULL;
