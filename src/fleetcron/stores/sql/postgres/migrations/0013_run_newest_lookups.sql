-- fleetcron_run_newest held its job column in the "C" collation, so a lookup of one slot
-- by its primary key (namespace, job, slot_us — the default collation) could use only
-- the first two columns of it. Once the table had statistics, the planner took that index
-- for the lookups of the slot claim, its outcome and the settled read: every lookup read
-- every job's row of the slot (1,000 rows at 1,000 jobs due each second, 10,000 in a
-- burst of 10,000) instead of one. With the job in the default collation every index that
-- holds the three columns answers such a lookup with one row, whichever the planner takes.
-- Lists ordered by (slot_us DESC, job COLLATE "C") use the index for the slot order and
-- sort the few rows of one slot. Built under the name it replaces, then renamed.
CREATE INDEX IF NOT EXISTS fleetcron_run_newest_v2
    ON fleetcron_run (namespace, slot_us DESC, job);
DROP INDEX IF EXISTS fleetcron_run_newest;
ALTER INDEX fleetcron_run_newest_v2 RENAME TO fleetcron_run_newest;
