-- Checkpoints (ctx.checkpoint, fleetcron.checkpoint): one row per (namespace, name), a
-- job's high-water mark as last set — `value`, a JSON text kept as given — by the run
-- whose fence was `fence`, at updated_us (microseconds since the epoch on the server's
-- clock, clock_timestamp()). A row moves only under a fence at least its own, so a stale
-- run cannot move it back. Like a lease row, it is never deleted by fleetcron.
CREATE TABLE IF NOT EXISTS fleetcron_checkpoint (
    namespace  text   NOT NULL,
    name       text   NOT NULL,
    value      text   NOT NULL,
    fence      bigint NOT NULL,
    updated_us bigint NOT NULL,
    PRIMARY KEY (namespace, name)
);
