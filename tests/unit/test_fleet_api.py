"""The two faces of one core: ``AsyncFleet`` has what ``Fleet`` has, and both hand out a
scheduler object over the same async implementation."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fleetcron import AsyncFleet, AsyncScheduler, Fleet, RunContext, Scheduler
from fleetcron.errors import ConfigurationError
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore

NS = "faces"


async def test_an_async_fleet_starts_stops_and_lists_the_runs_of_its_jobs() -> None:
    fleet = AsyncFleet(AsyncMemoryStore(MemoryStore()), namespace=NS)
    ran = asyncio.Event()

    @fleet.job(every="200ms")
    async def tick(ctx: RunContext) -> None:
        ran.set()

    assert [spec.name for spec in fleet.jobs] == ["tick"]
    await fleet.start()
    await asyncio.wait_for(ran.wait(), 10)
    await fleet.stop()

    runs = await fleet.runs("tick")
    assert runs
    assert runs[0].state == "succeeded"
    assert [r.slot_us for r in await fleet.runs(limit=1)] == [runs[0].slot_us]


async def test_cancelling_an_async_fleets_run_stops_its_scheduler() -> None:
    fleet = AsyncFleet(AsyncMemoryStore(MemoryStore()), namespace=NS)
    ran = asyncio.Event()

    @fleet.job(every="200ms")
    async def tick(ctx: RunContext) -> None:
        ran.set()

    serving = asyncio.create_task(fleet.run())
    await asyncio.wait_for(ran.wait(), 10)
    serving.cancel()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serving, 40)
    assert any(r.state == "succeeded" for r in await fleet.runs("tick"))


async def test_an_async_fleet_hands_out_its_scheduler_unstarted() -> None:
    fleet = AsyncFleet(AsyncMemoryStore(MemoryStore()), namespace=NS)

    @fleet.job(every="1h")
    def idle(ctx: RunContext) -> None:
        pass

    scheduler = fleet.scheduler(concurrency=2, shutdown_grace_s=1.0)
    assert isinstance(scheduler, AsyncScheduler)
    assert scheduler.options.concurrency == 2
    assert scheduler.options.namespace == NS
    assert scheduler.running == []


async def test_an_async_fleet_prunes_like_a_fleet() -> None:
    fleet = AsyncFleet(AsyncMemoryStore(MemoryStore()), namespace=NS)
    lease = await fleet.lock("report", lock_at_most="1s")
    await lease.release()

    assert await fleet.prune("1h", dry_run=True) == []
    assert await fleet.prune("0s", dry_run=True) == ["report"], "0: every lease not held"
    assert await fleet.prune("0s") == ["report"]
    assert await fleet.prune("0s", dry_run=True) == []
    with pytest.raises(ConfigurationError, match="older_than must not be negative"):
        await fleet.prune(-5)


def test_a_fleet_hands_out_a_sync_scheduler_that_starts_and_stops() -> None:
    fleet = Fleet(MemoryStore(), namespace=NS)
    ran = threading.Event()

    @fleet.job(every="200ms")
    def tick(ctx: RunContext) -> None:
        ran.set()

    scheduler = fleet.scheduler(shutdown_grace_s=1.0)
    assert isinstance(scheduler, Scheduler)
    scheduler.start()
    try:
        assert ran.wait(10)
    finally:
        scheduler.stop()
    assert any(r.state == "succeeded" for r in fleet.runs("tick"))
    with pytest.raises(ConfigurationError, match="limit"):
        fleet.runs(limit=0)


def test_scheduler_options_are_checked_when_the_scheduler_is_made() -> None:
    fleet = Fleet(MemoryStore(), namespace=NS)
    with pytest.raises(ConfigurationError, match="no jobs"):
        fleet.scheduler()

    @fleet.job(every="1h")
    def idle(ctx: RunContext) -> None:
        pass

    with pytest.raises(ConfigurationError, match="unknown option"):
        fleet.scheduler(shutdown_grace=3)
    with pytest.raises(ConfigurationError, match="concurrency must be an integer"):
        fleet.scheduler(concurrency="4")  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", [5, b"sqlite:////tmp/x.db", 1.5, ["memory://"]])
def test_a_backend_of_the_wrong_type_is_refused_at_once(backend: object) -> None:
    with pytest.raises(ConfigurationError, match="backend must be a URL string or an open store"):
        Fleet(backend)  # type: ignore[arg-type]


def test_async_fleet_refuses_what_is_not_a_url_or_a_store() -> None:
    with pytest.raises(ConfigurationError, match="backend must be a URL string, not bytes"):
        asyncio.run(AsyncFleet.connect(b"memory://"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="AsyncFleet takes an open async store, not str"):
        AsyncFleet("memory://")  # type: ignore[arg-type]
