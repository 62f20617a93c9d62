"""The load a store failover is tried under, shared by the failover scenarios.

Three lock contenders renewing one lease and two ``fleetcron run`` replicas running two
jobs every second (:func:`start_load`); helpers that pick events out of the histories; and
the final ledger's expectation that every slot between each job's first and last row has
its row (:func:`expect_every_slot`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from fault.history import Event
from fault.runner import Run, ScenarioFailed, wait_until
from fleetcron.errors import StoreError
from fleetcron.models import RunRecord

__all__ = [
    "JOBS",
    "LEASE",
    "LOCKERS",
    "LOST_OK",
    "SECOND",
    "events_of",
    "expect_every_slot",
    "mono",
    "ok_runs_started_after",
    "start_load",
]

SECOND = 1_000_000
LEASE = "res"
JOBS = ("tick", "tock")
LOCKERS = 3
# A run recovered after its replica could not record its outcome in time ends "lost"; one
# stopped because its lease was lost ends "cancelled": honest outcomes under a failover.
LOST_OK = frozenset({"succeeded", "lost", "cancelled"})


def mono() -> int:
    """CLOCK_MONOTONIC in µs, the clock of every history's ``mono_us``."""
    return time.monotonic_ns() // 1000


def events_of(events: Iterable[Event], kind: str, name: str | None = None) -> list[Event]:
    """The events of ``kind`` (of the lease or job ``name``, when given)."""
    return [e for e in events if e.event == kind and (name is None or e.name == name)]


def ok_runs_started_after(events: Sequence[Event], job: str, after: int) -> int:
    """How many runs of ``job`` started after ``after`` (µs, monotonic) and ended well."""
    started = {
        (e.worker, e.fence, e.slot_us)
        for e in events_of(events, "run_start", job)
        if e.mono_us > after
    }
    return sum(
        1
        for e in events_of(events, "run_end", job)
        if (e.worker, e.fence, e.slot_us) in started and e.data.get("outcome") == "ok"
    )


def start_load(
    run: Run, *, ttl_ms: int, hold_ms: int, keepalive: bool, url: str | None = None
) -> None:
    """Contenders holding a lease of ``ttl_ms`` for ``hold_ms`` — they run until the
    scenario stops them — and replicas, on ``url`` (default: the run's); returns once both
    have been granted and run a few times."""
    run.lockers(
        LOCKERS,
        name=LEASE,
        ttl_ms=ttl_ms,
        hold_ms=hold_ms,
        writes=max(3, hold_ms // 500),
        duration_s=600,
        keepalive=keepalive,
        url=url,
    )
    jobs = run.jobs_file(list(JOBS), every="1s", work_s=0.2, lock_at_most="4s")
    run.replicas(2, jobs, url=url)

    def working() -> bool:
        events = run.histories()
        return len(events_of(events, "acquire_ok")) >= 3 and all(
            ok_runs_started_after(events, job, 0) >= 2 for job in JOBS
        )

    wait_until(working, timeout=60, what="grants and two runs of each job before the fault")


def expect_every_slot(run: Run) -> list[RunRecord]:
    """The final ledger; every slot between each job's first and last row is expected."""
    rows: list[RunRecord] = []
    for job in JOBS:
        try:
            mine = run.ledger(job)
        except StoreError as exc:
            raise ScenarioFailed(f"the store did not answer after the fault: {exc}") from exc
        if not mine:
            raise ScenarioFailed(f"no ledger row for {job}")
        slots = [row.slot_us for row in mine]
        run.expected_slots[job] = list(range(min(slots), max(slots) + 1, SECOND))
        rows += mine
    return rows
