"""A cancel request reaches the running attempt within about a second, on every backend.

The request is a flag on the attempt's ledger row; the attempt's own renewals come only
every ``lock_at_most / 3`` (200 s with 10 m), so the replica running it reads its rows
every second. The test waits on the ledger (after every pass), never for a fixed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fleetcron.context import RunContext
from fleetcron.job_options import job_spec
from fleetcron.models import RunRecord
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores import open_async_store, parse_store_url
from fleetcron.stores.base import AsyncStore
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled

BOUND_US = 5_000_000
"""How long after the request the run may stop: about a second, bounded for a loaded
machine (the renewals alone would take 200 s)."""


@pytest.fixture
async def async_store(backend_url: str) -> AsyncIterator[AsyncStore]:
    if backend_url == "memory://":
        opened: AsyncStore = AsyncMemoryStore(MemoryStore())
    else:
        opened = await open_async_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        await opened.close()


async def test_cancel_other_stops_the_running_attempt_within_about_a_second(
    async_store: AsyncStore, namespace: str
) -> None:
    stopped: list[int] = []

    async def endless(ctx: RunContext) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.append(await async_store.run(async_store.ops.store_now()))

    job = job_spec(
        "preempt",
        where="test",
        call=endless,
        every="2s",
        overlap="cancel_other",
        lock_at_most="10m",
    )
    scheduler = AsyncScheduler(
        async_store,
        [job],
        SchedulerOptions(namespace=namespace, shutdown_grace_s=1.0, kill_grace_s=0.5),
    )
    rows: list[RunRecord] = []

    async def preempted() -> bool:
        rows[:] = await async_store.run(async_store.ops.run_list(namespace, "preempt", 50))
        return any(r.state == "cancelled" for r in rows)

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], preempted, timeout=60)
    finally:
        scheduler.stop()
        await task

    [first] = [r for r in rows if r.state == "cancelled"]
    assert first.error == "cancel requested", [(r.state, r.error) for r in rows]
    # The newer slot asked at its time (2 s after the cancelled one).
    assert stopped[0] - (first.slot_us + 2_000_000) < BOUND_US
