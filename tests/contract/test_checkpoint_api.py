"""``ctx.checkpoint`` in scheduled jobs, on every backend: a job resumes from its mark, and
a run whose fence is stale cannot move it back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fleetcron import AsyncFleet, ConfigurationError, Fleet, RunContext
from fleetcron.fencing import StaleFence


def test_a_sync_job_resumes_from_its_checkpoint_run_after_run(fleet: Fleet) -> None:
    seen: list[int] = []
    three = threading.Event()

    @fleet.job(every="200ms")
    def sweep(ctx: RunContext) -> None:
        last = ctx.checkpoint.get(default=0)
        seen.append(last)
        ctx.checkpoint.set(last + 1)
        if len(seen) >= 3:
            three.set()

    fleet.start()
    try:
        assert three.wait(30), "three runs"
    finally:
        fleet.stop()
    assert seen[:3] == [0, 1, 2]


async def test_an_async_job_uses_aget_and_aset_and_a_stale_fence_is_refused(
    async_fleet: AsyncFleet,
) -> None:
    marks: list[object] = []
    refused: list[str] = []
    done = asyncio.Event()

    @async_fleet.job(every="200ms")
    async def feed(ctx: RunContext) -> None:
        marks.append(await ctx.checkpoint.aget())
        await ctx.checkpoint.aset({"last_id": ctx.fence})
        with pytest.raises(ConfigurationError, match="aget"):
            ctx.checkpoint.get()  # would block the loop: refused with the way out
        stale = type(ctx.checkpoint)(
            async_fleet.store, ctx.namespace, "feed", ctx.fence - 1, asyncio.get_running_loop()
        )
        try:
            await stale.aset({"last_id": 0})
        except StaleFence as exc:
            refused.append(str(exc))
        done.set()

    await async_fleet.start()
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await async_fleet.stop()
    assert marks[0] is None
    assert refused
    assert "stale fence" in refused[0]
    value = await async_fleet.store.run(
        async_fleet.store.ops.checkpoint_get(async_fleet.namespace, "feed")
    )
    assert value is not None
    assert '"last_id":0' not in value.value
