-- The claims and the outcomes of a batch as one statement each: a replica sends one call
-- with the batch's items in a JSON array instead of one call per item (and a BEGIN and a
-- COMMIT around them) in a pipeline. Each item is decided by the function a single claim or
-- outcome uses, so the rules are those of fleetcron_run_claim_v4 and fleetcron_run_finish,
-- which replicas of schema version 13 still call one by one during a rolling upgrade. The
-- statement is one transaction: its items take their row locks in the order of the array,
-- which the replica sorts by job (docs/design/ledger.md, run_claim).
-- split: dollar (function bodies between $$ … $$ are one statement)

-- run_claim, a batch: the answer of fleetcron_run_claim_v4 for each item of p_claims, a
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
