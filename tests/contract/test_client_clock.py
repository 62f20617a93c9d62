"""A client whose wall clock is far off changes nothing: the store's clock decides."""

from __future__ import annotations

import time

import pytest

from contract.contract_support import acquire, must_acquire, row, wait_for_store_time
from fleetcron import Fleet
from fleetcron.stores import SyncStore
from fleetcron.stores.memory import MemoryStore
from fleetcron.testing import FakeClock
from services import STORES

SKEW_S = 600  # the client's wall clock runs 10 minutes ahead

# The memory store's clock is this process's clock by design (its own-clock case is
# test_a_memory_store_with_its_own_clock_ignores_the_clients_wall_clock): the stores with
# a clock of their own.
STORES_WITH_A_CLOCK = pytest.mark.parametrize("backend_url", STORES, indirect=True)


@pytest.fixture
def skewed_client_clock(monkeypatch: pytest.MonkeyPatch) -> int:
    """Move this process's wall clock (``time.time``/``time.time_ns``) 10 minutes ahead.

    Yields the real time (µs) at the moment of the skew. The monotonic clock is left alone:
    it only measures the holder's own deadline.
    """
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + SKEW_S)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + SKEW_S * 1_000_000_000)
    return real_time_ns() // 1_000


@STORES_WITH_A_CLOCK
def test_a_client_clock_ten_minutes_ahead_neither_frees_a_lease_early_nor_shifts_its_times(
    store: SyncStore, namespace: str, skewed_client_clock: int
) -> None:
    real_now = skewed_client_clock
    assert abs(time.time_ns() // 1_000 - real_now - SKEW_S * 1_000_000) < 5_000_000

    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=400_000)

    # Times come from the store: near the real time, nowhere near the skewed one.
    assert abs(first.acquired_us - real_now) < 60_000_000
    assert first.expires_us == first.acquired_us + 400_000
    # By the client's clock the lease expired long ago; by the store's it has not.
    assert time.time_ns() // 1_000 > first.expires_us
    assert row(store, namespace, "job").held
    assert acquire(store, namespace, "job", "holder-2") is None

    wait_for_store_time(store, namespace, "job", first.expires_us)
    taken = must_acquire(store, namespace, "job", "holder-2")
    assert first.expires_us <= taken.acquired_us < real_now + 60_000_000
    assert taken.fence > first.fence


@STORES_WITH_A_CLOCK
def test_a_skewed_client_clock_does_not_change_what_the_lock_api_does(
    fleet: Fleet, skewed_client_clock: int
) -> None:

    lease = fleet.try_lock("job", lock_at_most="10s", keepalive=False)

    assert lease is not None
    assert abs(lease.record.acquired_us - skewed_client_clock) < 60_000_000
    assert lease.remaining_us() > 8_000_000  # the local deadline is monotonic, not wall time
    assert fleet.try_lock("job", lock_at_most="10s", keepalive=False) is None
    record = fleet.get("job")
    assert record is not None
    assert record.held
    assert lease.release()


def test_a_memory_store_with_its_own_clock_ignores_the_clients_wall_clock(
    namespace: str, skewed_client_clock: int
) -> None:
    store_clock = FakeClock()
    with Fleet(MemoryStore(clock=store_clock), namespace=namespace) as fleet:
        lease = fleet.try_lock("job", lock_at_most="400ms", keepalive=False)
        assert lease is not None
        assert lease.record.acquired_us == store_clock.wall_us()

        assert fleet.try_lock("job", lock_at_most="400ms", keepalive=False) is None
        store_clock.advance(micros=399_999)
        assert fleet.try_lock("job", lock_at_most="400ms", keepalive=False) is None
        store_clock.advance(micros=1)
        taken = fleet.try_lock("job", lock_at_most="400ms", keepalive=False)
        assert taken is not None
        assert taken.fence > lease.fence
