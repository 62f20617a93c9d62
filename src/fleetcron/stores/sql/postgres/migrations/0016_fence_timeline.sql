-- Fences across a promotion: every fence the clock enters also holds the WAL timeline, so
-- a promoted standby (a new timeline) never issues a fence at or below one the old primary
-- issued, even when writes were lost with it (asynchronous replication) and its clock is
-- behind (docs/ha.md). The functions are those of migrations 11, 12 and 10 with the
-- offset added where the clock enters a fence; on a server that was never promoted
-- (timeline 1) the offset is 0 and every fence is what it was.
-- split: dollar (function bodies between $$ … $$ are one statement)

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
