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
