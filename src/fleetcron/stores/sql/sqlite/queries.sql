-- SQLite statements. The clock is SQLite's own 'now' (stable within one statement),
-- in microseconds at millisecond resolution. Each runs inside BEGIN IMMEDIATE. Rows are
-- read by column name, not position (fleetcron.stores.rows): a column computed for a
-- record has the record's name for it (AS now_us).

-- name: schema_version
SELECT coalesce(max(version), 0) FROM fleetcron_schema;

-- name: lease_acquire
-- The holder's process (:scope, :pid, :start, :group; NULL when this host cannot say) is
-- written with the fence it describes (holder_fence): see lease_holder.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
INSERT INTO fleetcron_lease AS l
    (namespace, name, holder, fence, acquired_us, expires_us, min_until_us,
     holder_fence, holder_scope, holder_pid, holder_start, holder_group)
SELECT :namespace, :name, :holder, t, t, t + :ttl_us, t + :least_us,
       t, :scope, :pid, :start, :group FROM now WHERE true
ON CONFLICT (namespace, name) DO UPDATE
   SET holder = excluded.holder,
       fence = max(l.fence + 1, excluded.fence),
       acquired_us = excluded.acquired_us,
       expires_us = excluded.expires_us,
       min_until_us = excluded.min_until_us,
       holder_fence = max(l.fence + 1, excluded.fence),
       holder_scope = excluded.holder_scope,
       holder_pid = excluded.holder_pid,
       holder_start = excluded.holder_start,
       holder_group = excluded.holder_group
 WHERE l.expires_us <= excluded.acquired_us
RETURNING fence, acquired_us AS now_us;

-- name: lease_holder
-- The process holding a lease that is held, when it was recorded on this host (:scope)
-- with the row's fence: a row written since by code that does not record it (an older
-- replica, a claim of the run ledger) has another fence.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
SELECT holder, fence, holder_pid, holder_start, holder_group
  FROM fleetcron_lease
 WHERE namespace = :namespace AND name = :name AND holder_fence = fence
   AND holder_scope = :scope AND expires_us > (SELECT t FROM now);

-- name: lease_group
-- Name the process group of a lease's holder (0: one it is starting), for (holder, fence).
UPDATE fleetcron_lease
   SET holder_group = :group
 WHERE namespace = :namespace AND name = :name AND holder = :holder AND fence = :fence
   AND holder_fence = fence
RETURNING 1;

-- name: lease_extend
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_lease
   SET expires_us = max((SELECT t FROM now) + :ttl_us, min_until_us)
 WHERE namespace = :namespace AND name = :name AND holder = :holder AND fence = :fence
   AND expires_us > (SELECT t FROM now)
RETURNING name, holder, fence, acquired_us, expires_us, min_until_us,
          (SELECT t FROM now) AS now_us;

-- name: lease_release
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_lease
   SET expires_us = max((SELECT t FROM now), min_until_us)
 WHERE namespace = :namespace AND name = :name AND holder = :holder AND fence = :fence
   AND expires_us > (SELECT t FROM now)
RETURNING 1;

-- name: lease_get
SELECT name, holder, fence, acquired_us, expires_us, min_until_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_lease
 WHERE namespace = :namespace AND name = :name;

-- name: lease_list
SELECT name, holder, fence, acquired_us, expires_us, min_until_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
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

-- The run ledger. Every operation runs inside one BEGIN IMMEDIATE transaction, reading
-- the store's clock once (store_now) and applying the rules of stores/ledger.py.

-- name: store_now
SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000;

-- name: run_row
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       :now AS now_us
  FROM fleetcron_run
 WHERE namespace = :namespace AND job = :job AND slot_us = :slot_us;

-- name: lease_row
SELECT name, holder, fence, acquired_us, expires_us, min_until_us, :now AS now_us
  FROM fleetcron_lease
 WHERE namespace = :namespace AND name = :name;

-- name: job_row
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us, :now AS now_us
  FROM fleetcron_job
 WHERE namespace = :namespace AND job = :job;

-- name: run_put
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
     finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output)
VALUES (:namespace, :job, :slot_us, :state, :attempt, :fence, :holder, :run_id, :trigger,
        :started_us, :finished_us, :expires_us, :retry_at_us, :cancel_requested, :exit_code,
        :error, :output)
