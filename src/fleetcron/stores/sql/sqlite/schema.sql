-- The sqlite schema as the migrations leave it, in one place to read. It is not applied:
-- `fleetcron migrate` applies migrations/ in order; tests/contract/test_schema.py checks
-- that this file builds the same tables, indexes and functions as they do.

-- Lease rows: one per (namespace, name), never deleted except by prune.
-- Times are integer microseconds since the epoch, read from the host clock inside the
-- write transaction (every process on the host shares that one clock).
CREATE TABLE IF NOT EXISTS fleetcron_lease (
    namespace    TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    holder       TEXT    NOT NULL,
    fence        INTEGER NOT NULL,
    acquired_us  INTEGER NOT NULL,
    expires_us   INTEGER NOT NULL,
    min_until_us INTEGER NOT NULL,
    -- The holder's process on this host (fleetcron/local_holder.py), read only while
    -- holder_fence is the row's fence: its boot and namespaces, pid, start time (clock
    -- ticks after boot) and the process group that must be gone with it (0: one being
    -- started). A holder gone from this host is taken over at once.
    holder_fence INTEGER,
    holder_scope TEXT,
    holder_pid   INTEGER,
    holder_start INTEGER,
    holder_group INTEGER,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;

-- The run ledger: one row per (namespace, job, slot). Times are µs since the epoch.
CREATE TABLE IF NOT EXISTS fleetcron_run (
    namespace        TEXT    NOT NULL,
    job              TEXT    NOT NULL,
    slot_us          INTEGER NOT NULL,
    state            TEXT    NOT NULL,
    attempt          INTEGER NOT NULL,
    fence            INTEGER NOT NULL,
    holder           TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    trigger          TEXT    NOT NULL,
    started_us       INTEGER,
    finished_us      INTEGER,
    expires_us       INTEGER,
    retry_at_us      INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    exit_code        INTEGER,
    error            TEXT,
    output           TEXT,
    PRIMARY KEY (namespace, job, slot_us)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS fleetcron_run_by_slot ON fleetcron_run (namespace, slot_us);

-- Jobs as the fleet knows them: definition, pause flag, progress.
CREATE TABLE IF NOT EXISTS fleetcron_job (
    namespace       TEXT    NOT NULL,
    job             TEXT    NOT NULL,
    paused          INTEGER NOT NULL DEFAULT 0,
    definition      TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    high_water_us   INTEGER,
    last_success_us INTEGER,
    last_failure_us INTEGER,
    updated_us      INTEGER NOT NULL,
    PRIMARY KEY (namespace, job)
) WITHOUT ROWID;

-- Finding the rows to claim again (queued, expired, due for a retry) without a scan.
CREATE INDEX IF NOT EXISTS fleetcron_run_open
    ON fleetcron_run (namespace, slot_us) WHERE state IN ('queued', 'running', 'failed');

-- The runs in progress, for a status read that needs nothing else of most jobs' ledger
-- (run_running; migration 15).
CREATE INDEX IF NOT EXISTS fleetcron_run_running
    ON fleetcron_run (namespace, job, slot_us) WHERE state = 'running';

-- Replica heartbeats (docs/design/replicas.md): one row per running scheduler replica,
-- upserted every beat, deleted when the replica stops cleanly or, once expired for longer
-- than the retention, by another replica's beat. Times are µs since the epoch.
CREATE TABLE IF NOT EXISTS fleetcron_replica (
    namespace        TEXT    NOT NULL,
    replica_id       TEXT    NOT NULL,
    host             TEXT    NOT NULL,
    pid              INTEGER NOT NULL,
    version          TEXT    NOT NULL,
    mode             TEXT    NOT NULL,
    jobs_fingerprint TEXT    NOT NULL,
    started_us       INTEGER NOT NULL,
    last_seen_us     INTEGER NOT NULL,
    expires_us       INTEGER NOT NULL,
    PRIMARY KEY (namespace, replica_id)
) WITHOUT ROWID;

-- replica_list and the beat's prune: a namespace's rows by expiry.
CREATE INDEX IF NOT EXISTS fleetcron_replica_expiry
    ON fleetcron_replica (namespace, expires_us);

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

-- Checkpoints (ctx.checkpoint, fleetcron.checkpoint): one row per (namespace, name), a
-- job's high-water mark as last set — `value`, a JSON text kept as given — by the run
-- whose fence was `fence`, at updated_us (µs since the epoch). A row moves only under a
-- fence at least its own, so a stale run cannot move it back. Like a lease row, it is
-- never deleted by fleetcron. A rowid table, unlike the lease table: a value may be
-- 64 KiB, and a WITHOUT ROWID table keeps whole rows in its key's b-tree, which suits
-- rows far smaller than a page.
CREATE TABLE IF NOT EXISTS fleetcron_checkpoint (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
