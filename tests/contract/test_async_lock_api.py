"""The asyncio lock API (AsyncFleet) on every backend."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fleetcron import AsyncFleet, AsyncLease, LeaseLost, LockBusy
from fleetcron.stores import AsyncStore
from fleetcron.stores.base import Operation


async def test_connect_opens_the_store_behind_the_url(async_fleet: AsyncFleet) -> None:
    assert await async_fleet.locks() == []
    assert await async_fleet.get("job") is None


async def test_async_try_lock_returns_a_lease_or_none_when_held(async_fleet: AsyncFleet) -> None:
    lease = await async_fleet.try_lock("job", keepalive=False)

    assert isinstance(lease, AsyncLease)
    assert lease.valid
    assert lease.name == "job"
    assert await async_fleet.try_lock("job", keepalive=False) is None
    record = await async_fleet.get("job")
    assert record is not None
    assert record.held
    assert record.fence == lease.fence
    assert await lease.release() is True
    again = await async_fleet.try_lock("job", keepalive=False)
    assert again is not None
    assert again.fence > lease.fence
    assert await again.release()


async def test_async_lock_raises_lock_busy_when_held_and_releases_on_exit(
    async_fleet: AsyncFleet,
) -> None:
    async with await async_fleet.lock("job", keepalive=False) as lease:
        with pytest.raises(LockBusy):
            await async_fleet.lock("job", keepalive=False)
        record = await async_fleet.get("job")
        assert record is not None
        assert record.held
        assert record.fence == lease.fence

    record = await async_fleet.get("job")
    assert record is not None
    assert not record.held


class RefusalWatch:
    """An async store that passes everything through and notes refused acquisitions."""

    def __init__(self, inner: AsyncStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.capabilities = inner.capabilities
        self.ops = inner.ops
        self.refused = asyncio.Event()

    async def run(self, operation: Operation[Any]) -> Any:
        kind = getattr(operation, "__name__", "")
        result = await self.inner.run(operation)
        if kind == "lease_acquire" and result is None:
            self.refused.set()
        return result

    async def migrate(self) -> list[str]:
        return await self.inner.migrate()

    async def close(self) -> None:
        await self.inner.close()


async def test_async_wait_blocks_until_the_holder_releases_then_succeeds(
    async_fleet: AsyncFleet,
) -> None:
    watched = RefusalWatch(async_fleet.store)
    fleet = AsyncFleet(watched, namespace=async_fleet.namespace)
    holder = await fleet.try_lock("job", keepalive=False)
    assert holder is not None
    started = time.monotonic()
    waiter = asyncio.create_task(fleet.try_lock("job", keepalive=False, wait="10s"))

    await asyncio.wait_for(watched.refused.wait(), 10)
    assert not waiter.done(), "the waiter gave up while the lock was held"
    assert await holder.release()
    taken = await asyncio.wait_for(waiter, 10)

    assert taken is not None
    assert taken.fence > holder.fence
    assert time.monotonic() - started < 10
    assert await taken.release()


async def test_async_wait_gives_up_with_none_and_lock_busy_when_the_holder_keeps_it(
    async_fleet: AsyncFleet,
) -> None:
    holder = await async_fleet.try_lock("job", keepalive=False)
    assert holder is not None

    assert await async_fleet.try_lock("job", keepalive=False, wait="200ms") is None
    with pytest.raises(LockBusy):
        await async_fleet.lock("job", keepalive=False, wait="100ms")


async def test_async_locked_runs_when_free_and_skips_when_held(async_fleet: AsyncFleet) -> None:
    calls: list[int] = []

    @async_fleet.locked("job", lock_at_most="5s")
    async def work(value: int) -> int:
        calls.append(value)
        record = await async_fleet.get("job")
        assert record is not None
        assert record.held
        return value * 2

    assert await work(1) == 2
    holder = await async_fleet.try_lock("job", keepalive=False)
    assert holder is not None
    assert await work(2) is None
    assert await holder.release()
    assert await work(3) == 6
    assert calls == [1, 3]


async def test_async_keepalive_renews_the_lease_past_its_original_lock_at_most(
    async_fleet: AsyncFleet,
) -> None:
    async with await async_fleet.lock("job", lock_at_most="600ms") as lease:
        original = lease.record
        while True:  # until the store's clock is well past the original expiry
            record = await async_fleet.get("job")
            assert record is not None
            if record.now_us >= original.expires_us + 300_000:
                break
            await asyncio.sleep(0.05)

        assert record.held
        assert record.fence == original.fence
        assert record.expires_us > original.expires_us
        assert await async_fleet.try_lock("job", keepalive=False) is None
        assert lease.valid
        assert not lease.lost.is_set()


async def test_an_async_lease_taken_over_is_lost_and_the_async_with_raises_lease_lost(
    async_fleet: AsyncFleet,
) -> None:
    store = async_fleet.store
    with pytest.raises(LeaseLost) as raised:
        async with await async_fleet.lock("job", lock_at_most="1500ms") as lease:
            assert await store.run(
                store.ops.lease_release(async_fleet.namespace, "job", lease.holder, lease.fence)
            )
            taken = await async_fleet.try_lock("job", lock_at_most="10s", keepalive=False)
            assert taken is not None
            # The loss cancels this task (the owner) wherever it awaits. (Not inside
            # asyncio.wait_for on Python 3.11, which can swallow a cancellation that races
            # with completion: the lost event is the cooperative signal there.)
            async with asyncio.timeout(10):
                await lease.lost.wait()
                await asyncio.sleep(10)
            pytest.fail("the work kept running on a lost lease")

    assert raised.value.name == "job"
    assert lease.lost.is_set()
    assert not lease.valid
    record = await async_fleet.get("job")
    assert record is not None
    assert taken is not None
    assert record.fence == taken.fence


async def test_async_locked_cancels_the_work_when_the_lease_is_lost(
    async_fleet: AsyncFleet,
) -> None:
    store = async_fleet.store

    @async_fleet.locked("job", lock_at_most="300ms")
    async def work() -> None:
        record = await async_fleet.get("job")
        assert record is not None
        await store.run(
            store.ops.lease_release(async_fleet.namespace, "job", record.holder, record.fence)
        )
        await asyncio.sleep(10)
        pytest.fail("the work kept running on a lost lease")

    with pytest.raises(LeaseLost):
        await asyncio.wait_for(work(), 10)