ON CONFLICT (namespace, job, slot_us) DO UPDATE
   SET state = excluded.state, attempt = excluded.attempt, fence = excluded.fence,
       holder = excluded.holder, run_id = excluded.run_id, trigger = excluded.trigger,
       started_us = excluded.started_us, finished_us = excluded.finished_us,
       expires_us = excluded.expires_us, retry_at_us = excluded.retry_at_us,
       cancel_requested = excluded.cancel_requested, exit_code = excluded.exit_code,
       error = excluded.error, output = excluded.output;

-- name: lease_put
-- A job's lease as the run ledger holds it: its holder's process is not recorded.
INSERT INTO fleetcron_lease
    (namespace, name, holder, fence, acquired_us, expires_us, min_until_us)
VALUES (:namespace, :name, :holder, :fence, :acquired_us, :expires_us, :min_until_us)
ON CONFLICT (namespace, name) DO UPDATE
   SET holder = excluded.holder, fence = excluded.fence, acquired_us = excluded.acquired_us,
       expires_us = excluded.expires_us, min_until_us = excluded.min_until_us,
       holder_fence = NULL;

-- name: job_put
INSERT INTO fleetcron_job
    (namespace, job, paused, definition, fingerprint, high_water_us, last_success_us,
     last_failure_us, updated_us)
VALUES (:namespace, :job, :paused, :definition, :fingerprint, :high_water_us,
        :last_success_us, :last_failure_us, :updated_us)
ON CONFLICT (namespace, job) DO UPDATE
   SET paused = excluded.paused, definition = excluded.definition,
       fingerprint = excluded.fingerprint, high_water_us = excluded.high_water_us,
       last_success_us = excluded.last_success_us, last_failure_us = excluded.last_failure_us,
       updated_us = excluded.updated_us;

-- name: run_backfill
-- Queue a backfill run of each slot of the JSON array (distinct, oldest first) that has
-- no row and that the clock (:now, read in the same transaction) has reached; never
-- overwrites. One statement of the operation's transaction: every row is written or none.
INSERT INTO fleetcron_run
    (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
     finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output)
SELECT :namespace, :job, value, 'queued', 0, 0, '', '', 'backfill', NULL, :now, NULL,
       NULL, 0, NULL, NULL, NULL
  FROM json_each(:slots)
 WHERE value <= :now
 ORDER BY value
ON CONFLICT (namespace, job, slot_us) DO NOTHING;

-- name: run_cancel
-- The job's running attempts whose lease has not expired (of :slot_us only, unless NULL);
-- :note, unless NULL, becomes their error. One row returned per attempt asked.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_run SET cancel_requested = 1, error = coalesce(:note, error)
 WHERE namespace = :namespace AND job = :job AND state = 'running'
   AND (:slot_us IS NULL OR slot_us = :slot_us)
   AND expires_us > (SELECT t FROM now)
RETURNING 1;

-- name: run_settled
-- Which [job, slot_us] pairs of the JSON array have a row other than queued. CROSS JOIN
-- keeps the pairs the outer loop (SQLite does not reorder it): one primary-key lookup per
-- pair. A plain JOIN was planned as a scan of the namespace's ledger with the pairs read
-- again for every row.
SELECT r.job, r.slot_us
  FROM json_each(:pairs) AS k
 CROSS JOIN fleetcron_run AS r
    ON r.namespace = :namespace AND r.job = json_extract(k.value, '$[0]')
   AND r.slot_us = json_extract(k.value, '$[1]')
 WHERE r.state <> 'queued';

-- name: run_get
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_run
 WHERE namespace = :namespace AND job = :job AND slot_us = :slot_us;

-- name: run_list
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_run
 WHERE namespace = :namespace
 ORDER BY slot_us DESC, job
 LIMIT :limit;

-- name: run_list_job
-- Without `output` the rows come without it (run_list_many: a status read's many rows; a
-- long output sits on overflow pages that are then not read).
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error,
       CASE WHEN :output THEN output END AS output,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_run
 WHERE namespace = :namespace AND job = :job
 ORDER BY slot_us DESC
 LIMIT :limit;

