-- Nothing changes in this dialect: fleetcron_run_open (namespace, state, slot_us) already
-- finds the running rows alone. Version 15 gave PostgreSQL and SQLite an index of them.
-- Every dialect keeps one version sequence.
SELECT 1;
