-- Finding the rows to claim again (queued, expired, due for a retry) without a scan.
CREATE INDEX IF NOT EXISTS fleetcron_run_open
    ON fleetcron_run (namespace, slot_us) WHERE state IN ('queued', 'running', 'failed');