-- name: run_running
-- The namespace's running rows that are among the newest `limit` rows of their job (skip =
-- limit - 1: the row at that place, when the job has one, is the oldest of them), through
-- fleetcron_run_running (migration 15): a paged status read finds the runs in progress
-- without reading the rest of the ledger. The caller keeps the jobs it asked for.
SELECT r.job, r.slot_us, r.state, r.attempt, r.fence, r.holder, r.run_id, r.trigger,
       r.started_us, r.finished_us, r.expires_us, r.retry_at_us, r.cancel_requested,
       r.exit_code, r.error, r.output,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_run AS r INDEXED BY fleetcron_run_running
 WHERE r.namespace = :namespace AND r.state = 'running'
   AND r.slot_us >= coalesce(
         (SELECT n.slot_us FROM fleetcron_run AS n
           WHERE n.namespace = r.namespace AND n.job = r.job
           ORDER BY n.slot_us DESC
           LIMIT 1 OFFSET :skip),
         r.slot_us)
 ORDER BY r.job, r.slot_us DESC;

-- name: run_prune
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000),
ranked AS (
    SELECT job, slot_us, finished_us,
           row_number() OVER (PARTITION BY job ORDER BY slot_us DESC) AS newest
      FROM fleetcron_run
     WHERE namespace = :namespace AND state NOT IN ('running', 'queued')
)
DELETE FROM fleetcron_run
 WHERE namespace = :namespace AND state NOT IN ('running', 'queued')
   AND (job, slot_us) IN (
       SELECT job, slot_us FROM ranked, now
        WHERE newest > :keep OR finished_us < now.t - :older_than_us
   )
RETURNING 1;

-- Retention of one job (run_prune_job): up to :limit of its finished rows (final, no retry
-- pending) that are beyond its newest :keep finished rows and finished before now -
-- :older_than_us, oldest slot first. The newest kept row is found walking the primary key
-- newest first (:keep_offset = keep - 1); a slot is never later than its row's finish, so
-- the slot bound keeps the walk from the oldest slot short.

-- name: run_prune_job
DELETE FROM fleetcron_run
 WHERE namespace = :namespace AND job = :job
   AND slot_us IN (
       SELECT r.slot_us
         FROM fleetcron_run AS r,
              (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
                      AS t) AS now
        WHERE r.namespace = :namespace AND r.job = :job
          AND r.state NOT IN ('running', 'queued')
          AND NOT (r.state = 'failed' AND r.retry_at_us IS NOT NULL)
          AND r.slot_us < now.t - :older_than_us
          AND r.finished_us < now.t - :older_than_us
          AND (:keep = 0 OR r.slot_us < (
              SELECT k.slot_us FROM fleetcron_run AS k
               WHERE k.namespace = :namespace AND k.job = :job
                 AND k.state NOT IN ('running', 'queued')
                 AND NOT (k.state = 'failed' AND k.retry_at_us IS NOT NULL)
               ORDER BY k.slot_us DESC
               LIMIT 1 OFFSET :keep_offset))
        ORDER BY r.slot_us
        LIMIT :limit)
RETURNING 1;

-- name: run_prune_job_preview
SELECT count(*) FROM (
    SELECT r.slot_us
      FROM fleetcron_run AS r,
           (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
                   AS t) AS now
     WHERE r.namespace = :namespace AND r.job = :job
       AND r.state NOT IN ('running', 'queued')
       AND NOT (r.state = 'failed' AND r.retry_at_us IS NOT NULL)
       AND r.slot_us < now.t - :older_than_us
       AND r.finished_us < now.t - :older_than_us
       AND (:keep = 0 OR r.slot_us < (
           SELECT k.slot_us FROM fleetcron_run AS k
            WHERE k.namespace = :namespace AND k.job = :job
              AND k.state NOT IN ('running', 'queued')
              AND NOT (k.state = 'failed' AND k.retry_at_us IS NOT NULL)
            ORDER BY k.slot_us DESC
            LIMIT 1 OFFSET :keep_offset))
     ORDER BY r.slot_us
     LIMIT :limit);

-- name: job_delete
-- The job row, unless the job has a queued or running run (its run rows stay).
DELETE FROM fleetcron_job
 WHERE namespace = :namespace AND job = :job
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = :namespace AND job = :job
                      AND state IN ('queued', 'running'))
RETURNING 1;

-- name: job_delete_preview
SELECT 1 FROM fleetcron_job
 WHERE namespace = :namespace AND job = :job
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = :namespace AND job = :job
                      AND state IN ('queued', 'running'));

