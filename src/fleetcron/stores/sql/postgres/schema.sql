-- The postgres schema as the migrations leave it, in one place to read. It is not applied:
-- `fleetcron migrate` applies migrations/ in order; tests/contract/test_schema.py checks
-- that this file builds the same tables, indexes and functions as they do.

-- Lease rows: one per (namespace, name), never deleted except by prune.
CREATE TABLE IF NOT EXISTS fleetcron_lease (
    namespace   text        NOT NULL,
    name        text        NOT NULL,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    min_until   timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- fleetcron_timeline_offset_us: what a fence adds to the clock, (timeline - 1) × 2^40 µs
-- (12.7 days per promotion). A standby promoted to primary starts a new WAL timeline, one
-- above the highest it knows; after an asynchronous failover it may have lost fences the
-- old primary issued, and its clock may be behind the old primary's: with the offset every
-- fence it issues is still above every fence of the timelines before, unless its clock is
-- 12.7 days behind. The timeline is read from the name of the current WAL file (its first 8
-- hex digits), which any role may read; on a standby (in recovery) there is no write, and
-- the offset is 0.
CREATE OR REPLACE FUNCTION fleetcron_timeline_offset_us() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN 0::bigint
           ELSE (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
                 - 1)::bigint << 40
           END
$$;

-- lease_acquire: insert the row, or take it over when it has expired at the server's
-- clock, read once. Under READ COMMITTED a concurrent acquirer waits for the row lock and
-- re-evaluates the condition on the winner's row, so exactly one wins. The fence folds in
-- the clock so it keeps increasing even after the row was pruned. One row (fence, store
-- now) when taken, none when held.
CREATE OR REPLACE FUNCTION fleetcron_lease_acquire_v1(
    p_namespace text, p_name text, p_holder text, p_ttl_us bigint, p_least_us bigint
) RETURNS TABLE (r_fence bigint, r_now_us bigint) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    INSERT INTO fleetcron_lease AS l
        (namespace, name, holder, fence, acquired_at, expires_at, min_until)
    VALUES (p_namespace, p_name, p_holder,
            (extract(epoch FROM v_t) * 1000000)::bigint + fleetcron_timeline_offset_us(), v_t,
            v_t + p_ttl_us * interval '1 microsecond',
            v_t + p_least_us * interval '1 microsecond')
    ON CONFLICT (namespace, name) DO UPDATE
       SET holder = excluded.holder,
           fence = greatest(l.fence + 1, excluded.fence),
           acquired_at = excluded.acquired_at,
           expires_at = excluded.expires_at,
           min_until = excluded.min_until
     WHERE l.expires_at <= excluded.acquired_at
    RETURNING l.fence, (extract(epoch FROM l.acquired_at) * 1000000)::bigint;
END;
$$;

-- lease_release: end a lease held with (holder, fence) and unexpired; lock_at_least keeps
-- it held until min_until. Never DELETE: the row keeps the fence. One row when released,
-- none when it was not ours.
CREATE OR REPLACE FUNCTION fleetcron_lease_release_v1(
    p_namespace text, p_name text, p_holder text, p_fence bigint
) RETURNS SETOF boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t timestamptz := clock_timestamp();
BEGIN
    UPDATE fleetcron_lease AS l SET expires_at = greatest(v_t, l.min_until)
     WHERE l.namespace = p_namespace AND l.name = p_name
       AND l.holder = p_holder AND l.fence = p_fence AND l.expires_at > v_t;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END;
$$;

-- The run ledger (docs/design/ledger.md): one row per slot, one row per job.
-- Times are microseconds since the epoch on the server's clock (clock_timestamp()).
-- Lock order of every ledger function, so concurrent ones never deadlock:
-- job lease row -> run row -> job row.
-- split: dollar (function bodies between $$ … $$ are one statement)
CREATE TABLE IF NOT EXISTS fleetcron_run (
    namespace        text    NOT NULL,
    job              text    NOT NULL,
    slot_us          bigint  NOT NULL,
    state            text    NOT NULL,
    attempt          integer NOT NULL,
    fence            bigint  NOT NULL,
    holder           text    NOT NULL,
    run_id           text    NOT NULL,
    trigger          text    NOT NULL,
    started_us       bigint,
    finished_us      bigint,
    expires_us       bigint,
    retry_at_us      bigint,
    cancel_requested boolean NOT NULL DEFAULT false,
    exit_code        integer,
    error            text,
    output           text,
    PRIMARY KEY (namespace, job, slot_us)
);

-- run_list: newest slot first across the namespace's jobs. The job in the default
-- collation (migration 13), so a primary key lookup of one slot reads one row through it.
CREATE INDEX IF NOT EXISTS fleetcron_run_newest
    ON fleetcron_run (namespace, slot_us DESC, job);

CREATE TABLE IF NOT EXISTS fleetcron_job (
    namespace       text    NOT NULL,
    job             text    NOT NULL,
    paused          boolean NOT NULL DEFAULT false,
    definition      text    NOT NULL,
    fingerprint     text    NOT NULL,
    high_water_us   bigint,
    last_success_us bigint,
    last_failure_us bigint,
    updated_us      bigint  NOT NULL,
    PRIMARY KEY (namespace, job)
);

-- run_extend: renew a running attempt held with the fence, and the job lease if it
-- carries the same fence and is unexpired.
CREATE OR REPLACE FUNCTION fleetcron_run_extend(
    p_namespace text, p_job text, p_lease_name text, p_slot_us bigint, p_fence bigint,
    p_ttl_us bigint
) RETURNS TABLE (
    r_job text, r_slot_us bigint, r_state text, r_attempt integer, r_fence bigint,
    r_holder text, r_run_id text, r_trigger text, r_started_us bigint,
    r_finished_us bigint, r_expires_us bigint, r_retry_at_us bigint,
    r_cancel_requested boolean, r_exit_code integer, r_error text, r_output text,
    r_now_us bigint
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t   timestamptz := clock_timestamp();
    v_now bigint := (extract(epoch FROM v_t) * 1000000)::bigint;
    v_run fleetcron_run%ROWTYPE;
BEGIN
    PERFORM 1 FROM fleetcron_lease AS l
      WHERE l.namespace = p_namespace AND l.name = p_lease_name
        FOR UPDATE;
    UPDATE fleetcron_run AS r SET expires_us = v_now + p_ttl_us
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us
       AND r.state = 'running' AND r.fence = p_fence AND r.expires_us > v_now
    RETURNING r.* INTO v_run;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE fleetcron_lease AS l
       SET expires_at = greatest(v_t + p_ttl_us * interval '1 microsecond', l.min_until)
     WHERE l.namespace = p_namespace AND l.name = p_lease_name
       AND l.fence = p_fence AND l.expires_at > v_t;
    RETURN QUERY SELECT v_run.job, v_run.slot_us, v_run.state, v_run.attempt, v_run.fence,
        v_run.holder, v_run.run_id, v_run.trigger, v_run.started_us, v_run.finished_us,
        v_run.expires_us, v_run.retry_at_us, v_run.cancel_requested, v_run.exit_code,
        v_run.error, v_run.output, v_now;
END;
$$;

-- run_finish: record the outcome of a running attempt that is ours and unexpired; release
-- the job lease if it carries the fence; note success or failure on the job row.
CREATE OR REPLACE FUNCTION fleetcron_run_finish(
    p_namespace text, p_job text, p_lease_name text, p_slot_us bigint, p_fence bigint,
    p_state text, p_exit_code integer, p_error text, p_output text, p_retry_after_us bigint
) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t   timestamptz := clock_timestamp();
    v_now bigint := (extract(epoch FROM v_t) * 1000000)::bigint;
BEGIN
    PERFORM 1 FROM fleetcron_lease AS l
      WHERE l.namespace = p_namespace AND l.name = p_lease_name
        FOR UPDATE;
    UPDATE fleetcron_run AS r
       SET state = p_state, finished_us = v_now, expires_us = NULL,
           retry_at_us = CASE WHEN p_state = 'failed' THEN v_now + p_retry_after_us END,
           exit_code = p_exit_code, error = p_error, output = p_output
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us
       AND r.state = 'running' AND r.fence = p_fence AND r.expires_us > v_now;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE fleetcron_lease AS l SET expires_at = greatest(v_t, l.min_until)
     WHERE l.namespace = p_namespace AND l.name = p_lease_name AND l.fence = p_fence;
    INSERT INTO fleetcron_job AS j
        (namespace, job, paused, definition, fingerprint, last_success_us,
         last_failure_us, updated_us)
    VALUES (p_namespace, p_job, false, '{}', '',
            CASE WHEN p_state = 'succeeded' THEN v_now END,
            CASE WHEN p_state IN ('failed', 'lost') THEN v_now END, v_now)
    ON CONFLICT (namespace, job) DO UPDATE
       SET last_success_us = coalesce(excluded.last_success_us, j.last_success_us),
           last_failure_us = coalesce(excluded.last_failure_us, j.last_failure_us);
    RETURN true;
END;
$$;

-- job_register: upsert the definition, keep paused and progress, return the row before.
CREATE OR REPLACE FUNCTION fleetcron_job_register(
    p_namespace text, p_job text, p_definition text, p_fingerprint text
) RETURNS TABLE (
    r_job text, r_paused boolean, r_definition text, r_fingerprint text,
    r_high_water_us bigint, r_last_success_us bigint, r_last_failure_us bigint,
    r_updated_us bigint, r_now_us bigint
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    v_before fleetcron_job%ROWTYPE;
BEGIN
    LOOP
        SELECT * INTO v_before FROM fleetcron_job AS j
         WHERE j.namespace = p_namespace AND j.job = p_job
           FOR UPDATE;
        IF FOUND THEN
            UPDATE fleetcron_job AS j
               SET definition = p_definition, fingerprint = p_fingerprint,
                   updated_us = v_now
             WHERE j.namespace = p_namespace AND j.job = p_job;
            RETURN QUERY SELECT v_before.job, v_before.paused, v_before.definition,
                v_before.fingerprint, v_before.high_water_us, v_before.last_success_us,
                v_before.last_failure_us, v_before.updated_us, v_now;
            RETURN;
        END IF;
        INSERT INTO fleetcron_job
            (namespace, job, paused, definition, fingerprint, updated_us)
        VALUES (p_namespace, p_job, false, p_definition, p_fingerprint, v_now)
        ON CONFLICT (namespace, job) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- Finding the rows to claim again (queued, expired, due for a retry) without a scan.
CREATE INDEX IF NOT EXISTS fleetcron_run_open
    ON fleetcron_run (namespace, slot_us) WHERE state IN ('queued', 'running', 'failed');

-- The runs in progress, for a status read that needs nothing else of most jobs' ledger
-- (run_running; migration 15).
CREATE INDEX IF NOT EXISTS fleetcron_run_running
    ON fleetcron_run (namespace, job, slot_us) WHERE state = 'running';

-- run_claim, one slot: the rules of fleetcron.stores.ledger.decide_claim. The clock is
-- read once: the batch's clock when the runner set fleetcron.batch_now (every claim of a
-- batch happens at one store time), else clock_timestamp(). The job lease row is created (expired) if missing so there is a row to lock;
-- holding it serialises every claim of the job, so the run row read next is stable.
-- Exactly one row comes back: r_status (fleetcron.models.CLAIM_STATUSES), and the claimed
-- run's columns when it is 'claimed' (NULL otherwise).
CREATE OR REPLACE FUNCTION fleetcron_run_claim(
    p_namespace text, p_job text, p_lease_name text, p_slot_us bigint, p_run_id text,
    p_exclusive boolean, p_max_attempts integer, p_trigger text, p_least_us bigint,
    p_holder text, p_ttl_us bigint, p_lost_error text, p_deadline_us bigint,
    p_missed_error text
) RETURNS TABLE (
    r_status text, r_job text, r_slot_us bigint, r_state text, r_attempt integer, r_fence bigint,
    r_holder text, r_run_id text, r_trigger text, r_started_us bigint,
    r_finished_us bigint, r_expires_us bigint, r_retry_at_us bigint,
    r_cancel_requested boolean, r_exit_code integer, r_error text, r_output text,
    r_now_us bigint
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t       timestamptz := coalesce(
        nullif(current_setting('fleetcron.batch_now', true), '')::timestamptz,
        clock_timestamp());
    v_now     bigint := (extract(epoch FROM v_t) * 1000000)::bigint;
    v_paused  boolean;
    v_state   text;
    v_run     fleetcron_run%ROWTYPE;
    v_has_run boolean;
    v_lease   fleetcron_lease%ROWTYPE;
    v_attempt integer := 1;
    v_note    text := NULL;
    v_fence   bigint;
    v_missed  boolean;
    v_expires bigint;
BEGIN
    -- 1. A slot the store's clock has not reached.
    IF p_slot_us > v_now THEN
        r_status := 'not_due';
        RETURN NEXT;
        RETURN;
    END IF;
    -- 2. A paused job's schedule (pausing only ever updates an existing row).
    SELECT j.paused INTO v_paused FROM fleetcron_job AS j
     WHERE j.namespace = p_namespace AND j.job = p_job;
    IF coalesce(v_paused, false) AND p_trigger = 'schedule' THEN
        r_status := 'paused';
        RETURN NEXT;
        RETURN;
    END IF;
    -- A final row other than failed never changes again, and a running attempt whose
    -- lease is valid at v_now cannot be claimed at v_now: refuse without locking (most
    -- claims a busy fleet sends are for slots another replica already has).
    SELECT r.state, r.expires_us INTO v_state, v_expires FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    IF (v_state IS NOT NULL AND v_state NOT IN ('running', 'failed', 'queued'))
       OR (v_state = 'running' AND v_expires > v_now) THEN
        r_status := 'taken';
        RETURN NEXT;
        RETURN;
    END IF;
    -- Lock the job lease row (made, expired, if missing; prune may remove it meanwhile).
    LOOP
        SELECT * INTO v_lease FROM fleetcron_lease AS l
         WHERE l.namespace = p_namespace AND l.name = p_lease_name
           FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO fleetcron_lease
            (namespace, name, holder, fence, acquired_at, expires_at, min_until)
        VALUES (p_namespace, p_lease_name, '', 0, 'epoch', 'epoch', 'epoch')
        ON CONFLICT (namespace, name) DO NOTHING;
    END LOOP;
    -- 3. The run row, locked.
    SELECT * INTO v_run FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us
       FOR UPDATE;
    v_has_run := FOUND;
    IF v_has_run THEN
        IF v_run.state = 'running' AND v_run.expires_us IS NOT NULL
           AND v_run.expires_us <= v_now THEN
            IF v_run.attempt >= p_max_attempts THEN
                UPDATE fleetcron_run AS r
                   SET state = 'lost', finished_us = v_now, expires_us = NULL,
                       error = p_lost_error
                 WHERE r.namespace = p_namespace AND r.job = p_job
                   AND r.slot_us = p_slot_us;
                r_status := 'taken';
                RETURN NEXT;
                RETURN;
            END IF;
            v_attempt := v_run.attempt + 1;
            v_note := 'attempt ' || v_run.attempt || ' lost: ' || p_lost_error;
        ELSIF v_run.state = 'queued' THEN
            v_attempt := 1;  -- asked for by a trigger or a backfill
        ELSIF v_run.state = 'failed' AND v_run.retry_at_us IS NOT NULL
              AND v_run.retry_at_us <= v_now AND v_run.attempt < p_max_attempts THEN
            v_attempt := v_run.attempt + 1;
        ELSE
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    ELSIF p_deadline_us IS NOT NULL AND v_now > p_deadline_us THEN
        -- 4. No row and past the claim's deadline: recorded as missed, not run.
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'missed', 0, 0, '', '', p_trigger, NULL,
                v_now, NULL, NULL, false, NULL, p_missed_error, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        v_missed := FOUND;
        IF v_missed AND p_trigger IN ('schedule', 'exec') THEN
            INSERT INTO fleetcron_job AS j
                (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
            VALUES (p_namespace, p_job, false, '{}', '', p_slot_us, v_now)
            ON CONFLICT (namespace, job) DO UPDATE
               SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
        END IF;
        r_status := CASE WHEN v_missed THEN 'missed' ELSE 'taken' END;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 5. The job lease.
    IF p_exclusive AND v_lease.expires_at > v_t THEN
        r_status := 'busy';
        RETURN NEXT;
        RETURN;
    END IF;
    v_fence := greatest(v_lease.fence + 1, v_now);
    -- 6. The run row (a final row recorded since the read above wins: nothing changes).
    IF v_has_run THEN
        UPDATE fleetcron_run AS r
           SET state = 'running', attempt = v_attempt, fence = v_fence, holder = p_holder,
               run_id = p_run_id, trigger = p_trigger, started_us = v_now,
               finished_us = NULL, expires_us = v_now + p_ttl_us, retry_at_us = NULL,
               cancel_requested = false, exit_code = NULL, error = v_note, output = NULL
         WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    ELSE
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'running', v_attempt, v_fence, p_holder,
                p_run_id, p_trigger, v_now, NULL, v_now + p_ttl_us, NULL, false,
                NULL, v_note, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        IF NOT FOUND THEN
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF p_exclusive THEN
        UPDATE fleetcron_lease AS l
           SET holder = p_holder, fence = v_fence, acquired_at = v_t,
               expires_at = v_t + p_ttl_us * interval '1 microsecond',
               min_until = v_t + p_least_us * interval '1 microsecond'
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    ELSE
        UPDATE fleetcron_lease AS l SET fence = v_fence
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    END IF;
    -- 7. The job row and its high-water mark (schedule progress only: not manual runs).
    INSERT INTO fleetcron_job AS j
        (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
    VALUES (p_namespace, p_job, false, '{}', '',
            CASE WHEN p_trigger IN ('schedule', 'exec') THEN p_slot_us END, v_now)
    ON CONFLICT (namespace, job) DO UPDATE
       SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
    RETURN QUERY SELECT 'claimed'::text, p_job, p_slot_us, 'running'::text, v_attempt, v_fence, p_holder,
        p_run_id, p_trigger, v_now, NULL::bigint, v_now + p_ttl_us, NULL::bigint, false,
        NULL::integer, v_note, NULL::text, v_now;
END;
$$;

-- run_claim, one slot: the rules of fleetcron.stores.ledger.decide_claim, at the store time
-- read once at the start. The job lease row is created (expired) if missing so there is a
-- row to lock; holding it serialises every claim of the job, so the run row read next is
-- stable. Exactly one row comes back: r_status (fleetcron.models.CLAIM_STATUSES), and the
-- claimed run's columns when it is 'claimed' (NULL otherwise).
CREATE OR REPLACE FUNCTION fleetcron_run_claim_v3(
    p_namespace text, p_job text, p_lease_name text, p_slot_us bigint, p_run_id text,
    p_exclusive boolean, p_max_attempts integer, p_trigger text, p_least_us bigint,
    p_holder text, p_ttl_us bigint, p_lost_error text, p_deadline_us bigint,
    p_missed_error text, p_progress boolean, p_pausable boolean
) RETURNS TABLE (
    r_status text, r_job text, r_slot_us bigint, r_state text, r_attempt integer, r_fence bigint,
    r_holder text, r_run_id text, r_trigger text, r_started_us bigint,
    r_finished_us bigint, r_expires_us bigint, r_retry_at_us bigint,
    r_cancel_requested boolean, r_exit_code integer, r_error text, r_output text,
    r_now_us bigint
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t       timestamptz := clock_timestamp();
    v_now     bigint := (extract(epoch FROM v_t) * 1000000)::bigint;
    v_paused  boolean;
    v_state   text;
    v_run     fleetcron_run%ROWTYPE;
    v_has_run boolean;
    v_lease   fleetcron_lease%ROWTYPE;
    v_attempt integer := 1;
    v_note    text := NULL;
    v_fence   bigint;
    v_missed  boolean;
    v_expires bigint;
BEGIN
    -- 1. A slot the store's clock has not reached.
    IF p_slot_us > v_now THEN
        r_status := 'not_due';
        RETURN NEXT;
        RETURN;
    END IF;
    -- 2. A paused job's schedule (pausing only ever updates an existing row).
    SELECT j.paused INTO v_paused FROM fleetcron_job AS j
     WHERE j.namespace = p_namespace AND j.job = p_job;
    IF coalesce(v_paused, false) AND p_pausable THEN
        r_status := 'paused';
        RETURN NEXT;
        RETURN;
    END IF;
    -- A final row other than failed never changes again, and a running attempt whose
    -- lease is valid at v_now cannot be claimed at v_now: refuse without locking (most
    -- claims a busy fleet sends are for slots another replica already has).
    SELECT r.state, r.expires_us INTO v_state, v_expires FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    IF (v_state IS NOT NULL AND v_state NOT IN ('running', 'failed', 'queued'))
       OR (v_state = 'running' AND v_expires > v_now) THEN
        r_status := 'taken';
        RETURN NEXT;
        RETURN;
    END IF;
    -- Lock the job lease row (made, expired, if missing; prune may remove it meanwhile).
    LOOP
        SELECT * INTO v_lease FROM fleetcron_lease AS l
         WHERE l.namespace = p_namespace AND l.name = p_lease_name
           FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO fleetcron_lease
            (namespace, name, holder, fence, acquired_at, expires_at, min_until)
        VALUES (p_namespace, p_lease_name, '', 0, 'epoch', 'epoch', 'epoch')
        ON CONFLICT (namespace, name) DO NOTHING;
    END LOOP;
    -- 3. The run row, locked.
    SELECT * INTO v_run FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us
       FOR UPDATE;
    v_has_run := FOUND;
    IF v_has_run THEN
        IF v_run.state = 'running' AND v_run.expires_us IS NOT NULL
           AND v_run.expires_us <= v_now THEN
            IF v_run.attempt >= p_max_attempts THEN
                UPDATE fleetcron_run AS r
                   SET state = 'lost', finished_us = v_now, expires_us = NULL,
                       error = p_lost_error
                 WHERE r.namespace = p_namespace AND r.job = p_job
                   AND r.slot_us = p_slot_us;
                r_status := 'taken';
                RETURN NEXT;
                RETURN;
            END IF;
            v_attempt := v_run.attempt + 1;
            v_note := 'attempt ' || v_run.attempt || ' lost: ' || p_lost_error;
        ELSIF v_run.state = 'queued' THEN
            v_attempt := 1;  -- asked for by a trigger or a backfill
        ELSIF v_run.state = 'failed' AND v_run.retry_at_us IS NOT NULL
              AND v_run.retry_at_us <= v_now AND v_run.attempt < p_max_attempts THEN
            v_attempt := v_run.attempt + 1;
        ELSE
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    ELSIF p_deadline_us IS NOT NULL AND v_now > p_deadline_us THEN
        -- 4. No row and past the claim's deadline: recorded as missed, not run.
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'missed', 0, 0, '', '', p_trigger, NULL,
                v_now, NULL, NULL, false, NULL, p_missed_error, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        v_missed := FOUND;
        IF v_missed AND p_progress THEN
            INSERT INTO fleetcron_job AS j
                (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
            VALUES (p_namespace, p_job, false, '{}', '', p_slot_us, v_now)
            ON CONFLICT (namespace, job) DO UPDATE
               SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
        END IF;
        r_status := CASE WHEN v_missed THEN 'missed' ELSE 'taken' END;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 5. The job lease.
    IF p_exclusive AND v_lease.expires_at > v_t THEN
        r_status := 'busy';
        RETURN NEXT;
        RETURN;
    END IF;
    v_fence := greatest(v_lease.fence + 1, v_now);
    -- 6. The run row (a final row recorded since the read above wins: nothing changes).
    IF v_has_run THEN
        UPDATE fleetcron_run AS r
           SET state = 'running', attempt = v_attempt, fence = v_fence, holder = p_holder,
               run_id = p_run_id, trigger = p_trigger, started_us = v_now,
               finished_us = NULL, expires_us = v_now + p_ttl_us, retry_at_us = NULL,
               cancel_requested = false, exit_code = NULL, error = v_note, output = NULL
         WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    ELSE
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'running', v_attempt, v_fence, p_holder,
                p_run_id, p_trigger, v_now, NULL, v_now + p_ttl_us, NULL, false,
                NULL, v_note, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        IF NOT FOUND THEN
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF p_exclusive THEN
        UPDATE fleetcron_lease AS l
           SET holder = p_holder, fence = v_fence, acquired_at = v_t,
               expires_at = v_t + p_ttl_us * interval '1 microsecond',
               min_until = v_t + p_least_us * interval '1 microsecond'
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    ELSE
        UPDATE fleetcron_lease AS l SET fence = v_fence
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    END IF;
    -- 7. The job row and its high-water mark (schedule progress only: not manual runs).
    INSERT INTO fleetcron_job AS j
        (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
    VALUES (p_namespace, p_job, false, '{}', '',
            CASE WHEN p_progress THEN p_slot_us END, v_now)
    ON CONFLICT (namespace, job) DO UPDATE
       SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
    RETURN QUERY SELECT 'claimed'::text, p_job, p_slot_us, 'running'::text, v_attempt, v_fence, p_holder,
        p_run_id, p_trigger, v_now, NULL::bigint, v_now + p_ttl_us, NULL::bigint, false,
        NULL::integer, v_note, NULL::text, v_now;
END;
$$;

-- run_claim, one slot: the rules of fleetcron.stores.ledger.decide_claim, at the store time
-- read once at the start, with the definition check of a claim in the function (it was a
-- CTE around the call, planned by the server at every claim): one plain call per claim,
-- planned once per connection. A claim made for another definition than the registered
-- one answers 'conflict' with the registered fingerprint in r_stored_fingerprint, writing
-- nothing ('not_due' first, for a slot the clock has not reached). Otherwise as v3, whose
-- name stays for replicas of schema version 10 during a rolling upgrade.
CREATE OR REPLACE FUNCTION fleetcron_run_claim_v4(
    p_namespace text, p_job text, p_lease_name text, p_slot_us bigint, p_run_id text,
    p_exclusive boolean, p_max_attempts integer, p_trigger text, p_least_us bigint,
    p_holder text, p_ttl_us bigint, p_lost_error text, p_deadline_us bigint,
    p_missed_error text, p_progress boolean, p_pausable boolean, p_fingerprint text
) RETURNS TABLE (
    r_status text, r_job text, r_slot_us bigint, r_state text, r_attempt integer, r_fence bigint,
    r_holder text, r_run_id text, r_trigger text, r_started_us bigint,
    r_finished_us bigint, r_expires_us bigint, r_retry_at_us bigint,
    r_cancel_requested boolean, r_exit_code integer, r_error text, r_output text,
    r_now_us bigint, r_stored_fingerprint text
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_t       timestamptz := clock_timestamp();
    v_now     bigint := (extract(epoch FROM v_t) * 1000000)::bigint;
    v_paused  boolean;
    v_stored  text;
    v_state   text;
    v_run     fleetcron_run%ROWTYPE;
    v_has_run boolean;
    v_lease   fleetcron_lease%ROWTYPE;
    v_attempt integer := 1;
    v_note    text := NULL;
    v_fence   bigint;
    v_missed  boolean;
    v_expires bigint;
BEGIN
    -- 1. A slot the store's clock has not reached.
    IF p_slot_us > v_now THEN
        r_status := 'not_due';
        RETURN NEXT;
        RETURN;
    END IF;
    -- A claim made for another definition than the registered one writes nothing.
    SELECT j.paused, j.fingerprint INTO v_paused, v_stored FROM fleetcron_job AS j
     WHERE j.namespace = p_namespace AND j.job = p_job;
    IF p_fingerprint IS NOT NULL AND v_stored NOT IN ('', p_fingerprint) THEN
        r_status := 'conflict';
        r_now_us := v_now;
        r_stored_fingerprint := v_stored;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 2. A paused job's schedule (pausing only ever updates an existing row).
    IF coalesce(v_paused, false) AND p_pausable THEN
        r_status := 'paused';
        RETURN NEXT;
        RETURN;
    END IF;
    -- A final row other than failed never changes again, and a running attempt whose
    -- lease is valid at v_now cannot be claimed at v_now: refuse without locking (most
    -- claims a busy fleet sends are for slots another replica already has).
    SELECT r.state, r.expires_us INTO v_state, v_expires FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    IF (v_state IS NOT NULL AND v_state NOT IN ('running', 'failed', 'queued'))
       OR (v_state = 'running' AND v_expires > v_now) THEN
        r_status := 'taken';
        RETURN NEXT;
        RETURN;
    END IF;
    -- Lock the job lease row (made, expired, if missing; prune may remove it meanwhile).
    LOOP
        SELECT * INTO v_lease FROM fleetcron_lease AS l
         WHERE l.namespace = p_namespace AND l.name = p_lease_name
           FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO fleetcron_lease
            (namespace, name, holder, fence, acquired_at, expires_at, min_until)
        VALUES (p_namespace, p_lease_name, '', 0, 'epoch', 'epoch', 'epoch')
        ON CONFLICT (namespace, name) DO NOTHING;
    END LOOP;
    -- 3. The run row, locked.
    SELECT * INTO v_run FROM fleetcron_run AS r
     WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us
       FOR UPDATE;
    v_has_run := FOUND;
    IF v_has_run THEN
        IF v_run.state = 'running' AND v_run.expires_us IS NOT NULL
           AND v_run.expires_us <= v_now THEN
            IF v_run.attempt >= p_max_attempts THEN
                UPDATE fleetcron_run AS r
                   SET state = 'lost', finished_us = v_now, expires_us = NULL,
                       error = p_lost_error
                 WHERE r.namespace = p_namespace AND r.job = p_job
                   AND r.slot_us = p_slot_us;
                r_status := 'taken';
                RETURN NEXT;
                RETURN;
            END IF;
            v_attempt := v_run.attempt + 1;
            v_note := 'attempt ' || v_run.attempt || ' lost: ' || p_lost_error;
        ELSIF v_run.state = 'queued' THEN
            v_attempt := 1;  -- asked for by a trigger or a backfill
        ELSIF v_run.state = 'failed' AND v_run.retry_at_us IS NOT NULL
              AND v_run.retry_at_us <= v_now AND v_run.attempt < p_max_attempts THEN
            v_attempt := v_run.attempt + 1;
        ELSE
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    ELSIF p_deadline_us IS NOT NULL AND v_now > p_deadline_us THEN
        -- 4. No row and past the claim's deadline: recorded as missed, not run.
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'missed', 0, 0, '', '', p_trigger, NULL,
                v_now, NULL, NULL, false, NULL, p_missed_error, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        v_missed := FOUND;
        IF v_missed AND p_progress THEN
            INSERT INTO fleetcron_job AS j
                (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
            VALUES (p_namespace, p_job, false, '{}', '', p_slot_us, v_now)
            ON CONFLICT (namespace, job) DO UPDATE
               SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
        END IF;
        r_status := CASE WHEN v_missed THEN 'missed' ELSE 'taken' END;
        RETURN NEXT;
        RETURN;
    END IF;
    -- 5. The job lease.
    IF p_exclusive AND v_lease.expires_at > v_t THEN
        r_status := 'busy';
        RETURN NEXT;
        RETURN;
    END IF;
    v_fence := greatest(v_lease.fence + 1, v_now + fleetcron_timeline_offset_us());
    -- 6. The run row (a final row recorded since the read above wins: nothing changes).
    IF v_has_run THEN
        UPDATE fleetcron_run AS r
           SET state = 'running', attempt = v_attempt, fence = v_fence, holder = p_holder,
               run_id = p_run_id, trigger = p_trigger, started_us = v_now,
               finished_us = NULL, expires_us = v_now + p_ttl_us, retry_at_us = NULL,
               cancel_requested = false, exit_code = NULL, error = v_note, output = NULL
         WHERE r.namespace = p_namespace AND r.job = p_job AND r.slot_us = p_slot_us;
    ELSE
        INSERT INTO fleetcron_run
            (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
             started_us, finished_us, expires_us, retry_at_us, cancel_requested,
             exit_code, error, output)
        VALUES (p_namespace, p_job, p_slot_us, 'running', v_attempt, v_fence, p_holder,
                p_run_id, p_trigger, v_now, NULL, v_now + p_ttl_us, NULL, false,
                NULL, v_note, NULL)
        ON CONFLICT (namespace, job, slot_us) DO NOTHING;
        IF NOT FOUND THEN
            r_status := 'taken';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF p_exclusive THEN
        UPDATE fleetcron_lease AS l
           SET holder = p_holder, fence = v_fence, acquired_at = v_t,
               expires_at = v_t + p_ttl_us * interval '1 microsecond',
               min_until = v_t + p_least_us * interval '1 microsecond'
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    ELSE
        UPDATE fleetcron_lease AS l SET fence = v_fence
         WHERE l.namespace = p_namespace AND l.name = p_lease_name;
    END IF;
    -- 7. The job row and its high-water mark (schedule progress only: not manual runs).
    INSERT INTO fleetcron_job AS j
        (namespace, job, paused, definition, fingerprint, high_water_us, updated_us)
    VALUES (p_namespace, p_job, false, '{}', '',
            CASE WHEN p_progress THEN p_slot_us END, v_now)
    ON CONFLICT (namespace, job) DO UPDATE
       SET high_water_us = greatest(j.high_water_us, excluded.high_water_us);
    RETURN QUERY SELECT 'claimed'::text, p_job, p_slot_us, 'running'::text, v_attempt, v_fence, p_holder,
        p_run_id, p_trigger, v_now, NULL::bigint, v_now + p_ttl_us, NULL::bigint, false,
        NULL::integer, v_note, NULL::text, v_now, NULL::text;
END;
$$;

-- run_claim, a batch (migration 14): the answer of fleetcron_run_claim_v4 for each item of p_claims, a
-- JSON array of [job, lease_name, slot_us, run_id, exclusive, max_attempts, trigger,
-- least_us, deadline_us, progress, pausable, fingerprint], behind its position in the
-- array (r_ord, from 1).
CREATE OR REPLACE FUNCTION fleetcron_run_claim_many_v1(
    p_namespace text, p_holder text, p_ttl_us bigint, p_lost_error text,
    p_missed_error text, p_claims jsonb
) RETURNS TABLE (
    r_ord integer, r_status text, r_job text, r_slot_us bigint, r_state text,
    r_attempt integer, r_fence bigint, r_holder text, r_run_id text, r_trigger text,
    r_started_us bigint, r_finished_us bigint, r_expires_us bigint, r_retry_at_us bigint,
    r_cancel_requested boolean, r_exit_code integer, r_error text, r_output text,
    r_now_us bigint, r_stored_fingerprint text
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_claim jsonb;
    v_ord   bigint;
BEGIN
    FOR v_claim, v_ord IN SELECT * FROM jsonb_array_elements(p_claims) WITH ORDINALITY LOOP
        RETURN QUERY SELECT v_ord::integer, c.* FROM fleetcron_run_claim_v4(
            p_namespace, v_claim->>0, v_claim->>1, (v_claim->>2)::bigint, v_claim->>3,
            (v_claim->>4)::boolean, (v_claim->>5)::integer, v_claim->>6,
            (v_claim->>7)::bigint, p_holder, p_ttl_us, p_lost_error, (v_claim->>8)::bigint,
            p_missed_error, (v_claim->>9)::boolean, (v_claim->>10)::boolean,
            v_claim->>11) AS c;
    END LOOP;
END;
$$;

-- run_finish, a batch: whether fleetcron_run_finish took each outcome of p_finishes, a
-- JSON array of [job, lease_name, slot_us, fence, state, exit_code, error, output,
-- retry_after_us], behind its position in the array (r_ord, from 1).
CREATE OR REPLACE FUNCTION fleetcron_run_finish_many_v1(p_namespace text, p_finishes jsonb)
RETURNS TABLE (r_ord integer, r_accepted boolean) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_finish jsonb;
    v_ord    bigint;
BEGIN
    FOR v_finish, v_ord IN SELECT * FROM jsonb_array_elements(p_finishes) WITH ORDINALITY
    LOOP
        r_ord := v_ord;
        r_accepted := fleetcron_run_finish(
            p_namespace, v_finish->>0, v_finish->>1, (v_finish->>2)::bigint,
            (v_finish->>3)::bigint, v_finish->>4, (v_finish->>5)::integer, v_finish->>6,
            v_finish->>7, (v_finish->>8)::bigint);
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Replica heartbeats (docs/design/replicas.md): one row per running scheduler replica,
-- upserted every beat, deleted when the replica stops cleanly or, once expired for longer
-- than the retention, by another replica's beat. Times are microseconds since the epoch
-- on the server's clock (clock_timestamp()).
CREATE TABLE IF NOT EXISTS fleetcron_replica (
    namespace        text   NOT NULL,
    replica_id       text   NOT NULL,
    host             text   NOT NULL,
    pid              bigint NOT NULL,
    version          text   NOT NULL,
    mode             text   NOT NULL,
    jobs_fingerprint text   NOT NULL,
    started_us       bigint NOT NULL,
    last_seen_us     bigint NOT NULL,
    expires_us       bigint NOT NULL,
    PRIMARY KEY (namespace, replica_id)
);

-- replica_list and the beat's prune: a namespace's rows by expiry.
CREATE INDEX IF NOT EXISTS fleetcron_replica_expiry
    ON fleetcron_replica (namespace, expires_us);

-- The work queue (docs/design/queue.md): one row per item of a named queue of a namespace,
-- kept after it is done or dead until queue_prune deletes it (its dedupe key stays taken
-- until then). Ids come from an identity: increasing, never given twice. Times are
-- microseconds since the epoch on the server's clock (clock_timestamp()).
CREATE TABLE IF NOT EXISTS fleetcron_queue_item (
    namespace    text    NOT NULL,
    queue        text    NOT NULL,
    id           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dedupe_key   text,
    payload      text    NOT NULL,
    state        text    NOT NULL,
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    fence        bigint  NOT NULL,
    holder       text,
    available_us bigint  NOT NULL,
    created_us   bigint  NOT NULL,
    finished_us  bigint,
    error        text,
    live         boolean GENERATED ALWAYS AS (state IN ('ready', 'claimed')) STORED
);

-- queue_claim: `live` (ready or claimed) after the queue, so the claimable items of a
-- queue are one range in claim order and a claim never walks past finished ones; the
-- whole index serves queue_list and queue_stats. No other index leads with the queue's
-- columns for every item, so the claim's plan does not hang on statistics (migration 10).
CREATE INDEX IF NOT EXISTS fleetcron_queue_item_live
    ON fleetcron_queue_item (namespace, queue, live, available_us, id);

-- queue_put: a dedupe key is taken once per queue (NULL, no key, as often as wanted).
CREATE UNIQUE INDEX IF NOT EXISTS fleetcron_queue_item_key
    ON fleetcron_queue_item (namespace, queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL;

-- queue_prune: a namespace's finished items, oldest finish first.
CREATE INDEX IF NOT EXISTS fleetcron_queue_item_finished
    ON fleetcron_queue_item (namespace, finished_us, id)
    WHERE state IN ('done', 'dead');

-- The hot queue operations are functions so that each connection plans their statements
-- once (PL/pgSQL keeps a statement's plan for the session) without prepared statements,
-- which a transaction-pooling PgBouncer cannot carry: planning the claim took 1.6 ms of
-- its 5 ms for 100 items. Item rows are (id, dedupe_key, payload, state, attempts,
-- max_attempts, fence, holder, available_us, created_us, finished_us, error, now_us); a
-- batch comes as one JSON array. Each function is one statement at one reading of
-- clock_timestamp().

-- queue_put: items are [payload, dedupe_key, delay_us, max_attempts]. Each item gets a
-- new id from the identity's sequence, paired by rank (the smallest to the first item), so
-- ids increase in input order whatever order the rows go in. They go in by dedupe key: an
-- item whose key the queue has is skipped, and one whose key a concurrent call is putting
-- waits for that call, so every call waits for keys in one order and two never deadlock.
CREATE OR REPLACE FUNCTION fleetcron_queue_put(
    p_namespace text, p_queue text, p_items jsonb
) RETURNS TABLE (r_id bigint, r_dedupe_key text) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
    k AS (SELECT e.item, e.ord
            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(item, ord)),
    ids AS (
        SELECT row_number() OVER (ORDER BY s.id) AS ord, s.id
          FROM (SELECT nextval(seq.name) AS id
                  FROM k, (SELECT pg_get_serial_sequence('fleetcron_queue_item', 'id')
                                  AS name) AS seq) AS s
    ),
    added AS (
        INSERT INTO fleetcron_queue_item AS i
            (id, namespace, queue, dedupe_key, payload, state, attempts, max_attempts,
             fence, holder, available_us, created_us)
        OVERRIDING SYSTEM VALUE
        SELECT ids.id, p_namespace, p_queue, k.item->>1, k.item->>0, 'ready', 0,
               (k.item->>3)::integer, 0, NULL, now.us + (k.item->>2)::bigint, now.us
          FROM k JOIN ids ON ids.ord = k.ord CROSS JOIN now
         ORDER BY (k.item->>1) COLLATE "C", k.ord
        ON CONFLICT (namespace, queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING i.id, i.dedupe_key
    )
    SELECT added.id, added.dedupe_key FROM added;
END;
$$;

-- queue_claim: picked: up to p_limit claimable items (`live` and due), oldest
-- available_us first, then lowest id, locked; rows another claim has locked are skipped,
-- so claimers never wait on each other and never share an item. Each picked item whose
-- expired claim used up its deliveries dies; the others are delivered. Returns the
-- delivered rows in claim order.
CREATE OR REPLACE FUNCTION fleetcron_queue_claim(
    p_namespace text, p_queue text, p_holder text, p_limit integer, p_visibility_us bigint,
    p_expired_head text, p_expired_tail text
) RETURNS TABLE (
    r_id bigint, r_dedupe_key text, r_payload text, r_state text, r_attempts integer,
    r_max_attempts integer, r_fence bigint, r_holder text, r_available_us bigint,
    r_created_us bigint, r_finished_us bigint, r_error text, r_now_us bigint
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us,
                        fleetcron_timeline_offset_us() AS fence_offset_us),
    picked AS (
        SELECT i.id, i.available_us AS was,
               i.state = 'claimed' AND i.attempts >= i.max_attempts AS dies
          FROM fleetcron_queue_item AS i
         WHERE i.namespace = p_namespace AND i.queue = p_queue AND i.live
           AND i.available_us <= (SELECT us FROM now)
         ORDER BY i.available_us, i.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ),
    killed AS (
        UPDATE fleetcron_queue_item AS i
           SET state = 'dead', finished_us = now.us,
               error = p_expired_head || i.attempts || p_expired_tail
          FROM picked, now
         WHERE i.id = picked.id AND picked.dies
    ),
    delivered AS (
        UPDATE fleetcron_queue_item AS i
           SET state = 'claimed', attempts = i.attempts + 1,
               fence = greatest(i.fence + 1, now.us + now.fence_offset_us), holder = p_holder,
               available_us = now.us + p_visibility_us
          FROM picked, now
         WHERE i.id = picked.id AND NOT picked.dies
        RETURNING picked.was, i.id, i.dedupe_key, i.payload, i.state, i.attempts,
                  i.max_attempts, i.fence, i.holder, i.available_us, i.created_us,
                  i.finished_us, i.error, now.us
    )
    SELECT d.id, d.dedupe_key, d.payload, d.state, d.attempts, d.max_attempts, d.fence,
           d.holder, d.available_us, d.created_us, d.finished_us, d.error, d.us
      FROM delivered AS d
     ORDER BY d.was, d.id;
END;
$$;

-- queue_extend: claims are [item_id, fence]; returns (id, fence, available_us) of each
-- held item extended. A row a concurrent claim is taking is waited for and checked again
-- as it is then. The statements that name items by id find them by primary key alone: the
-- ids are also given as `id = ANY (array)`, an index condition (joined to the JSON rows
-- alone, a small table's items are read whole, once per row), and the queue is compared
-- with IS NOT DISTINCT FROM, which no index serves (docs/design/queue.md).
CREATE OR REPLACE FUNCTION fleetcron_queue_extend(
    p_namespace text, p_queue text, p_claims jsonb, p_visibility_us bigint
) RETURNS TABLE (r_id bigint, r_fence bigint, r_available_us bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
    c AS (SELECT (e->>0)::bigint AS id, (e->>1)::bigint AS fence
            FROM jsonb_array_elements(p_claims) AS e),
    extended AS (
        UPDATE fleetcron_queue_item AS i
           SET available_us = now.us + p_visibility_us
          FROM c, now
         WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) AND i.id = c.id AND i.fence = c.fence
           AND (i.namespace, i.queue) IS NOT DISTINCT FROM (p_namespace, p_queue)
           AND i.state = 'claimed' AND i.available_us > now.us
        RETURNING i.id, i.fence, i.available_us
    )
    SELECT x.id, x.fence, x.available_us FROM extended AS x;
END;
$$;

-- queue_ack: claims are [item_id, fence]; each held item is done. Returns (id, fence) of
-- each.
CREATE OR REPLACE FUNCTION fleetcron_queue_ack(
    p_namespace text, p_queue text, p_claims jsonb
) RETURNS TABLE (r_id bigint, r_fence bigint) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
    c AS (SELECT (e->>0)::bigint AS id, (e->>1)::bigint AS fence
            FROM jsonb_array_elements(p_claims) AS e),
    acked AS (
        UPDATE fleetcron_queue_item AS i
           SET state = 'done', finished_us = now.us
          FROM c, now
         WHERE i.id = ANY (ARRAY(SELECT c.id FROM c)) AND i.id = c.id AND i.fence = c.fence
           AND (i.namespace, i.queue) IS NOT DISTINCT FROM (p_namespace, p_queue)
           AND i.state = 'claimed' AND i.available_us > now.us
        RETURNING i.id, i.fence
    )
    SELECT a.id, a.fence FROM acked AS a;
END;
$$;

-- queue_nack: nacks are [item_id, fence, error, retry_in_us]: a held item with no
-- delivery left dies (holder and claim expiry kept), another is ready again after its
-- backoff, without holder. Returns (id, fence, state) of each.
CREATE OR REPLACE FUNCTION fleetcron_queue_nack(
    p_namespace text, p_queue text, p_nacks jsonb
) RETURNS TABLE (r_id bigint, r_fence bigint, r_state text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
    n AS (SELECT (e->>0)::bigint AS id, (e->>1)::bigint AS fence, e->>2 AS error,
                 (e->>3)::bigint AS retry_in_us
            FROM jsonb_array_elements(p_nacks) AS e),
    given AS (
        UPDATE fleetcron_queue_item AS i
           SET state = CASE WHEN i.attempts >= i.max_attempts THEN 'dead' ELSE 'ready' END,
               finished_us = CASE WHEN i.attempts >= i.max_attempts THEN now.us END,
               holder = CASE WHEN i.attempts >= i.max_attempts THEN i.holder END,
               available_us = CASE WHEN i.attempts >= i.max_attempts THEN i.available_us
                                   ELSE now.us + n.retry_in_us END,
               error = n.error
          FROM n, now
         WHERE i.id = ANY (ARRAY(SELECT n.id FROM n)) AND i.id = n.id AND i.fence = n.fence
           AND (i.namespace, i.queue) IS NOT DISTINCT FROM (p_namespace, p_queue)
           AND i.state = 'claimed' AND i.available_us > now.us
        RETURNING i.id, i.fence, i.state
    )
    SELECT g.id, g.fence, g.state FROM given AS g;
END;
$$;

-- Checkpoints (ctx.checkpoint, fleetcron.checkpoint): one row per (namespace, name), a
-- job's high-water mark as last set — `value`, a JSON text kept as given — by the run
-- whose fence was `fence`, at updated_us (microseconds since the epoch on the server's
-- clock, clock_timestamp()). A row moves only under a fence at least its own, so a stale
-- run cannot move it back. Like a lease row, it is never deleted by fleetcron.
CREATE TABLE IF NOT EXISTS fleetcron_checkpoint (
    namespace  text   NOT NULL,
    name       text   NOT NULL,
    value      text   NOT NULL,
    fence      bigint NOT NULL,
    updated_us bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
