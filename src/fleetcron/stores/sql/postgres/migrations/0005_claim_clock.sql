-- The slot claim reads the server's clock itself and nothing of the session: the batch
-- clock the runner used to keep in a session setting could reach another client's
-- transaction behind PgBouncer in transaction pooling mode. The function that does so is
-- created by migration 0006 (fleetcron_run_claim_v3); this step, which created an
-- intermediate version never part of a release, is kept so the version numbers stay.
SELECT 1;