-- name: job_pause
-- A job no replica registered yet gets its row now, without a definition: a registration
-- fills it in and keeps the pause.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
SELECT :namespace, :job, 1, '{}', '', t FROM now WHERE true
    ON CONFLICT (namespace, job) DO UPDATE SET paused = 1, updated_us = excluded.updated_us
RETURNING 1;

-- name: job_resume
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_job SET paused = 0, updated_us = (SELECT t FROM now)
 WHERE namespace = :namespace AND job = :job
RETURNING 1;

-- name: job_forget
-- A resumed row that holds nothing but a pause recorded ahead (no definition, no progress,
-- no run row): it goes (stores/ledger.py placeholder).
DELETE FROM fleetcron_job
 WHERE namespace = :namespace AND job = :job AND paused = 0
   AND fingerprint = '' AND definition IN ('', '{}')
   AND high_water_us IS NULL AND last_success_us IS NULL AND last_failure_us IS NULL
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run WHERE namespace = :namespace AND job = :job);

-- name: job_get
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_job
 WHERE namespace = :namespace AND job = :job;

-- name: job_list
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_job
 WHERE namespace = :namespace
 ORDER BY job;

-- name: job_page
-- A page of job_list: the rows after :after, a range of the primary key; without
-- :definitions the definitions stay on their pages.
SELECT job, paused, CASE WHEN :definitions THEN definition ELSE '' END AS definition,
       fingerprint, high_water_us, last_success_us, last_failure_us, updated_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_job
 WHERE namespace = :namespace AND job > :after
 ORDER BY job
 LIMIT :limit;

-- name: job_namespaces
SELECT DISTINCT namespace FROM fleetcron_job;

-- name: run_due
-- Rows a replica should claim now, oldest slot first: queued (trigger, backfill), running
-- with an expired lease (holder vanished), failed with a retry that has come. Through the
-- index of open rows: without statistics SQLite took the primary key's namespace prefix,
-- every finished row of the ledger read at each poll.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       t AS now_us
  FROM fleetcron_run INDEXED BY fleetcron_run_open, now
 WHERE namespace = :namespace
   AND state IN ('queued', 'running', 'failed')
   AND (state = 'queued'
        OR (state = 'running' AND expires_us <= t)
        OR (state = 'failed' AND retry_at_us <= t))
   AND (:jobs IS NULL OR job IN (SELECT value FROM json_each(:jobs)))
 ORDER BY slot_us, job
 LIMIT :limit;

-- Replica heartbeats (docs/design/replicas.md). Rows are (replica_id, host, pid, version,
-- mode, jobs_fingerprint, started_us, last_seen_us, expires_us, now_us). A beat is
-- replica_prune then replica_put, in one transaction, at one store_now.

-- name: replica_prune
DELETE FROM fleetcron_replica
 WHERE namespace = :namespace
   AND replica_id IN (
       SELECT replica_id FROM fleetcron_replica
        WHERE namespace = :namespace AND replica_id <> :replica_id
          AND expires_us < :now - :retain_us
        LIMIT :prune_limit);

-- name: replica_put
INSERT INTO fleetcron_replica
    (namespace, replica_id, host, pid, version, mode, jobs_fingerprint, started_us,
     last_seen_us, expires_us)
VALUES (:namespace, :replica_id, :host, :pid, :version, :mode, :jobs_fingerprint, :now,
        :now, :now + :ttl_us)
