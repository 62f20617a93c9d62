"""Replicas that disagree on a job's definition, on the in-memory store.

The definition in the store governs — the one the replica that started last registered. A
replica whose definition was superseded claims none of the job's slots (scheduled or
triggered) while they differ, says so once, and runs the job again once they agree; the
replica that replaced another definition says so once when it starts. Tests wait for
what the ledger, the claims' answers or the scheduler show, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fleetcron import Fleet
from fleetcron.context import RunContext
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec
from fleetcron.models import ClaimResult, RunRecord
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling import planning
from fleetcron.scheduling.leadership import follow_leader
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled

NS = "defs"
JOB = "tick"


def spec(every: str, func: Callable[[RunContext], None] | None = None, **options: Any) -> JobSpec:
    return job_spec(JOB, where="test", call=func or _work, every=every, **options)


def _work(ctx: RunContext) -> None:
    pass


class Answered(AsyncMemoryStore):
    """An async face of a shared memory store that keeps every claim answer it gave."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.answers: list[ClaimResult] = []

    async def run(self, operation: Any) -> Any:
        result = await super().run(operation)
        if isinstance(result, list) and all(isinstance(a, ClaimResult) for a in result):
            self.answers.extend(result)
        return result

    def conflicts(self, slot_us: int | None = None) -> int:
        """How many claims of the job were refused as ``conflict`` (of one slot, if given)."""
        return sum(
            1
            for a in self.answers
            if a.status == "conflict" and slot_us in (None, a.slot_us) and a.job == JOB
        )


def replica(store: AsyncMemoryStore, job: JobSpec, **options: Any) -> AsyncScheduler:
    options.setdefault("shutdown_grace_s", 1.0)
    options.setdefault("kill_grace_s", 0.5)
    return AsyncScheduler(store, [job], SchedulerOptions(namespace=NS, **options))


async def stop(schedulers: Sequence[AsyncScheduler], tasks: Sequence[asyncio.Task[None]]) -> None:
    for scheduler in schedulers:
        scheduler.stop()
    await asyncio.gather(*tasks)


def runs(store: MemoryStore) -> list[RunRecord]:
    return store.run(store.ops.run_list(NS, JOB, 10_000))


def registered_at(store: MemoryStore) -> int:
    row = store.run(store.ops.job_get(NS, JOB))
    assert row is not None
    return row.updated_us


def register(store: MemoryStore, fingerprint: str) -> int:
    """Register a definition of the job as a replica starting would; its store time."""
    store.run(store.ops.job_register(NS, [(JOB, "{}", fingerprint)]))
    return registered_at(store)


def by(
    scheduler: AsyncScheduler,
    rows: Sequence[RunRecord],
    since_us: int,
    before_us: int | None = None,
) -> list[RunRecord]:
    """The attempts ``scheduler`` claimed from ``since_us`` (and before ``before_us``)."""
    return [
        r
        for r in rows
        if r.holder == scheduler.holder
        and r.started_us is not None
        and since_us <= r.started_us
        and (before_us is None or r.started_us < before_us)
    ]


def logged(caplog: pytest.LogCaptureFixture, action: str, **fields: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if getattr(r, "action", None) == action
        and all(getattr(r, key, None) == value for key, value in fields.items())
    ]


async def test_a_replica_whose_definition_was_superseded_claims_none_of_the_jobs_slots() -> None:
    """A runs the job every 200 ms; B starts with every 300 ms and registers it. From then
    on only B's schedule runs, never the union: A's claims are all refused."""
    store = MemoryStore()
    old, new = spec("200ms"), spec("300ms")
    a_store = Answered(store)
    a = replica(a_store, old)
    b = replica(AsyncMemoryStore(store), new)
    tasks = [asyncio.create_task(a.run())]
    try:
        await until_signalled([a], lambda: bool(by(a, runs(store), 0)))
        tasks.append(asyncio.create_task(b.run()))
        await b.signals.started.wait()
        since = registered_at(store)

        def settled() -> bool:
            after = by(b, runs(store), since)
            return JOB in a.conflicts and a_store.conflicts() >= 3 and len(after) >= 3

        await until_signalled([a, b], settled)
    finally:
        await stop([a, b], tasks)

    rows = runs(store)
    assert by(a, rows, since) == [], "the superseded replica claimed a slot"
    assert all(r.slot_us % 300_000 == 0 for r in rows if r.slot_us >= since), "not B's slot"


async def test_each_replica_reports_the_conflict_once(caplog: pytest.LogCaptureFixture) -> None:
    """B, which replaced A's definition, says so when it starts; A says it does not run the
    job at its first refused claim — one warning each, however many claims are refused."""
    store = MemoryStore()
    old, new = spec("200ms"), spec("300ms")
    a_store = Answered(store)
    a = replica(a_store, old)
    b = replica(AsyncMemoryStore(store), new)
    with caplog.at_level(logging.INFO, logger="fleetcron"):
        tasks = [asyncio.create_task(a.run())]
        try:
            await a.signals.started.wait()
            tasks.append(asyncio.create_task(b.run()))
            await b.signals.started.wait()
            await until_signalled([a, b], lambda: a_store.conflicts() >= 3)
            seen = dict(a.conflicts)
            replaced = dict(b.replaced)
        finally:
            await stop([a, b], tasks)

    assert seen[JOB].local_fingerprint == old.fingerprint()
    assert seen[JOB].other_fingerprint == new.fingerprint()
    assert replaced[JOB].local_fingerprint == new.fingerprint()
    assert replaced[JOB].other_fingerprint == old.fingerprint()
    assert not b.conflicts
    assert not a.replaced
    superseded = logged(caplog, "job_definition_conflict", local_fingerprint=old.fingerprint())
    replacing = logged(caplog, "job_definition_conflict", local_fingerprint=new.fingerprint())
    assert len(superseded) == 1, superseded  # once, not once per refused claim
    assert len(replacing) == 1, replacing
    assert "does not run the job until the definitions agree" in superseded[0]
    assert old.fingerprint()[:12] in superseded[0]
    assert new.fingerprint()[:12] in superseded[0]
    assert "replaced another replica's" in replacing[0]
    warnings = [
        r for r in caplog.records if getattr(r, "action", None) == "job_definition_conflict"
    ]
    assert all(r.levelno == logging.WARNING for r in warnings)


