"""The facts the doctor's rules look at: gathered from a store (:mod:`.gather`) or made
by hand in a test, never read by the rules themselves."""

from __future__ import annotations

from dataclasses import dataclass

from fleetcron.doctor.findings import BackendFacts
from fleetcron.models import ReplicaRecord
from fleetcron.schedules import DstNote

__all__ = ["ClockReading", "DstEffect", "Facts", "JobFacts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockReading:
    """One ``store_now`` round trip: how long it took, and the store's clock minus this
    host's wall clock at its middle (positive: this host is behind)."""

    round_trip_us: int
    offset_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DstEffect:
    """A slot daylight saving moves, merges or repeats (see :func:`preview`)."""

    slot_us: int
    kind: DstNote
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFacts:
    """A job's definition and what follows from it, at the store's clock.

    ``next_slot_us`` is ``None`` when the schedule never fires again; ``durations_us``
    are the successful runs' lengths in the ledger (newest first), ``None`` when the
    ledger was not read. ``fingerprint`` is the checked definition's (a jobs file's;
    ``None`` for one read from the store), ``stored_fingerprint`` the one registered in
    the store (``None``: no job row)."""

    name: str
    schedule: str
    expression: str | None = None
    timezone: str = "UTC"
    one_off: bool = False
    next_slot_us: int | None
    min_interval_us: int | None
    lock_at_most_us: int
    lock_at_least_us: int = 0
    timeout_us: int | None = None
    keepalive: bool = True
    jitter_us: int = 0
    grace_us: int | None = None
    dst_effects: tuple[DstEffect, ...] = ()
    durations_us: tuple[int, ...] | None = None
    fingerprint: str | None = None
    stored_fingerprint: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """Everything the checks look at.

    ``schema_version``/``latest_version`` are ``None`` for a store that keeps no schema;
    ``stored_jobs`` (job rows with a definition, registered by replicas) and ``replicas``
    are ``None`` when they were not read (the schema is not current). ``replicas`` holds
    the live rows and those gone within the last minutes. ``undefined_jobs``: job rows
    without a readable definition (an older ``fleetcron exec --schedule``, or a newer
    fleetcron).
    """

    kind: str
    url: str
    namespace: str
    readings: tuple[ClockReading, ...]
    now_us: int
    schema_version: int | None = None
    latest_version: int | None = None
    jobs_file: str | None = None
    jobs: tuple[JobFacts, ...] = ()
    undefined_jobs: tuple[str, ...] = ()
    stored_jobs: int | None = None
    replicas: tuple[ReplicaRecord, ...] | None = None
    backend: tuple[BackendFacts, ...] = ()
    """What the backend read of its own server (its store's ``doctor_facts()``)."""
