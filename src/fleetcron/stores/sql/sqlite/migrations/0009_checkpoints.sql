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
