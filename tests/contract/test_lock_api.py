"""The sync lock API (Fleet.try_lock / lock / locked, keepalive, lost leases) on every backend."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from contract.contract_support import row, wait_for_store_time, wait_until_freed
from fleetcron import Fleet, Lease, LeaseLost, LockBusy, StoreUnavailable
from fleetcron.models import LeaseRecord
from fleetcron.stores import SyncStore
from fleetcron.stores.base import Operation


class WatchedStore:
    """A store that passes everything through, notes refused acquisitions, and can refuse
    renewals (as a store would after a takeover)."""

    def __init__(self, inner: SyncStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.capabilities = inner.capabilities
        self.ops = inner.ops
        self.refused = threading.Event()
        self.refuse_extend = False
        self.unreachable_for_extend = False

    def run(self, operation: Operation[Any]) -> Any:
        kind = getattr(operation, "__name__", "")
        if kind == "lease_extend" and self.refuse_extend:
            operation.close()
            return None
        if kind == "lease_extend" and self.unreachable_for_extend:
            operation.close()
            raise StoreUnavailable("simulated: the store cannot be reached")
        result = self.inner.run(operation)
        if kind == "lease_acquire" and result is None:
            self.refused.set()
        return result

    def migrate(self) -> list[str]:
        return self.inner.migrate()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def watched(store: SyncStore) -> WatchedStore:
    return WatchedStore(store)


@pytest.fixture
def watched_fleet(watched: WatchedStore, namespace: str) -> Iterator[Fleet]:
    with Fleet(watched, namespace=namespace) as fleet:
        yield fleet


def test_try_lock_returns_a_lease_or_none_when_held(fleet: Fleet) -> None:
    lease = fleet.try_lock("job", keepalive=False)

    assert isinstance(lease, Lease)
    assert lease.valid
    assert lease.name == "job"
    assert lease.namespace == fleet.namespace
    assert fleet.try_lock("job", keepalive=False) is None
    assert lease.release() is True
    assert not lease.valid
    again = fleet.try_lock("job", keepalive=False)
    assert again is not None
    assert again.fence > lease.fence
    assert again.release()


def test_lock_as_a_context_manager_raises_lock_busy_when_held_and_releases_on_exit(
    fleet: Fleet,
) -> None:
    with fleet.lock("job", keepalive=False) as lease:
        with pytest.raises(LockBusy) as busy:
            with fleet.lock("job", keepalive=False):
                pytest.fail("entered a held lock")
        assert busy.value.name == "job"
        record = fleet.get("job")
        assert record is not None
        assert record.held
        assert record.fence == lease.fence

    record = fleet.get("job")
    assert record is not None
    assert not record.held


def test_lock_at_least_keeps_the_lock_taken_after_the_with_block(fleet: Fleet) -> None:
    with fleet.lock("job", lock_at_most="5s", lock_at_least="2s", keepalive=False):
        pass

    assert fleet.try_lock("job", keepalive=False) is None


def test_wait_blocks_until_the_holder_releases_then_succeeds(
    watched_fleet: Fleet, watched: WatchedStore
) -> None:
    holder = watched_fleet.try_lock("job", keepalive=False)
    assert holder is not None
    got: list[Lease | None] = []
    waiter = threading.Thread(
        target=lambda: got.append(watched_fleet.try_lock("job", keepalive=False, wait="10s"))
    )
    started = time.monotonic()
    waiter.start()

    assert watched.refused.wait(10), "the waiter never tried"
    assert waiter.is_alive(), "the waiter gave up while the lock was held"
    assert holder.release()
    waiter.join(timeout=10)

    assert got
    assert got[0] is not None
    assert got[0].fence > holder.fence
    assert time.monotonic() - started < 10
    got[0].release()


def test_wait_gives_up_with_none_and_lock_busy_when_the_holder_keeps_it(fleet: Fleet) -> None:
    holder = fleet.try_lock("job", keepalive=False)
    assert holder is not None

    assert fleet.try_lock("job", keepalive=False, wait="200ms") is None
    with pytest.raises(LockBusy):
        fleet.lock("job", keepalive=False, wait="100ms")


def test_the_locked_decorator_runs_when_free_and_skips_when_held(fleet: Fleet) -> None:
    calls: list[int] = []

    @fleet.locked("job", lock_at_most="5s")
    def work(value: int) -> int:
        calls.append(value)
        record = fleet.get("job")
        assert record is not None
        assert record.held
        return value * 2

    assert work(1) == 2
    holder = fleet.try_lock("job", keepalive=False)
    assert holder is not None
    assert work(2) is None
    assert holder.release()
    assert work(3) == 6
    assert calls == [1, 3]


async def test_the_locked_decorator_on_an_async_def_runs_when_free_and_skips_when_held(
    fleet: Fleet,
) -> None:
    calls: list[int] = []

    @fleet.locked("job", lock_at_most="5s")
    async def work(value: int) -> int:
        calls.append(value)
        await asyncio.sleep(0)
        return value * 2

    assert await work(1) == 2
    holder = fleet.try_lock("job", keepalive=False)
    assert holder is not None
    assert await work(2) is None
    assert holder.release()
    assert await work(3) == 6
    assert calls == [1, 3]


def test_keepalive_renews_the_lease_past_its_original_lock_at_most(
    fleet: Fleet, store: SyncStore
) -> None:
    # Long enough that a loaded machine's late renewal still lands within the lease.
    with fleet.lock("job", lock_at_most="1500ms") as lease:
        original = lease.record
        # Past the original expiry by the store's clock, by more than one renewal period.
        later = wait_for_store_time(store, fleet.namespace, "job", original.expires_us + 600_000)

        assert later.held
        assert later.fence == original.fence
        assert later.expires_us > original.expires_us
        assert fleet.try_lock("job", keepalive=False) is None
        assert lease.valid
        assert not lease.lost.is_set()
        lease.check()

    record = fleet.get("job")
    assert record is not None
    assert not record.held


def test_without_keepalive_the_lease_ends_at_lock_at_most(fleet: Fleet, store: SyncStore) -> None:
    lease = fleet.try_lock("job", lock_at_most="300ms", keepalive=False)
    assert lease is not None

    wait_until_freed(store, fleet.namespace, "job", lease.record.expires_us)

    assert not row(store, fleet.namespace, "job").held
    assert not lease.valid  # the local deadline passed before the store's expiry
    with pytest.raises(LeaseLost):
        lease.check()
    taken = fleet.try_lock("job", keepalive=False)
    assert taken is not None
    assert taken.fence > lease.fence


def test_a_lease_taken_over_reports_lost_and_leaving_the_with_block_raises_lease_lost(
    fleet: Fleet, store: SyncStore
) -> None:
    successor: list[Lease] = []
    with pytest.raises(LeaseLost) as raised:
        with fleet.lock("job", lock_at_most="1500ms") as lease:
            # Another party ends the lease in the store and takes the name over (well
            # before the next renewal, due at lock_at_most / 3).
            assert store.run(
                store.ops.lease_release(fleet.namespace, "job", lease.holder, lease.fence)
            )
            taken = fleet.try_lock("job", lock_at_most="10s", keepalive=False)
            assert taken is not None
            successor.append(taken)
            assert lease.lost.wait(10), "the refused renewal was not noticed"
            # The holder's thread may also be interrupted here, which is fine: the
            # with-statement must surface LeaseLost either way.

    assert raised.value.name == "job"
    assert raised.value.fence == lease.fence
    assert lease.lost.is_set()
    assert lease.is_lost
    assert not lease.valid
    assert successor[0].fence > lease.fence
    record = fleet.get("job")
    assert record is not None
    assert record.held
    assert record.fence == successor[0].fence


def test_a_refused_renewal_sets_lost_and_raises_lease_lost_on_leaving_the_with_block(
    watched_fleet: Fleet, watched: WatchedStore
) -> None:
    with pytest.raises(LeaseLost):
        with watched_fleet.lock("job", lock_at_most="300ms") as lease:
            watched.refuse_extend = True
            assert lease.lost.wait(10)

    assert lease.is_lost


def test_the_locked_decorator_raises_lease_lost_when_renewal_is_refused(
    watched_fleet: Fleet, watched: WatchedStore
) -> None:
    @watched_fleet.locked("job", lock_at_most="300ms")
    def work() -> None:
        watched.refuse_extend = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # pure-Python work: interrupted on loss
            time.sleep(0.01)
        pytest.fail("the work kept running on a lost lease")

    with pytest.raises(LeaseLost):
        work()


async def test_the_locked_decorator_on_an_async_def_raises_lease_lost_when_renewal_is_refused(
    watched_fleet: Fleet, watched: WatchedStore
) -> None:
    @watched_fleet.locked("job", lock_at_most="300ms")
    async def work() -> None:
        watched.refuse_extend = True
        await asyncio.sleep(10)
        pytest.fail("the work kept running on a lost lease")

    with pytest.raises(LeaseLost):
        async with asyncio.timeout(10):
            await work()


def test_a_holder_that_cannot_renew_gives_the_lease_up_before_the_store_expires_it(
    watched_fleet: Fleet, watched: WatchedStore, store: SyncStore
) -> None:
    at_loss: list[LeaseRecord] = []
    with pytest.raises(LeaseLost, match="deadline"):
        with watched_fleet.lock("job", lock_at_most="600ms") as lease:
            # Read the store at the moment of the loss (callbacks run before the holder's
            # thread is interrupted).
            lease.on_lost(lambda lost: at_loss.append(row(store, lost.namespace, lost.name)))
            watched.unreachable_for_extend = True
            assert lease.lost.wait(10)

    # The holder stopped trusting the lease while the store still held it for it: nobody
    # else could have had it yet (the local deadline is send time + ttl - margin).
    assert at_loss
    assert at_loss[0].held
    assert at_loss[0].fence == lease.fence
