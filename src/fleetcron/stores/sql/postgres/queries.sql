-- PostgreSQL statements. Every time is clock_timestamp() (the server's clock at the
-- moment of evaluation), never now() (start of the transaction) nor a client value.
-- Times are returned as microseconds since the epoch. Rows are read by column name, not
-- position (fleetcron.stores.rows): a column computed for a record has the record's name
-- for it (AS now_us), and a function's r_<column> is read as <column>.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM fleetcron_schema;

-- name: lease_acquire
-- One plain call, one round trip (migration 12): a row (fence, store now) when taken, none
-- when held; the rules are in the function (schema.sql).
SELECT * FROM fleetcron_lease_acquire_v1(
    %(namespace)s::text, %(name)s::text, %(holder)s::text, %(ttl_us)s::bigint,
    %(least_us)s::bigint);

-- name: lease_extend
WITH now AS (SELECT clock_timestamp() AS t)
UPDATE fleetcron_lease AS l
   SET expires_at = greatest(now.t + %(ttl_us)s * interval '1 microsecond', l.min_until)
  FROM now
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.holder = %(holder)s AND l.fence = %(fence)s
   AND l.expires_at > now.t
RETURNING l.name, l.holder, l.fence,
          (extract(epoch FROM l.acquired_at) * 1000000)::bigint AS acquired_us,
          (extract(epoch FROM l.expires_at) * 1000000)::bigint AS expires_us,
          (extract(epoch FROM l.min_until) * 1000000)::bigint AS min_until_us,
          (extract(epoch FROM now.t) * 1000000)::bigint AS now_us;

-- name: lease_release
-- A row when released, none when the lease was not ours (migration 12).
SELECT * FROM fleetcron_lease_release_v1(
    %(namespace)s::text, %(name)s::text, %(holder)s::text, %(fence)s::bigint);

-- name: lease_get
SELECT name, holder, fence,
       (extract(epoch FROM acquired_at) * 1000000)::bigint AS acquired_us,
       (extract(epoch FROM expires_at) * 1000000)::bigint AS expires_us,
       (extract(epoch FROM min_until) * 1000000)::bigint AS min_until_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: lease_list
-- COLLATE "C": code-point order, as on every other backend, whatever the database locale.
SELECT name, holder, fence,
       (extract(epoch FROM acquired_at) * 1000000)::bigint AS acquired_us,
       (extract(epoch FROM expires_at) * 1000000)::bigint AS expires_us,
       (extract(epoch FROM min_until) * 1000000)::bigint AS min_until_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_lease
 WHERE namespace = %(namespace)s
 ORDER BY name COLLATE "C";

-- name: lease_prune_preview
WITH now AS (SELECT clock_timestamp() AS t)
SELECT l.name FROM fleetcron_lease AS l, now
 WHERE l.namespace = %(namespace)s
   AND l.expires_at < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.min_until < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.fence < (extract(epoch FROM now.t) * 1000000)::bigint + fleetcron_timeline_offset_us();

-- name: lease_prune
-- The fence condition keeps a re-created row's fence (the clock, with the timeline's offset:
-- migration 16) above the deleted one.
WITH now AS (SELECT clock_timestamp() AS t)
DELETE FROM fleetcron_lease AS l USING now
 WHERE l.namespace = %(namespace)s
   AND l.expires_at < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.min_until < now.t - %(older_than_us)s * interval '1 microsecond'
   AND l.fence < (extract(epoch FROM now.t) * 1000000)::bigint + fleetcron_timeline_offset_us()
RETURNING l.name;

-- ---------------------------------------------------------------------------------------
-- Lock mode 'advisory' (fleetcron.stores.sql.advisory, docs/design/leases.md): the holder
-- holds the session advisory lock of the name's 64-bit key on a connection of its own, and
-- a lease row as any holder. An advisory holder's mark is its token:
-- host:pid:advisory.<hex>.

