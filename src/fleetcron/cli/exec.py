"""``fleetcron exec NAME [options] -- COMMAND…``: the cross-host ``flock -n``.

The command runs only while this process holds the lease ``NAME``; it is started as an
argv (never through a shell) in a process group of its own, so that everything it starts
can be stopped together when the lease is lost or ``--timeout`` elapses — by this process,
with the executor's stop sequence, and, should it be frozen or killed, by its reaper
(:mod:`fleetcron.reaper`: one small process per invocation, started with the command, that
stops the group at the lease's deadline on its own, and at once when this process has
died). With ``--ping-url`` the run's start and end are pinged (:mod:`fleetcron.pings`)
from a background thread; at the end they get a few seconds to go out, and never change
the exit status.

This module is the plain lease path (:func:`run_exec`) and the face of the rooms exec is
made of:

- :mod:`~fleetcron.cli.exec_options` — the options, checked before any state is touched;
- :mod:`~fleetcron.cli.exec_command` — the command under its lease: supervision, the
  signals forwarded to it, exec's exit statuses;
- :mod:`~fleetcron.cli.exec_slot` — ``--schedule``: the run as a slot of the run ledger,
  the job's definition registered before each claim;
- :mod:`~fleetcron.cli.exec_pings` — ``--ping-url``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fleetcron._log import log
from fleetcron.cli.exec_command import run_command, run_outcome
from fleetcron.cli.exec_options import ExecOptions, exec_options, option_micros
from fleetcron.cli.exec_pings import RunPings
from fleetcron.cli.exec_slot import exec_job_spec, latest_slot, run_exec_schedule
from fleetcron.cli.exitcodes import EXIT_LEASE_LOST
from fleetcron.environment import child_environment
from fleetcron.lease import Lease
from fleetcron.sync import Fleet

__all__ = [
    "ExecOptions",
    "child_environment",
    "exec_job_spec",
    "exec_options",
    "latest_slot",
    "option_micros",
    "run_exec",
    "run_exec_schedule",
]


def run_exec(fleet: Fleet, options: ExecOptions, backend_url: str | None) -> int:
    """Take the lease, run the command, release; return the exit status (see exitcodes)."""
    lease = fleet.try_lock(
        options.name,
        lock_at_most=options.lock_at_most,
        lock_at_least=options.lock_at_least,
        keepalive=options.keepalive,
        wait=options.wait,
        mode="advisory" if options.lock_mode == "advisory" else "lease",
    )
    if lease is None:  # said by try_lock, once (lock_skipped)
        return options.skipped_exit_code
    pings = RunPings(options, str(uuid.uuid4()))
    pings.start()
    status: int | None = None
    try:
        held = _released(lease)
        with held:
            status = run_command(
                lease,
                options,
                backend_url,
                run_id=pings.run_id,
                name_group=_group_namer(fleet, lease),
            )
        if status != EXIT_LEASE_LOST and held.released is False:
            # The command ended, but the store no longer knew the lease as ours: it expired
            # while this process could not renew it (paused, starved), so another holder
            # may have run meanwhile. Its own status would hide that.
            log.error(
                "lease on %s expired before the command ended (status %d); it may have run "
                "beside another holder",
                options.name,
                status,
                extra={"action": "run_lost", "lock": options.name, "fence": lease.fence},
            )
            status = EXIT_LEASE_LOST
        return status
    finally:
        pings.finish(run_outcome(status, False, options))


def _group_namer(fleet: Fleet, lease: Lease) -> Callable[[int], object] | None:
    """How to tell the store the command's process group, on a store that takes a lease
    over from a holder gone from its host (SQLite: ``lease_group``); else ``None``."""
    name_group = getattr(fleet.store, "lease_group", None)
    if name_group is None:
        return None

    def named(group: int) -> object:
        return name_group(lease.namespace, lease.name, lease.holder, lease.fence, group)

    return named


class _released:
    """Release the lease however supervision ends (the lease may already be lost)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.released: bool | None = None
        """Whether the store still knew the lease as ours (``None``: the release failed)."""

    def __enter__(self) -> Lease:
        return self.lease

    def __exit__(self, *exc: object) -> None:
        try:
            self.released = self.lease.release()
        except Exception as error:
            log.warning(
                "releasing %s failed: %s (it expires at the end of its lease)",
                self.lease.name,
                error,
                extra={"action": "lock_release_failed", "lock": self.lease.name},
            )