ON CONFLICT (namespace, replica_id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, version = excluded.version,
       mode = excluded.mode, jobs_fingerprint = excluded.jobs_fingerprint,
       last_seen_us = excluded.last_seen_us, expires_us = excluded.expires_us
RETURNING replica_id, host, pid, version, mode, jobs_fingerprint, started_us, last_seen_us,
          expires_us, :now AS now_us;

-- name: replica_list
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
SELECT replica_id, host, pid, version, mode, jobs_fingerprint, started_us, last_seen_us,
       expires_us, t AS now_us
  FROM fleetcron_replica, now
 WHERE namespace = :namespace AND expires_us > t - :gone_within_us
 ORDER BY replica_id;

-- name: replica_leave
DELETE FROM fleetcron_replica
 WHERE namespace = :namespace AND replica_id = :replica_id
RETURNING 1;

-- The work queue (docs/design/queue.md). Every operation runs in one BEGIN IMMEDIATE
-- transaction, which no other writer interleaves with; a statement reads the clock once
-- (the `now` CTE), and a claim, being two statements, passes the first one's reading to
-- the second (:now). Item rows are (id, dedupe_key, payload, state, attempts,
-- max_attempts, fence, holder, available_us, created_us, finished_us, error, now_us).
-- Batches come as one JSON array, unpacked by json_each; the operation has already dropped
-- the repeats of an item within a batch. An item is held while it is claimed and its
-- claim (available_us) has not expired. Where items are named by id, `+namespace` and
-- `+queue` keep SQLite from taking the (namespace, queue) index, which walks every item the
-- queue still holds, done ones included: each named item is one lookup by id.

-- name: queue_put
-- Items are [payload, dedupe_key, delay_us, max_attempts], inserted in input order
-- (increasing ids in that order); one whose dedupe key the queue has is skipped. The
-- WHERE true keeps ON CONFLICT from being read as a join's ON.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
INSERT INTO fleetcron_queue_item
    (namespace, queue, dedupe_key, payload, state, attempts, max_attempts, fence, holder,
     available_us, created_us)
SELECT :namespace, :queue, json_extract(k.value, '$[1]'), json_extract(k.value, '$[0]'),
       'ready', 0, json_extract(k.value, '$[3]'), 0, NULL,
       now.t + json_extract(k.value, '$[2]'), now.t
  FROM json_each(:items) AS k, now
 WHERE true
 ORDER BY k.key
ON CONFLICT (namespace, queue, dedupe_key) DO NOTHING
RETURNING id, dedupe_key;

-- name: queue_claim_pick
-- Up to :limit claimable items in claim order (oldest available_us first, then lowest id):
-- (id, whether its expired claim used up its deliveries, the clock).
SELECT i.id, i.state = 'claimed' AND i.attempts >= i.max_attempts AS dying, now.t AS now_us
  FROM fleetcron_queue_item AS i,
       (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
               AS t) AS now
 WHERE i.namespace = :namespace AND i.queue = :queue
   AND i.state IN ('ready', 'claimed') AND i.available_us <= now.t
 ORDER BY i.available_us, i.id
 LIMIT :limit;

-- name: queue_claim_kill
-- The picked items whose expired claim used up their deliveries (:ids) die.
UPDATE fleetcron_queue_item
   SET state = 'dead', finished_us = :now, error = :expired_head || attempts || :expired_tail
 WHERE id IN (SELECT value FROM json_each(:ids));

-- name: queue_claim
-- The other picked items (:ids) are delivered to :holder.
UPDATE fleetcron_queue_item
   SET state = 'claimed', attempts = attempts + 1, fence = max(fence + 1, :now),
       holder = :holder, available_us = :now + :visibility_us
 WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, dedupe_key, payload, state, attempts, max_attempts, fence, holder,
          available_us, created_us, finished_us, error, :now AS now_us;

-- name: queue_extend
-- Claims are [item_id, fence]; returns (id, fence, available_us) of each held item.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_queue_item AS i
   SET available_us = (SELECT t FROM now) + :visibility_us
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence
          FROM json_each(:claims)) AS c
 WHERE i.id = c.id AND i.fence = c.fence
   AND +i.namespace = :namespace AND +i.queue = :queue
   AND i.state = 'claimed' AND i.available_us > (SELECT t FROM now)
RETURNING id, fence, available_us;

-- name: queue_ack
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_queue_item AS i
   SET state = 'done', finished_us = (SELECT t FROM now)
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence
          FROM json_each(:claims)) AS c
 WHERE i.id = c.id AND i.fence = c.fence
   AND +i.namespace = :namespace AND +i.queue = :queue
   AND i.state = 'claimed' AND i.available_us > (SELECT t FROM now)
RETURNING id, fence;

