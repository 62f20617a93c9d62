-- Who holds a lease, as this host knows it (fleetcron/local_holder.py): the boot and the
-- namespaces its pid and start time are read in, its pid, its start time (clock ticks
-- after boot), and the process group that must be gone with it (0: one being started).
-- holder_fence is the fence they were written with: a row written since by code that
-- does not know them (a replica of an older version, a claim of the run ledger) has
-- another fence, and its holder_* columns are not read.
ALTER TABLE fleetcron_lease ADD COLUMN holder_fence INTEGER;
ALTER TABLE fleetcron_lease ADD COLUMN holder_scope TEXT;
ALTER TABLE fleetcron_lease ADD COLUMN holder_pid INTEGER;
ALTER TABLE fleetcron_lease ADD COLUMN holder_start INTEGER;
ALTER TABLE fleetcron_lease ADD COLUMN holder_group INTEGER;
