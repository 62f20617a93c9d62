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