-- name: lease_acquire_advisory
-- Sent on the advisory session once it has the lock (so a session that has lost it cannot
-- write the row any more): lease_acquire's rules, and a live row another
-- advisory holder wrote is taken over at once, past its min_until (lock_at_least) — that
-- holder's session has ended, or this one would not have the advisory lock. Only a row
-- written since this server started and on its timeline, though: a restart or a promoted
-- standby forgets every advisory lock while a holder cut off from it may not know yet, so
-- such a row is waited out as a plain one. (On the current timeline a fence is at least the
-- acquisition's clock plus the timeline's offset: migration 16.) A plain holder's row is
-- respected until it expires. One row (fence, store now) when taken.
WITH now AS (SELECT clock_timestamp() AS t)
INSERT INTO fleetcron_lease AS l
    (namespace, name, holder, fence, acquired_at, expires_at, min_until)
SELECT %(namespace)s, %(name)s, %(holder)s,
       (extract(epoch FROM now.t) * 1000000)::bigint + fleetcron_timeline_offset_us(), now.t,
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
    OR (l.holder ~ ':advisory\.[0-9a-f]+$' AND l.min_until <= excluded.acquired_at
        AND l.acquired_at >= pg_postmaster_start_time()
        AND l.fence - (extract(epoch FROM l.acquired_at) * 1000000)::bigint
            >= fleetcron_timeline_offset_us())
RETURNING l.fence, (extract(epoch FROM l.acquired_at) * 1000000)::bigint AS now_us;

-- name: advisory_held
-- The monitoring read: the session advisory locks of these keys granted now in this
-- database, with their sessions (pg_locks joined with pg_stat_activity). A bigint key is
-- classid (its high 32 bits) and objid (its low 32 bits) with objsubid 1. held_since_us is
-- the session's last change of state: an advisory session sends nothing once it has its
-- lock and has written its lease row, so that is when it took them. A role without pg_read_all_stats sees another role's
-- sessions without their client address and times (NULL).
SELECT ((l.classid::bigint << 32) | l.objid::bigint) AS key, l.pid,
       host(a.client_addr) AS client_addr, a.application_name,
       (extract(epoch FROM a.backend_start) * 1000000)::bigint AS backend_start_us,
       (extract(epoch FROM a.state_change) * 1000000)::bigint AS held_since_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((l.classid::bigint << 32) | l.objid::bigint) = ANY (%(keys)s::bigint[])
 ORDER BY l.pid;

-- name: advisory_session_pid
-- On the advisory session: the server process it runs in, to compare with the one
-- announced at connect (a pooler announces one of its own).
SELECT pg_backend_pid();

-- name: advisory_try_lock
-- On the advisory session: its lock, without waiting, and the server's TCP keepalives for
-- the session (20 s idle, then 3 probes 5 s apart), so that a host that vanishes without
-- closing its connection has its lock released within about 35 s, not the system's two
-- hours — and after the holder has seen its own side of the connection fail (the client's
-- keepalives give up within about 25 s: fleetcron.stores.sql.postgres). Ignored on a Unix
-- socket.
SELECT pg_try_advisory_lock(%(key)s::bigint) AS got, pg_backend_pid() AS pid,
       set_config('tcp_keepalives_idle', '20', false),
       set_config('tcp_keepalives_interval', '5', false),
       set_config('tcp_keepalives_count', '3', false);

-- name: advisory_end_stale
-- On a contender's session, the advisory lock being busy: end the session that holds it
-- when the name's lease row has expired by the store's clock and that session is a
-- fleetcron advisory session of this very name (application_name) that took the lock
-- before the row expired. Its holder is frozen or hung (stopped, paused, starved): its
-- local deadline has passed, so it trusts its lease no more, and its idle session would
-- hold advisory contenders off for as long as its kernel answers. A session of another
-- name or application (a colliding key) is never ended, nor one whose state this role may
-- not see (state_change NULL). The number of sessions ended.
SELECT count(*) FROM (
    SELECT pg_terminate_backend(l.pid) AS ended
      FROM pg_locks AS l
      JOIN pg_stat_activity AS a ON a.pid = l.pid
      JOIN fleetcron_lease AS r ON r.namespace = %(namespace)s AND r.name = %(name)s
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND ((l.classid::bigint << 32) | l.objid::bigint) = %(key)s::bigint
       AND a.application_name = %(application_name)s
       AND r.expires_at <= clock_timestamp()
       AND a.state_change < r.expires_at
) AS s WHERE s.ended;

