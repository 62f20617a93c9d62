-- A lease's acquire and release as functions: the statement a replica sends per lock cycle
-- is a plain call, whose statement PostgreSQL plans once per connection, instead of a CTE
-- statement it parsed and planned at every call (about a quarter of a lock cycle's time
-- on the server). The rules are those of the statements they replace, which replicas of
-- schema version 11 still send during a rolling upgrade: both work on the same rows under
-- the same row locks.
-- split: dollar (function bodies between $$ … $$ are one statement)

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
    VALUES (p_namespace, p_name, p_holder, (extract(epoch FROM v_t) * 1000000)::bigint, v_t,
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
