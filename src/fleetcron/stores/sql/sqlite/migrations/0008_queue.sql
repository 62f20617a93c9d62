-- The work queue (docs/design/queue.md): one row per item of a named queue of a namespace,
-- kept after it is done or dead until queue_prune deletes it (its dedupe key stays taken
-- until then). AUTOINCREMENT: an id is never given twice, even once the newest item has
-- been pruned (a plain INTEGER PRIMARY KEY would hand its id out again). Times are µs
-- since the epoch.
CREATE TABLE IF NOT EXISTS fleetcron_queue_item (
    namespace    TEXT    NOT NULL,
    queue        TEXT    NOT NULL,
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    dedupe_key   TEXT,
    payload      TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    fence        INTEGER NOT NULL,
    holder       TEXT,
    available_us INTEGER NOT NULL,
    created_us   INTEGER NOT NULL,
    finished_us  INTEGER,
    error        TEXT
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
