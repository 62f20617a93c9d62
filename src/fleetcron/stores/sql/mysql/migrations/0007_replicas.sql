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
