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
    error        text
);

-- queue_put: a dedupe key is taken once per queue (NULL, no key, as often as wanted); its
-- (namespace, queue) prefix also serves queue_get, queue_list and queue_stats.
CREATE UNIQUE INDEX IF NOT EXISTS fleetcron_queue_item_dedupe
    ON fleetcron_queue_item (namespace, queue, dedupe_key);

-- queue_claim: the claimable items of a queue in claim order; finished ones are left out,
-- so a claim never walks past them.
CREATE INDEX IF NOT EXISTS fleetcron_queue_item_claim
    ON fleetcron_queue_item (namespace, queue, available_us, id)
    WHERE state IN ('ready', 'claimed');

-- queue_prune: a namespace's finished items, oldest finish first.
CREATE INDEX IF NOT EXISTS fleetcron_queue_item_finished
    ON fleetcron_queue_item (namespace, finished_us, id)
    WHERE state IN ('done', 'dead');
