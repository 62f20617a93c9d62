"""Gathering the doctor's facts from a connected store: each fact read once, reads only.
What a backend knows of its own server comes from the store itself (``doctor_facts()``),
so nothing here names a backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.doctor.facts import ClockReading, Facts
from fleetcron.doctor.findings import HISTORY, SAMPLES, BackendFacts
from fleetcron.doctor.jobs import job_facts, spec_terms, stored_terms
from fleetcron.jobspec import JobSpec
from fleetcron.stores.base import SyncStore

__all__ = ["gather"]


@runtime_checkable
class _Versioned(Protocol):
    """A store that keeps a schema (the SQL stores)."""

    latest_version: int

    def schema_version(self) -> int: ...


def _reading(store: SyncStore, clock: Clock) -> tuple[ClockReading, int]:
    wall = clock.wall_us()
    sent = clock.monotonic_us()
    store_now = store.run(store.ops.store_now())
    trip = clock.monotonic_us() - sent
    return ClockReading(round_trip_us=trip, offset_us=store_now - (wall + trip // 2)), store_now


def gather(
    store: SyncStore,
    *,
    kind: str,
    namespace: str,
    specs: Sequence[JobSpec] | None = None,
    jobs_file: str | None = None,
    compare_definitions: bool = True,
    clock: Clock = SYSTEM_CLOCK,
    samples: int = SAMPLES,
    history: int = HISTORY,
) -> Facts:
    """Read the facts of ``store`` (a backend of ``kind``: ``sqlite``, ``postgres`` …) for
    ``namespace``. The jobs checked are ``specs`` (a jobs file's) when given, else the
    definitions the replicas registered in the store; ``compare_definitions``: compare
    each spec's fingerprint with the registered one (only for specs loaded as a replica
    loads them). Reads only: the ledger's ``history`` newest rows per job, ``samples``
    clock readings, and on Redis and PostgreSQL the server's settings and pooling."""
    readings: list[ClockReading] = []
    now = 0
    for _ in range(max(1, samples)):
        reading, now = _reading(store, clock)
        readings.append(reading)
    version: int | None = None
    latest: int | None = None
    if isinstance(store, _Versioned):
        version, latest = store.schema_version(), store.latest_version
    own = getattr(store, "doctor_facts", None)
    backend: tuple[BackendFacts, ...] = tuple(own()) if callable(own) else ()
    ops = store.ops
    current = version == latest
    records = store.run(ops.job_list(namespace)) if current else []
    by_name = {record.job: record for record in records}
    stored = {record.job: stored_terms(record) for record in records}
    if specs is not None:
        checked = [spec_terms(spec, compare_definitions) for spec in specs]
        undefined: list[str] = []
    else:
        checked = [terms for terms in stored.values() if terms is not None]
        undefined = [name for name, terms in stored.items() if terms is None]
    jobs = []
    for terms in checked:
        durations: tuple[int, ...] | None = None
        if current:
            runs = store.run(ops.run_list(namespace, terms.name, history))
            durations = tuple(
                run.finished_us - run.started_us
                for run in runs
                if run.state == "succeeded"
                and run.finished_us is not None
                and run.started_us is not None
            )
        record = by_name.get(terms.name)
        jobs.append(
            job_facts(terms, now, durations, record.fingerprint if record is not None else None)
        )
    replicas = tuple(store.run(ops.replica_list(namespace))) if current else None
    return Facts(
        kind=kind,
        url=store.url,
        namespace=namespace,
        readings=tuple(readings),
        now_us=now,
        schema_version=version,
        latest_version=latest,
        jobs_file=jobs_file,
        jobs=tuple(jobs),
        undefined_jobs=tuple(undefined),
        stored_jobs=sum(terms is not None for terms in stored.values()) if current else None,
        replicas=replicas,
        backend=backend,
    )
