"""Registration at start-up: a replica with many jobs writes only the definitions the
store does not already hold, after one read; the others are planned from the stored rows."""

from __future__ import annotations

import asyncio
from typing import Any

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
