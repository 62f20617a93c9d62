-- The mysql schema as the migrations leave it, in one place to read. It is not applied:
-- `fleetcron migrate` applies migrations/ in order; tests/contract/test_schema.py checks
-- that this file builds the same tables, indexes and functions as they do.

-- Lease rows: one per (namespace, name), never deleted except by prune.
-- Names are VARBINARY (UTF-8 bytes): exact comparison, no case folding and no PAD SPACE.
-- DATETIME(6): a lower precision would round silently and make an extend in the same
-- second look like a lost lease.
CREATE TABLE IF NOT EXISTS fleetcron_lease (
    namespace   VARBINARY(256) NOT NULL,
    name        VARBINARY(800) NOT NULL,
    holder      VARCHAR(160) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fence       BIGINT NOT NULL,
    acquired_at DATETIME(6) NOT NULL,
    expires_at  DATETIME(6) NOT NULL,
    min_until   DATETIME(6) NOT NULL,
    PRIMARY KEY (namespace, name)
) ENGINE=InnoDB;

-- The run ledger (docs/design/ledger.md): one row per slot, one row per job.
-- Times are microseconds since the epoch on the server's clock (UTC_TIMESTAMP(6)).
-- Namespaces and job names are VARBINARY (UTF-8 bytes), as in the lease table.
-- Lock order of every ledger block, so concurrent ones never deadlock:
-- job row -> job lease row -> run row. Every insert of a run row holds its job row.
CREATE TABLE IF NOT EXISTS fleetcron_run (
    namespace        VARBINARY(256) NOT NULL,
    job              VARBINARY(800) NOT NULL,
    slot_us          BIGINT NOT NULL,
    state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempt          INT NOT NULL,
    fence            BIGINT NOT NULL,
    holder           VARCHAR(160) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    run_id           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `trigger`        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    started_us       BIGINT NULL,
    finished_us      BIGINT NULL,
    expires_us       BIGINT NULL,
    retry_at_us      BIGINT NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    exit_code        INT NULL,
    error            MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    output           TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (namespace, job, slot_us),
    KEY fleetcron_run_newest (namespace, slot_us, job)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS fleetcron_job (
    namespace       VARBINARY(256) NOT NULL,
    job             VARBINARY(800) NOT NULL,
    paused          BOOLEAN NOT NULL DEFAULT FALSE,
    definition      MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    fingerprint     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    high_water_us   BIGINT NULL,
    last_success_us BIGINT NULL,
    last_failure_us BIGINT NULL,
    updated_us      BIGINT NOT NULL,
    PRIMARY KEY (namespace, job)
) ENGINE=InnoDB;

-- Finding the rows to claim again (queued, expired, due for a retry) without a scan.
CREATE INDEX fleetcron_run_open ON fleetcron_run (namespace, state, slot_us);

-- Replica heartbeats (docs/design/replicas.md): one row per running scheduler replica,
-- upserted every beat, deleted when the replica stops cleanly or, once expired for longer
-- than the retention, by another replica's beat. Times are microseconds since the epoch
-- on the server's clock (UTC_TIMESTAMP(6)). Namespaces and replica ids are VARBINARY
-- (UTF-8 bytes), as in the other tables.
CREATE TABLE IF NOT EXISTS fleetcron_replica (
    namespace        VARBINARY(256) NOT NULL,
    replica_id       VARBINARY(512) NOT NULL,
    host             VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    pid              BIGINT NOT NULL,
    version          VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    mode             VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    jobs_fingerprint VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    started_us       BIGINT NOT NULL,
    last_seen_us     BIGINT NOT NULL,
    expires_us       BIGINT NOT NULL,
    PRIMARY KEY (namespace, replica_id),
    KEY fleetcron_replica_expiry (namespace, expires_us)
) ENGINE=InnoDB;

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

-- Checkpoints (ctx.checkpoint, fleetcron.checkpoint): one row per (namespace, name), a
-- job's high-water mark as last set — `value`, a JSON text kept byte for byte — by the
-- run whose fence was `fence`, at updated_us (microseconds since the epoch on the server's
-- clock, UTC_TIMESTAMP(6)). A row moves only under a fence at least its own, so a stale
-- run cannot move it back. Like a lease row, it is never deleted by fleetcron.
-- Namespaces and names are VARBINARY (UTF-8 bytes), sized as in the lease table: exact
-- comparison, no case folding and no PAD SPACE; the key is 1056 bytes, within InnoDB's
-- 3072. MEDIUMTEXT: a value may be 64 KiB, one byte more than TEXT holds; utf8mb4_bin
-- keeps every character (4-byte ones included) and compares nothing by locale.
CREATE TABLE IF NOT EXISTS fleetcron_checkpoint (
    namespace  VARBINARY(256) NOT NULL,
    name       VARBINARY(800) NOT NULL,
    value      MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    fence      BIGINT NOT NULL,
    updated_us BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
) ENGINE=InnoDB;
