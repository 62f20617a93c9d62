-- The claim's plan no longer depends on the planner's statistics. Before, a queue the
-- statistics did not know yet (a new queue, or one flooded since the last ANALYZE) was
-- estimated at one row, and the planner found the dedupe index — (namespace, queue)
-- leading, like the partial claim index — as cheap: it read the whole queue through it and
-- sorted it, 9 ms per claim at 10,000 items instead of 0.2 ms. Now:
-- - `live` (ready or claimed, kept by the server) leads the claim index after the queue,
--   so the claim's `live` is an index condition, the index gives claim order, and the
--   claim never walks past finished items;
-- - the dedupe index holds only items with a key (queue_put's ON CONFLICT names that
--   predicate), so it cannot serve a query that does not ask for a key;
-- - the claim index, which holds every item, serves queue_list and queue_stats.
-- Schema version 9's queue_put needs the dedupe index whole; version 9 was never part of
-- a release.
ALTER TABLE fleetcron_queue_item
    ADD COLUMN IF NOT EXISTS live boolean
        GENERATED ALWAYS AS (state IN ('ready', 'claimed')) STORED;

DROP INDEX IF EXISTS fleetcron_queue_item_claim;
DROP INDEX IF EXISTS fleetcron_queue_item_dedupe;

CREATE INDEX IF NOT EXISTS fleetcron_queue_item_live
    ON fleetcron_queue_item (namespace, queue, live, available_us, id);

CREATE UNIQUE INDEX IF NOT EXISTS fleetcron_queue_item_key
    ON fleetcron_queue_item (namespace, queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
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
    WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us),
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
               fence = greatest(i.fence + 1, now.us), holder = p_holder,
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
