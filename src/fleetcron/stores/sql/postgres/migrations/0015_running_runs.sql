-- The runs in progress without the rest of the ledger: a paged status read judges most jobs
-- from their row and needs of the ledger only the running rows (run_running), and the
-- history of the jobs it shows. fleetcron_run_open holds the running rows too, but also
-- every failed row, kept for the retention (30 days by default): thousands per failing
-- job.
CREATE INDEX IF NOT EXISTS fleetcron_run_running
    ON fleetcron_run (namespace, job, slot_us) WHERE state = 'running';
