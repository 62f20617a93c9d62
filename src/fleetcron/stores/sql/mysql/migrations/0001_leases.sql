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
