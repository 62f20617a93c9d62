"""``fleetcron doctor``: the checks of a deployment, as rules over gathered facts.

:func:`gather` reads what the checks need from a connected store — each fact once — and
works out what follows from the jobs' definitions (shortest interval, next slot, daylight
saving effects); :func:`diagnose` turns those :class:`Facts` into findings
without any I/O, so every rule can be exercised with hand-made facts.

A finding is ``ok``, ``warn`` (works, but something deserves attention) or ``fail``
(something will go wrong: a slot skipped, a run killed, a store this fleetcron refuses).
Rules that do not apply (no ``timeout``, no ``grace``, not Redis) give no finding.
"""

from __future__ import annotations

from fleetcron.doctor.facts import ClockReading, DstEffect, Facts, JobFacts
from fleetcron.doctor.findings import (
    CLOCK_FAIL_US,
    CLOCK_WARN_US,
    LEVELS,
    LOCK_AT_MOST_WARN_RATIO,
    ROUND_TRIP_WARN_US,
    BackendFacts,
    Finding,
    Level,
)
from fleetcron.doctor.gather import gather
from fleetcron.doctor.jobs import definition_failures, dst_effects
from fleetcron.doctor.rules import diagnose, missing_store

__all__ = [
    "CLOCK_FAIL_US",
    "CLOCK_WARN_US",
    "LEVELS",
    "LOCK_AT_MOST_WARN_RATIO",
    "ROUND_TRIP_WARN_US",
    "BackendFacts",
    "ClockReading",
    "DstEffect",
    "Facts",
    "Finding",
    "JobFacts",
    "Level",
    "definition_failures",
    "diagnose",
    "dst_effects",
    "gather",
    "missing_store",
]
