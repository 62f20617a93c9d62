-- Nothing changes in this dialect. Version 13 gave PostgreSQL's fleetcron_run_newest its
-- job column in the default collation, so primary key lookups of a slot read one row
-- whichever index the planner takes. Every dialect keeps one version sequence.
SELECT 1;
