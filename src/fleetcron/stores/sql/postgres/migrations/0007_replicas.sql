-- Replica heartbeats (docs/design/replicas.md): one row per running scheduler replica,
-- upserted every beat, deleted when the replica stops cleanly or, once expired for longer
-- than the retention, by another replica's beat. Times are microseconds since the epoch
-- on the server's clock (clock_timestamp()).
CREATE TABLE IF NOT EXISTS fleetcron_replica (
    namespace        text   NOT NULL,
    replica_id       text   NOT NULL,
    host             text   NOT NULL,
    pid              bigint NOT NULL,
    version          text   NOT NULL,
    mode             text   NOT NULL,
    jobs_fingerprint text   NOT NULL,
    started_us       bigint NOT NULL,
    last_seen_us     bigint NOT NULL,
    expires_us       bigint NOT NULL,
    PRIMARY KEY (namespace, replica_id)
);

-- replica_list and the beat's prune: a namespace's rows by expiry.
CREATE INDEX IF NOT EXISTS fleetcron_replica_expiry
    ON fleetcron_replica (namespace, expires_us);