-- name: advisory_unlock
SELECT pg_advisory_unlock(%(key)s::bigint);

-- name: schema_init
CREATE TABLE IF NOT EXISTS fleetcron_schema (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: schema_record
INSERT INTO fleetcron_schema (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_settings
-- What the migration relies on, for its own transaction only (set_config(…, true)).
SELECT set_config('TimeZone', 'UTC', true),
       set_config('idle_in_transaction_session_timeout', '0', true);

-- name: migration_lock
-- Serialises concurrent first starts; released at COMMIT.
SELECT pg_advisory_xact_lock(7310585240963158077);

-- ---------------------------------------------------------------------------------------
-- The run ledger (docs/design/ledger.md). Claim, extend, finish and register are
-- PL/pgSQL functions (migrations/0002_ledger.sql): each locks the job lease row, then the
-- run row, then the job row, and reads clock_timestamp() once. Run rows are returned as
-- (job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us, finished_us,
-- expires_us, retry_at_us, cancel_requested, exit_code, error, output, now_us), job rows
-- as (job, paused, definition, fingerprint, high_water_us, last_success_us,
-- last_failure_us, updated_us, now_us).

-- name: store_now
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- name: run_claim
-- Executed once per slot in one pipeline; each execution is its own transaction. One row:
-- the status, the 16 run columns (NULL unless claimed), the store's now, and the
-- registered fingerprint when the claim was refused as a 'conflict' (migration 11).
SELECT * FROM fleetcron_run_claim_v4(
    %(namespace)s::text, %(job)s::text, %(lease_name)s::text, %(slot_us)s::bigint,
    %(run_id)s::text, %(exclusive)s::boolean, %(max_attempts)s::integer,
    %(trigger)s::text, %(least_us)s::bigint, %(holder)s::text, %(ttl_us)s::bigint,
    %(lost_error)s::text, %(deadline_us)s::bigint, %(missed_error)s::text,
    %(progress)s::boolean, %(pausable)s::boolean, %(fingerprint)s::text);

-- name: run_claim_many
-- The claims of one transaction of a batch in one call, as a JSON array in job order
-- (migration 14): one row per claim, its position in the array first, then the row of
-- run_claim.
SELECT * FROM fleetcron_run_claim_many_v1(
    %(namespace)s::text, %(holder)s::text, %(ttl_us)s::bigint, %(lost_error)s::text,
    %(missed_error)s::text, %(items)s::jsonb);

-- name: run_extend
SELECT * FROM fleetcron_run_extend(
    %(namespace)s::text, %(job)s::text, %(lease_name)s::text, %(slot_us)s::bigint,
    %(fence)s::bigint, %(ttl_us)s::bigint);

-- name: run_finish
SELECT fleetcron_run_finish(
    %(namespace)s::text, %(job)s::text, %(lease_name)s::text, %(slot_us)s::bigint,
    %(fence)s::bigint, %(state)s::text, %(exit_code)s::integer, %(error)s::text,
    %(output)s::text, %(retry_after_us)s::bigint);

-- name: run_finish_many
-- The outcomes of one transaction of a batch in one call, as a JSON array in job order
-- (migration 14): one row per outcome, its position in the array and whether it was taken.
SELECT * FROM fleetcron_run_finish_many_v1(%(namespace)s::text, %(items)s::jsonb);

-- name: run_record
-- Insert a final row only where the slot has none (never overwrites); the job row's
-- high-water mark moves only when it inserted. Locks: run row, then job row.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
ins AS (
    INSERT INTO fleetcron_run
        (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
         started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
         error, output)
    SELECT %(namespace)s, %(job)s, %(slot_us)s, %(state)s, 0, 0, '', '', %(trigger)s,
           NULL, now.us, NULL, NULL, false, NULL, %(error)s::text, NULL
      FROM now
     WHERE %(slot_us)s <= now.us  -- never a row for a slot the clock has not reached
    ON CONFLICT (namespace, job, slot_us) DO NOTHING
    RETURNING slot_us
),
mark AS (
    INSERT INTO fleetcron_job AS j
        (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
    SELECT %(namespace)s, %(job)s, false, '{}', '',
           CASE WHEN %(state)s <> 'queued' THEN ins.slot_us END, now.us
      FROM ins, now
    ON CONFLICT (namespace, job) DO UPDATE
       SET high_water_us = greatest(j.high_water_us, excluded.high_water_us)
)
SELECT count(*) > 0 FROM ins;

-- name: run_backfill
-- Queue a backfill run of each slot of the JSON array (distinct, oldest first) that has
-- no row and that the clock has reached; never overwrites. One statement: every row is
-- written or none. It locks only the rows it inserts, in slot order (a queued run is not
-- schedule progress: the job row is not touched).
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
ins AS (
    INSERT INTO fleetcron_run
        (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
         started_us, finished_us, expires_us, retry_at_us, cancel_requested, exit_code,
         error, output)
    SELECT %(namespace)s, %(job)s, s.slot_us, 'queued', 0, 0, '', '', 'backfill',
           NULL, now.us, NULL, NULL, false, NULL, NULL, NULL
      FROM (SELECT value::bigint AS slot_us
              FROM jsonb_array_elements_text(%(slots)s::jsonb)) AS s, now
     WHERE s.slot_us <= now.us  -- never a row for a slot the clock has not reached
     ORDER BY s.slot_us
    ON CONFLICT (namespace, job, slot_us) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM ins;

-- name: run_cancel
-- The job's running attempts whose lease has not expired (of slot_us only, unless NULL);
-- note, unless NULL, becomes their error. The count is the rows asked.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
UPDATE fleetcron_run AS r
   SET cancel_requested = true, error = coalesce(%(note)s::text, r.error)
  FROM now
 WHERE r.namespace = %(namespace)s AND r.job = %(job)s
   AND (%(slot_us)s::bigint IS NULL OR r.slot_us = %(slot_us)s::bigint)
   AND r.state = 'running' AND r.expires_us > now.us;

-- name: run_settled
-- Which [job, slot_us] pairs of the JSON array have a row other than queued. One primary
-- key lookup per pair, forced by the LATERAL reference (the LIMIT keeps the planner from
-- flattening it into a join): as a plain join, the generic plan of the prepared statement
-- hashed the pairs and read every row of the namespace (9 ms a call at 20,000 rows).
SELECT r.job, r.slot_us
  FROM jsonb_array_elements(%(pairs)s::jsonb) AS k(pair)
 CROSS JOIN LATERAL (
       SELECT r.job, r.slot_us FROM fleetcron_run AS r
        WHERE r.namespace = %(namespace)s AND r.job = k.pair->>0
          AND r.slot_us = (k.pair->>1)::bigint AND r.state <> 'queued'
        LIMIT 1) AS r;

-- name: run_get
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s AND slot_us = %(slot_us)s;

-- name: run_list
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s
 ORDER BY slot_us DESC, job COLLATE "C"
 LIMIT %(limit)s;

-- name: run_list_job
-- Without `output` the rows come without it (run_list_many: a status read's many rows).
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error,
       CASE WHEN %(output)s::boolean THEN output END AS output,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_run
 WHERE namespace = %(namespace)s AND job = %(job)s
 ORDER BY slot_us DESC
 LIMIT %(limit)s;

-- name: run_list_many
-- The newest `limit` rows of each job of the JSON array, each job's behind its position
-- (column ord) in the array: one index scan per job, one statement for them all. Without
-- `output` the rows come without it (a status read's thousands of rows: half their bytes).
SELECT j.ord, r.job, r.slot_us, r.state, r.attempt, r.fence, r.holder, r.run_id, r.trigger,
       r.started_us, r.finished_us, r.expires_us, r.retry_at_us, r.cancel_requested,
       r.exit_code, r.error, CASE WHEN %(output)s::boolean THEN r.output END AS output,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM jsonb_array_elements_text(%(jobs)s::jsonb) WITH ORDINALITY AS j(job, ord)
  CROSS JOIN LATERAL (
        SELECT * FROM fleetcron_run
         WHERE namespace = %(namespace)s AND job = j.job
         ORDER BY slot_us DESC
         LIMIT %(limit)s) AS r
 ORDER BY j.ord, r.slot_us DESC;

-- name: run_running
-- The namespace's running rows that are among the newest `limit` rows of their job (skip =
-- limit - 1: the row at that place, when the job has one, is the oldest of them), through
-- fleetcron_run_running (migration 15): a paged status read finds the runs in progress
-- without reading the rest of the ledger. The caller keeps the jobs it asked for.
SELECT r.job, r.slot_us, r.state, r.attempt, r.fence, r.holder, r.run_id, r.trigger,
       r.started_us, r.finished_us, r.expires_us, r.retry_at_us, r.cancel_requested,
       r.exit_code, r.error, r.output,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_run AS r
 WHERE r.namespace = %(namespace)s AND r.state = 'running'
   AND r.slot_us >= coalesce(
         (SELECT n.slot_us FROM fleetcron_run AS n
           WHERE n.namespace = r.namespace AND n.job = r.job
           ORDER BY n.slot_us DESC
           LIMIT 1 OFFSET %(skip)s),
         r.slot_us)
 ORDER BY r.job COLLATE "C", r.slot_us DESC;

-- name: run_prune
-- Final rows beyond the newest `keep` of their job, or finished longer ago than the age.
-- A row claimed again meanwhile is re-checked by the DELETE and kept (never a running row).
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
ranked AS (
    SELECT job, slot_us, finished_us,
           row_number() OVER (PARTITION BY job ORDER BY slot_us DESC) AS n
      FROM fleetcron_run
     WHERE namespace = %(namespace)s AND state NOT IN ('running', 'queued')
)
DELETE FROM fleetcron_run AS r USING ranked, now
 WHERE r.namespace = %(namespace)s AND r.job = ranked.job AND r.slot_us = ranked.slot_us
   AND r.state NOT IN ('running', 'queued')
   AND (ranked.n > %(keep)s OR ranked.finished_us < now.us - %(older_than_us)s);

-- name: run_prune_job
-- Retention of one job: up to `limit` of its finished rows (final, no retry pending) beyond
-- its newest `keep` finished rows and finished before now - older_than_us, oldest slot
-- first. The newest kept row is found walking the primary key newest first (keep_offset =
-- keep - 1); a slot is never later than its row's finish, so the slot bound (a sub-select,
-- so it bounds the index scan) keeps the walk from the oldest slot short. The DELETE
-- re-checks the state (never a row claimed again).
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
doomed AS (
    SELECT r.slot_us
      FROM fleetcron_run AS r
     WHERE r.namespace = %(namespace)s AND r.job = %(job)s
       AND r.state NOT IN ('running', 'queued')
       AND NOT (r.state = 'failed' AND r.retry_at_us IS NOT NULL)
       AND r.slot_us < (SELECT us FROM now) - %(older_than_us)s
       AND r.finished_us < (SELECT us FROM now) - %(older_than_us)s
       AND (%(keep)s = 0 OR r.slot_us < (
           SELECT k.slot_us FROM fleetcron_run AS k
            WHERE k.namespace = %(namespace)s AND k.job = %(job)s
              AND k.state NOT IN ('running', 'queued')
              AND NOT (k.state = 'failed' AND k.retry_at_us IS NOT NULL)
            ORDER BY k.slot_us DESC
            OFFSET %(keep_offset)s LIMIT 1))
     ORDER BY r.slot_us
     LIMIT %(limit)s
),
deleted AS (
    DELETE FROM fleetcron_run AS r USING doomed
     WHERE r.namespace = %(namespace)s AND r.job = %(job)s AND r.slot_us = doomed.slot_us
       AND r.state NOT IN ('running', 'queued')
       AND NOT (r.state = 'failed' AND r.retry_at_us IS NOT NULL)
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: run_prune_job_preview
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
SELECT count(*) FROM (
    SELECT r.slot_us
      FROM fleetcron_run AS r
     WHERE r.namespace = %(namespace)s AND r.job = %(job)s
       AND r.state NOT IN ('running', 'queued')
       AND NOT (r.state = 'failed' AND r.retry_at_us IS NOT NULL)
       AND r.slot_us < (SELECT us FROM now) - %(older_than_us)s
       AND r.finished_us < (SELECT us FROM now) - %(older_than_us)s
       AND (%(keep)s = 0 OR r.slot_us < (
           SELECT k.slot_us FROM fleetcron_run AS k
            WHERE k.namespace = %(namespace)s AND k.job = %(job)s
              AND k.state NOT IN ('running', 'queued')
              AND NOT (k.state = 'failed' AND k.retry_at_us IS NOT NULL)
            ORDER BY k.slot_us DESC
            OFFSET %(keep_offset)s LIMIT 1))
     ORDER BY r.slot_us
     LIMIT %(limit)s
) AS doomed;

-- name: job_delete
-- The job row, unless the job has a queued or running run (its run rows stay).
DELETE FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = %(namespace)s AND job = %(job)s
                      AND state IN ('queued', 'running'))
RETURNING 1;

-- name: job_delete_preview
SELECT 1 FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s
   AND NOT EXISTS (SELECT 1 FROM fleetcron_run
                    WHERE namespace = %(namespace)s AND job = %(job)s
                      AND state IN ('queued', 'running'));

-- name: job_register
SELECT * FROM fleetcron_job_register(
    %(namespace)s::text, %(job)s::text, %(definition)s::text, %(fingerprint)s::text);

-- name: job_pause
-- A job no replica registered yet gets its row now, without a definition: a registration
-- fills it in and keeps the pause.
INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, updated_us)
VALUES (%(namespace)s, %(job)s, true, '{}', '',
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
    ON CONFLICT (namespace, job) DO UPDATE
   SET paused = true, updated_us = excluded.updated_us;

-- name: job_resume
UPDATE fleetcron_job
   SET paused = false,
       updated_us = (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
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
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job = %(job)s;

-- name: job_list
SELECT job, paused, definition, fingerprint, high_water_us, last_success_us,
       last_failure_us, updated_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s
 ORDER BY job COLLATE "C";

-- name: job_page
-- A page of job_list: the rows after %(after)s in the collation of the primary key (a
-- range of its index, not a sort of the namespace); without definitions, not their text.
SELECT job, paused, CASE WHEN %(definitions)s::boolean THEN definition ELSE '' END AS definition,
       fingerprint, high_water_us, last_success_us, last_failure_us, updated_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_job
 WHERE namespace = %(namespace)s AND job > %(after)s
 ORDER BY job
 LIMIT %(limit)s;

-- name: job_namespaces
SELECT DISTINCT namespace FROM fleetcron_job;

-- name: run_due
-- Rows a replica should claim now, oldest slot first: queued (trigger, backfill), running
-- with an expired lease (holder vanished), failed with a retry that has come.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
SELECT job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
       finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error, output,
       now.us AS now_us
  FROM fleetcron_run, now
 WHERE namespace = %(namespace)s
   AND state IN ('queued', 'running', 'failed')
   AND (state = 'queued'
        OR (state = 'running' AND expires_us <= now.us)
        OR (state = 'failed' AND retry_at_us <= now.us))
   AND (%(jobs)s::jsonb IS NULL
        OR job IN (SELECT jsonb_array_elements_text(%(jobs)s::jsonb)))
 ORDER BY slot_us, job COLLATE "C"
 LIMIT %(limit)s;

-- ---------------------------------------------------------------------------------------
-- Replica heartbeats (docs/design/replicas.md). Rows are (replica_id, host, pid, version,
-- mode, jobs_fingerprint, started_us, last_seen_us, expires_us, now_us).

-- name: replica_beat
-- One statement: delete up to prune_limit other rows of the namespace that expired more
-- than retain_us ago, and upsert this replica's row (started_us kept when it exists). The
-- DELETE never touches this replica's row, so the two never meet.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
pruned AS (
    DELETE FROM fleetcron_replica AS r
     WHERE r.namespace = %(namespace)s
       AND r.replica_id IN (
           SELECT o.replica_id FROM fleetcron_replica AS o, now
            WHERE o.namespace = %(namespace)s AND o.replica_id <> %(replica_id)s
              AND o.expires_us < now.us - %(retain_us)s
            LIMIT %(prune_limit)s)
)
INSERT INTO fleetcron_replica AS r
    (namespace, replica_id, host, pid, version, mode, jobs_fingerprint, started_us,
     last_seen_us, expires_us)
SELECT %(namespace)s, %(replica_id)s, %(host)s, %(pid)s, %(version)s, %(mode)s,
       %(jobs_fingerprint)s, now.us, now.us, now.us + %(ttl_us)s
  FROM now
ON CONFLICT (namespace, replica_id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, version = excluded.version,
       mode = excluded.mode, jobs_fingerprint = excluded.jobs_fingerprint,
       last_seen_us = excluded.last_seen_us, expires_us = excluded.expires_us
RETURNING r.replica_id, r.host, r.pid, r.version, r.mode, r.jobs_fingerprint, r.started_us,
          r.last_seen_us, r.expires_us, r.last_seen_us AS now_us;

-- name: replica_list
-- Live rows, and those gone (expired) within gone_within_us.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
SELECT replica_id, host, pid, version, mode, jobs_fingerprint, started_us, last_seen_us,
       expires_us, now.us AS now_us
  FROM fleetcron_replica, now
 WHERE namespace = %(namespace)s AND expires_us > now.us - %(gone_within_us)s
 ORDER BY replica_id COLLATE "C";

-- name: replica_leave
DELETE FROM fleetcron_replica
 WHERE namespace = %(namespace)s AND replica_id = %(replica_id)s;

-- ---------------------------------------------------------------------------------------
-- The work queue (docs/design/queue.md). Item rows are (id, dedupe_key, payload, state,
-- attempts, max_attempts, fence, holder, available_us, created_us, finished_us, error,
-- now_us). Batches come as one JSON array, unpacked server-side; the operation has
-- already dropped the repeats of an item within a batch. An item is held while it is
-- claimed and its claim (available_us) has not expired. put, claim, extend, ack and nack
-- are functions (schema.sql): planned once per connection. The others are one statement
-- each, at one reading of clock_timestamp().
--
-- Plans that do not hang on statistics: a queue the statistics have not seen yet (new, or
-- flooded since the last ANALYZE) is estimated at one row, and any index leading with
-- (namespace, queue) then looks as cheap as the right one, though it reads the whole
-- queue. So the claim asks for `live`, which only the claim index leads with after the
-- queue, and the statements that name items by id compare the queue with IS NOT DISTINCT
-- FROM, which no index serves: the primary key is their way in.

-- name: queue_put
SELECT * FROM fleetcron_queue_put(%(namespace)s::text, %(queue)s::text, %(items)s::jsonb);

-- name: queue_claim
SELECT * FROM fleetcron_queue_claim(
    %(namespace)s::text, %(queue)s::text, %(holder)s::text, %(limit)s::integer,
    %(visibility_us)s::bigint, %(expired_head)s::text, %(expired_tail)s::text);

-- name: queue_extend
SELECT * FROM fleetcron_queue_extend(
    %(namespace)s::text, %(queue)s::text, %(claims)s::jsonb, %(visibility_us)s::bigint);

-- name: queue_ack
SELECT * FROM fleetcron_queue_ack(%(namespace)s::text, %(queue)s::text, %(claims)s::jsonb);

-- name: queue_nack
SELECT * FROM fleetcron_queue_nack(%(namespace)s::text, %(queue)s::text, %(nacks)s::jsonb);

-- name: queue_get
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_queue_item
 WHERE id = %(item_id)s
   AND (namespace, queue) IS NOT DISTINCT FROM (%(namespace)s, %(queue)s);

-- name: queue_list
-- states: a JSON array of states, or NULL for any.
SELECT id, dedupe_key, payload, state, attempts, max_attempts, fence, holder, available_us,
       created_us, finished_us, error,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_queue_item
 WHERE namespace = %(namespace)s AND queue = %(queue)s
   AND (%(states)s::jsonb IS NULL
        OR state IN (SELECT jsonb_array_elements_text(%(states)s::jsonb)))
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: queue_stats
-- Per queue of the namespace (only `queue` when not NULL), by name: (queue, ready
-- (claimable now), scheduled, claimed (held), done, dead, oldest_us, now_us).
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
SELECT i.queue,
       count(*) FILTER (WHERE i.state IN ('ready', 'claimed') AND i.available_us <= now.us)
           AS ready,
       count(*) FILTER (WHERE i.state = 'ready' AND i.available_us > now.us) AS scheduled,
       count(*) FILTER (WHERE i.state = 'claimed' AND i.available_us > now.us) AS claimed,
       count(*) FILTER (WHERE i.state = 'done') AS done,
       count(*) FILTER (WHERE i.state = 'dead') AS dead,
       min(i.available_us)
           FILTER (WHERE i.state IN ('ready', 'claimed') AND i.available_us <= now.us)
           AS oldest_us,
       now.us AS now_us
  FROM fleetcron_queue_item AS i, now
 WHERE i.namespace = %(namespace)s AND (%(queue)s::text IS NULL OR i.queue = %(queue)s)
 GROUP BY i.queue, now.us
 ORDER BY i.queue COLLATE "C";

-- name: queue_prune
-- Up to `limit` finished items of the namespace (of one queue when `queue` is not NULL),
-- oldest finish first; the DELETE checks the state again, so an item requeued meanwhile
-- stays.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
doomed AS (
    SELECT i.id
      FROM fleetcron_queue_item AS i
     WHERE i.namespace = %(namespace)s AND (%(queue)s::text IS NULL OR i.queue = %(queue)s)
       AND i.state IN ('done', 'dead')
       AND i.finished_us <= (SELECT us FROM now) - %(older_than_us)s
     ORDER BY i.finished_us, i.id
     LIMIT %(limit)s
),
deleted AS (
    DELETE FROM fleetcron_queue_item AS i USING doomed
     WHERE i.id = doomed.id AND i.state IN ('done', 'dead')
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: queue_requeue
-- ids: a JSON array of item ids; the dead ones are ready again at now, with their
-- deliveries back (error and fence kept). Returns how many.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
requeued AS (
    UPDATE fleetcron_queue_item AS i
       SET state = 'ready', attempts = 0, holder = NULL, available_us = now.us,
           finished_us = NULL
      FROM now
     WHERE (i.namespace, i.queue) IS NOT DISTINCT FROM (%(namespace)s, %(queue)s)
       AND i.state = 'dead'
       AND i.id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb)::bigint)
    RETURNING 1
)
SELECT count(*) FROM requeued;

-- ---------------------------------------------------------------------------------------
-- Checkpoints (ctx.checkpoint): a job's high-water mark, moved only under a fence at least
-- the one that last moved it. Each operation is one statement at one reading of
-- clock_timestamp().

-- name: checkpoint_get
-- (value, fence, updated_us, now_us), or no row when the checkpoint was never set.
SELECT value, fence, updated_us,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
  FROM fleetcron_checkpoint
 WHERE namespace = %(namespace)s AND name = %(name)s;

-- name: checkpoint_set
-- A conditional upsert: a new row goes in; an existing one is overwritten only when its
-- fence is at most the given one. A row refused by the WHERE is still locked and not
-- returned, so a row back means set and none means a higher fence has it. A concurrent
-- set of a new name waits on the key's insertion and is then judged against that row.
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)
INSERT INTO fleetcron_checkpoint AS c (namespace, name, value, fence, updated_us)
SELECT %(namespace)s, %(name)s, %(value)s, %(fence)s, now.us
  FROM now
ON CONFLICT (namespace, name) DO UPDATE
   SET value = excluded.value, fence = excluded.fence, updated_us = excluded.updated_us
 WHERE c.fence <= excluded.fence
RETURNING true;
