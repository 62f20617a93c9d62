"""What ``fleetcron status``, the metrics and the dashboard show: one view model, read
from the store in one operation (so the sync and the async face share it).

Reading costs one round trip for the job rows, one for the leases and one per selected
job for its recent ledger rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetcron.health import JobHealth, assess
from fleetcron.models import LeaseRecord
from fleetcron.scheduling.leadership import LEADER_LEASE
from fleetcron.stores.base import Operation, Operations

__all__ = ["HISTORY", "FleetStatus", "read_status"]

HISTORY = 50  # ledger rows read per job: the last run, durations, starvation


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetStatus:
    """A namespace at one instant of the store's clock."""

    namespace: str
    now_us: int
    jobs: tuple[JobHealth, ...]
    leader: LeaseRecord | None  # the leader lease while held (leader mode)
    unknown_jobs: tuple[str, ...]  # asked for, but the store has no row of them

    @property
    def unhealthy(self) -> tuple[JobHealth, ...]:
        """The jobs ``status --check`` fails on: overdue, failing or stuck."""
        return tuple(health for health in self.jobs if not health.healthy)


_ORDER = {"overdue": 0, "stuck": 1, "failing": 2, "unknown": 3, "running": 4, "ok": 5}


def read_status(
    ops: Operations, namespace: str, jobs: Sequence[str] | None = None, *, history: int = HISTORY
) -> Operation[FleetStatus]:
    """Read the health of ``jobs`` (all when ``None``), worst first."""
    rows = yield from ops.job_list(namespace)
    leases = yield from ops.lease_list(namespace)
    wanted = set(jobs) if jobs is not None else None
    selected = [row for row in rows if wanted is None or row.job in wanted]
    found = {row.job for row in selected}
    healths = []
    for row in selected:
        runs = yield from ops.run_list(namespace, row.job, history)
        healths.append(assess(row, runs))
    healths.sort(key=lambda h: (_ORDER.get(h.state, 6), h.job))
    now = max([row.now_us for row in rows] + [lease.now_us for lease in leases], default=0)
    if not now:
        now = yield from ops.store_now()
    leader = next((lease for lease in leases if lease.name == LEADER_LEASE and lease.held), None)
    return FleetStatus(
        namespace=namespace,
        now_us=now,
        jobs=tuple(healths),
        leader=leader,
        unknown_jobs=tuple(sorted((wanted or set()) - found)),
    )
