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