-- name: queue_nack
-- Nacks are [item_id, fence, error, retry_in_us]: a held item with no delivery left dies
-- (holder and claim expiry kept), another is ready again after its backoff, without holder.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
UPDATE fleetcron_queue_item AS i
   SET state = CASE WHEN i.attempts >= i.max_attempts THEN 'dead' ELSE 'ready' END,
       finished_us = CASE WHEN i.attempts >= i.max_attempts THEN (SELECT t FROM now) END,
       holder = CASE WHEN i.attempts >= i.max_attempts THEN i.holder END,
       available_us = CASE WHEN i.attempts >= i.max_attempts THEN i.available_us
                           ELSE (SELECT t FROM now) + n.retry_in_us END,
       error = n.error
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence,
               json_extract(value, '$[2]') AS error, json_extract(value, '$[3]') AS retry_in_us
          FROM json_each(:nacks)) AS n
 WHERE i.id = n.id AND i.fence = n.fence
   AND +i.namespace = :namespace AND +i.queue = :queue
   AND i.state = 'claimed' AND i.available_us > (SELECT t FROM now)
RETURNING id, fence, state;

-- name: queue_get
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = :namespace AND queue = :queue AND id = :item_id;

-- name: queue_list
-- states: a JSON array of states, or NULL for any.
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = :namespace AND queue = :queue
   AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
 ORDER BY id DESC
 LIMIT :limit;

-- name: queue_stats
-- Per queue of the namespace (only :queue when not NULL), by name: (queue, ready
-- (claimable now), scheduled, claimed (held), done, dead, oldest_us, now_us).
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
SELECT i.queue,
       count(*) FILTER (WHERE i.state IN ('ready', 'claimed') AND i.available_us <= now.t)
           AS ready,
       count(*) FILTER (WHERE i.state = 'ready' AND i.available_us > now.t) AS scheduled,
       count(*) FILTER (WHERE i.state = 'claimed' AND i.available_us > now.t) AS claimed,
       count(*) FILTER (WHERE i.state = 'done') AS done,
       count(*) FILTER (WHERE i.state = 'dead') AS dead,
       min(i.available_us)
           FILTER (WHERE i.state IN ('ready', 'claimed') AND i.available_us <= now.t)
           AS oldest_us,
       now.t AS now_us
  FROM fleetcron_queue_item AS i, now
 WHERE i.namespace = :namespace AND (:queue IS NULL OR i.queue = :queue)
 GROUP BY i.queue
 ORDER BY i.queue;

-- name: queue_prune
-- Up to :limit finished items of the namespace (of one queue when :queue is not NULL),
-- oldest finish first.
DELETE FROM fleetcron_queue_item
 WHERE id IN (
       SELECT i.id
         FROM fleetcron_queue_item AS i,
              (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
                      AS t) AS now
        WHERE i.namespace = :namespace AND (:queue IS NULL OR i.queue = :queue)
          AND i.state IN ('done', 'dead') AND i.finished_us <= now.t - :older_than_us
        ORDER BY i.finished_us, i.id
        LIMIT :limit);

-- name: queue_requeue
-- ids: a JSON array of item ids; the dead ones are ready again at now, with their
-- deliveries back (error and fence kept). The changed count says how many.
UPDATE fleetcron_queue_item
   SET state = 'ready', attempts = 0, holder = NULL, finished_us = NULL,
       available_us = CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000
 WHERE +namespace = :namespace AND +queue = :queue AND state = 'dead'
   AND id IN (SELECT value FROM json_each(:ids));

-- Checkpoints (ctx.checkpoint): a job's high-water mark, moved only under a fence at least
-- the one that last moved it. Each operation is one statement (in the operation's BEGIN
-- IMMEDIATE transaction) at one reading of the clock.

-- name: checkpoint_get
-- (value, fence, updated_us, now_us), or no row when the checkpoint was never set.
SELECT value, fence, updated_us,
       CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000 AS now_us
  FROM fleetcron_checkpoint
 WHERE namespace = :namespace AND name = :name;

-- name: checkpoint_set
-- A conditional upsert: a new row goes in; an existing one is overwritten only when its
-- fence is at most the given one. RETURNING gives only a row inserted or updated, so a row
-- back means set and none means a higher fence has it (the changed count is no help: it
-- may be -1 for a statement that starts with WITH). The WHERE true keeps ON CONFLICT from
-- being read as a join's ON.
WITH now(t) AS (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)
INSERT INTO fleetcron_checkpoint (namespace, name, value, fence, updated_us)
SELECT :namespace, :name, :value, :fence, now.t
  FROM now
 WHERE true
ON CONFLICT (namespace, name) DO UPDATE
   SET value = excluded.value, fence = excluded.fence, updated_us = excluded.updated_us
 WHERE fleetcron_checkpoint.fence <= excluded.fence
RETURNING 1;
