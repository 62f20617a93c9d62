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
