-- The work queue (docs/design/queue.md): one row per item of a named queue of a namespace,
-- kept after it is done or dead until queue_prune deletes it (its dedupe key stays taken
-- until then). Ids come from AUTO_INCREMENT: increasing, never given twice (the counter
-- survives a restart). Times are microseconds since the epoch on the server's clock
-- (UTC_TIMESTAMP(6)). Namespaces, queue names and dedupe keys are VARBINARY (UTF-8 bytes),
-- as in the other tables; the unique key on the three is 1856 bytes, within InnoDB's 3072.
-- claimable_us is available_us while the item is ready or claimed, NULL once it is done
-- or dead: MySQL has no partial index, and an index on (state, available_us) would make
-- the claim sort the rows of both states, locking every claimable row of the queue.
CREATE TABLE IF NOT EXISTS fleetcron_queue_item (
    namespace    VARBINARY(256) NOT NULL,
    queue        VARBINARY(800) NOT NULL,
    id           BIGINT NOT NULL AUTO_INCREMENT,
    dedupe_key   VARBINARY(800) NULL,
    payload      MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts     INT NOT NULL,
    max_attempts INT NOT NULL,
    fence        BIGINT NOT NULL,
    holder       VARCHAR(160) CHARACTER SET ascii COLLATE ascii_bin NULL,
    available_us BIGINT NOT NULL,
    created_us   BIGINT NOT NULL,
    finished_us  BIGINT NULL,
    error        MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    claimable_us BIGINT AS (IF(state IN ('ready', 'claimed'), available_us, NULL)) STORED,
    PRIMARY KEY (id),
    -- queue_put: a dedupe key is taken once per queue (NULL, no key, as often as wanted);
    -- its (namespace, queue) prefix also serves queue_get, queue_list and queue_stats.
    UNIQUE KEY fleetcron_queue_item_dedupe (namespace, queue, dedupe_key),
    -- queue_claim: the claimable items of a queue in claim order (NULLs, the finished
    -- items, sort first and are outside the range the claim reads).
    KEY fleetcron_queue_item_claim (namespace, queue, claimable_us, id),
    -- queue_prune: a namespace's finished items, oldest finish first.
    KEY fleetcron_queue_item_finished (namespace, finished_us, id)
) ENGINE=InnoDB;