async def test_a_superseded_replica_runs_the_job_again_once_the_definitions_agree(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    job = spec("200ms")
    answered = Answered(store)
    a = replica(answered, job)
    with caplog.at_level(logging.INFO, logger="fleetcron"):
        tasks = [asyncio.create_task(a.run())]
        try:
            await until_signalled([a], lambda: bool(by(a, runs(store), 0)))
            superseded = register(store, "fp-of-a-newer-replica")
            await until_signalled([a], lambda: answered.conflicts() >= 2)
            assert JOB in a.conflicts
            back = register(store, job.fingerprint())  # the definition was changed back
            await until_signalled([a], lambda: bool(by(a, runs(store), back)))
        finally:
            await stop([a], tasks)

    rows = runs(store)
    assert by(a, rows, superseded, back) == []
    assert not a.conflicts
    assert len(logged(caplog, "job_definition_conflict")) == 1
    agreed = logged(caplog, "job_definition_agreed")
    assert len(agreed) == 1
    assert "runs it again" in agreed[0]


async def test_a_superseded_replica_does_not_run_a_manual_trigger_of_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fleetcron.scheduler.RECOVERY_EVERY_S", 0.05)
    store = MemoryStore()
    answered = Answered(store)
    a = replica(answered, spec("200ms"))
    tasks = [asyncio.create_task(a.run())]
    try:
        await a.signals.started.wait()
        register(store, "fp-of-a-newer-replica")
        slot = store.run(store.ops.store_now()) - 1_000
        assert store.run(store.ops.run_record(NS, JOB, slot, "queued", None, "manual"))
        await until_signalled([a], lambda: answered.conflicts(slot) >= 2)  # polled, refused, again
    finally:
        await stop([a], tasks)

    row = store.run(store.ops.run_get(NS, JOB, slot))
    assert row is not None
    assert (row.state, row.trigger) == ("queued", "manual")  # left for the governing replicas
    assert JOB not in {r.job for r in a.running}


async def test_a_superseded_replica_records_no_missed_slot_of_its_own_schedule() -> None:
    store = MemoryStore()
    job = spec("1s", catchup="skip")
    a = replica(AsyncMemoryStore(store), job)
    now = register(store, "fp-of-a-newer-replica")
    a.definitions.stored(JOB, "fp-of-a-newer-replica", now)  # as learnt from a claim
    # An hour of its slots is late (catchup = skip: all but the newest are missed).
    a._jobs[JOB] = planning.PlannedJob(spec=job, cursor_us=now - 3_600_000_000)
    a._due.push(a._jobs[JOB])

    await a._tick(0.0)

    assert runs(store) == []  # no missed row a governing replica's slot could run into
    assert a._jobs[JOB].cursor_us >= now - 1_000_000


async def test_a_standby_learns_of_a_conflict_from_the_job_rows_it_reads_anyway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    job = spec("200ms")
    standby = replica(AsyncMemoryStore(store), job, mode="leader")
    await standby._register()

    async def follow() -> None:
        await follow_leader(standby.store, NS, standby._jobs, standby.definitions)

    with caplog.at_level(logging.INFO, logger="fleetcron"):
        register(store, "fp-of-a-newer-replica")
        await follow()
        await follow()
        conflict = standby.conflicts[JOB]
        register(store, job.fingerprint())
        await follow()

    assert (conflict.local_fingerprint, conflict.other_fingerprint) == (
        job.fingerprint(),
        "fp-of-a-newer-replica",
    )
    assert not standby.conflicts
    actions = [getattr(r, "action", "") for r in caplog.records]
    assert actions == ["job_definition_conflict", "job_definition_agreed"]


def test_the_sync_scheduler_shows_the_conflicts_of_its_running_core() -> None:
    store = MemoryStore()
    fleet = Fleet(store, namespace=NS)
    fleet.job(JOB, every="200ms")(_work)
    scheduler = fleet.scheduler(shutdown_grace_s=1.0)
    assert scheduler.conflicts == {}
    scheduler.start()
    try:
        give_up = time.monotonic() + 30
        waiting = threading.Event()
        # The newer definition must come after this replica registered its own: written
        # before, it would be replaced by this replica's (which then governs).
        while store.run(store.ops.job_get(NS, JOB)) is None:
            assert time.monotonic() < give_up, "the replica never registered its job"
            waiting.wait(0.01)
        register(store, "fp-of-a-newer-replica")
        while JOB not in scheduler.conflicts:
            assert time.monotonic() < give_up, "the conflict was never reported"
            waiting.wait(0.01)
        conflict = scheduler.conflicts[JOB]
    finally:
        scheduler.stop()

    assert conflict.other_fingerprint == "fp-of-a-newer-replica"
    assert conflict.since_us <= store.run(store.ops.store_now())
    assert scheduler.conflicts == {}  # not running: nothing to report
    assert scheduler.replaced == {}
