"""Whether anything of a scheduled run outlived its lease, judged on the store's clock.

A job's body logs signs of life (``run_alive``, ``write_invoke``) on CLOCK_MONOTONIC; its
lease lives on the store's clock, renewed by the replica where the body cannot see it. The
runner samples the store's clock while the scenario runs (``ClockSample``: the read was
invoked at ``invoke``, answered ``store_us``, heard at ``heard``, all µs), and the ledger
says, after the fact, when the lease had certainly ended:

- a run closed ``lost`` was recovered at ``finished_us``, which the store allows only once
  its lease has expired;
- a later run of the same job started (``started_us``) under the job's exclusive lease,
  which the store grants only once the earlier lease has expired or been released.

The earliest of those is an upper bound ``U`` on the run's expiry. A sign of life at mono
``m`` happened at store time at least ``L(m) = m + max(store_us - heard)`` over the samples
heard by ``m`` (the store answered before it was heard, and its clock runs at the rate of
CLOCK_MONOTONIC). ``L(m) > U + tolerance`` is definite: something of the run was alive
after its lease had ended, when another replica could already run the job.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from fault.checker import Anomaly
from fault.history import Event
from fleetcron.models import RunRecord

__all__ = ["ClockSample", "runs_alive_after_lease"]

_SIGNS = frozenset({"run_alive", "write_invoke", "run_end"})
_STARTED = frozenset({"running", "succeeded", "failed", "lost", "cancelled"})


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One reading of the store's clock by the runner."""

    invoke: int
    store_us: int
    heard: int


def _lower_bounds(samples: Sequence[ClockSample]) -> tuple[list[int], list[int]]:
    """Sorted hearing times and, for each, the best ``store - mono`` offset known by then."""
    ordered = sorted(samples, key=lambda s: s.heard)
    heard: list[int] = []
    best: list[int] = []
    offset = None
    for sample in ordered:
        value = sample.store_us - sample.heard
        offset = value if offset is None else max(offset, value)
        heard.append(sample.heard)
        best.append(offset)
    return heard, best


def _ends(ledger: Sequence[RunRecord]) -> dict[tuple[str, int], tuple[int, str]]:
    """For each run ``(job, fence)``, the earliest store time by which its lease had
    certainly ended, and why."""
    ends: dict[tuple[str, int], tuple[int, str]] = {}
    by_job: dict[str, list[RunRecord]] = {}
    for row in ledger:
        if row.state in _STARTED and row.started_us is not None:
            by_job.setdefault(row.job, []).append(row)
    for job, rows in by_job.items():
        rows.sort(key=lambda r: r.started_us or 0)
        for index, row in enumerate(rows):
            bounds: list[tuple[int, str]] = []
            if row.state == "lost" and row.finished_us is not None:
                bounds.append((row.finished_us, "recovered as lost"))
            later = [r for r in rows[index + 1 :] if r.fence != row.fence]
            if later and later[0].started_us is not None:
                bounds.append(
                    (later[0].started_us, f"slot run with fence {later[0].fence} started")
                )
            if bounds:
                ends[(job, row.fence)] = min(bounds)
    return ends


def runs_alive_after_lease(
    events: Sequence[Event],
    ledger: Sequence[RunRecord],
    samples: Sequence[ClockSample],
    *,
    tolerance_us: int = 1_000,
) -> tuple[list[Anomaly], int]:
    """The definite anomalies (one per run) and how many signs of life were judged."""
    heard, best = _lower_bounds(samples)
    ends = _ends(ledger)
    found: dict[tuple[str, int], Anomaly] = {}
    judged = 0
    for event in events:
        if event.event not in _SIGNS or event.fence is None or event.slot_us is None:
            continue
        key = (event.name, event.fence)
        end = ends.get(key)
        index = bisect.bisect_right(heard, event.mono_us) - 1
        if end is None or index < 0:
            continue
        judged += 1
        at_least = event.mono_us + best[index]
        if at_least > end[0] + tolerance_us and key not in found:
            found[key] = Anomaly(
                kind="alive_after_expiry",
                rule="run_outlived_lease",
                message=(
                    f"run of {event.name} with fence {event.fence} showed life "
                    f"({event.event}) at store time ≥ {at_least / 1e6:.3f}s, "
                    f"{(at_least - end[0]) / 1000:.1f} ms after its lease had certainly "
                    f"ended ({end[1]} at {end[0] / 1e6:.3f}s)"
                ),
                events=(event,),
            )
    return list(found.values()), judged
