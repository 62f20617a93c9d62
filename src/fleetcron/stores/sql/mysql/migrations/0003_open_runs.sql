-- Finding the rows to claim again (queued, expired, due for a retry) without a scan.
CREATE INDEX fleetcron_run_open ON fleetcron_run (namespace, state, slot_us);
