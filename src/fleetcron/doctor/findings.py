"""What the doctor says: a :class:`Finding` per check, and what a backend's own facts
must offer to be judged (:class:`BackendFacts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from fleetcron.durations import format_duration

__all__ = [
    "CLOCK_FAIL_US",
    "CLOCK_WARN_US",
    "HISTORY",
    "LEVELS",
    "LOCK_AT_MOST_WARN_RATIO",
    "ROUND_TRIP_WARN_US",
    "SAMPLES",
    "BackendFacts",
    "Finding",
    "Level",
    "duration_text",
]

Level = Literal["ok", "warn", "fail"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "fail")

CLOCK_WARN_US = 1_000_000
CLOCK_FAIL_US = 10_000_000
"""``fleetcron exec --schedule`` waits at most this long (its early-trigger tolerance) for
the store's clock to reach a slot a cron on this host fired for."""
ROUND_TRIP_WARN_US = 100_000
LOCK_AT_MOST_WARN_RATIO = 0.8
SAMPLES = 5  # store_now round trips
HISTORY = 50  # ledger rows read per job


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One result: its ``level``, what was checked, what was found, and what to do."""

    level: Level
    check: str
    message: str
    advice: str = ""


class BackendFacts(Protocol):
    """What a backend read of its own server for the doctor (a store's ``doctor_facts()``:
    Redis's persistence and replication, PostgreSQL's pooler), judged by itself: the
    shared checks never name a backend."""

    def findings(self) -> list[Finding]:
        """The findings these facts call for (none when nothing applies)."""
        ...


def duration_text(micros: int) -> str:
    """A duration as the findings write it (``1m30s``)."""
    return format_duration(micros)
