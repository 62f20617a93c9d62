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
