"""Registration at start-up: a replica with many jobs writes only the definitions the
store does not already hold, after one read; the others are planned from the stored rows."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from unit.fakes import Recorded
from unit.test_scheduler import spec

NS = "registration"
MANY = 700  # more than one registration batch


def _written(store: Recorded) -> list[str]:
    """The job names every job_register wrote."""
    return [name for call in store.calls["job_register"] for name, _, _ in call["jobs"]]


async def _start(store: AsyncMemoryStore, jobs: list[Any]) -> AsyncScheduler:
    scheduler = AsyncScheduler(store, jobs, SchedulerOptions(namespace=NS, monitor_s=0))
    task = asyncio.create_task(scheduler.run())
    await scheduler.signals.started.wait()
    scheduler.stop()
    await task
    return scheduler


async def test_a_replica_writes_only_the_definitions_the_store_does_not_hold() -> None:
    store = MemoryStore()
    jobs = [spec(f"job{i:04d}", lambda ctx: None, every="1h") for i in range(MANY)]
    first = Recorded(store)
    await _start(first, jobs)
    assert sorted(_written(first)) == sorted(j.name for j in jobs)

    # The same jobs again, but two changed and one new.
    changed = [spec(j.name, lambda ctx: None, every="2h") for j in jobs[:2]]
    new = spec("job-new", lambda ctx: None, every="1h")
    again = Recorded(store)
    second = await _start(again, [*changed, *jobs[2:], new])

    assert sorted(_written(again)) == sorted([jobs[0].name, jobs[1].name, "job-new"])
    assert set(second.replaced) == {jobs[0].name, jobs[1].name}
    stored = {row.job: row for row in store.run(store.ops.job_list(NS))}
    assert stored[jobs[0].name].fingerprint == changed[0].fingerprint()
    assert stored[jobs[2].name].fingerprint == jobs[2].fingerprint()
    assert len(second._jobs) == MANY + 1  # every job is planned, written or not


async def test_a_replica_of_many_jobs_says_how_its_registration_went(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    jobs = [spec(f"job{i:04d}", lambda ctx: None, every="1h") for i in range(1_001)]
    with caplog.at_level(logging.INFO, logger="fleetcron"):
        await _start(AsyncMemoryStore(store), jobs[:3])  # a few jobs: not a word
        await _start(AsyncMemoryStore(store), [spec(jobs[0].name, lambda ctx: None), *jobs[1:]])
    said = [r for r in caplog.records if getattr(r, "action", "") == "jobs_registered"]
    assert len(said) == 1
    message = said[0].getMessage()
    assert message.startswith("registered 1,001 job(s) in ")
    assert message.endswith(": 998 new, 1 changed, 2 unchanged")
    fields = vars(said[0])
    assert [fields[key] for key in ("jobs", "new", "changed", "unchanged")] == [1001, 998, 1, 2]
