"""The lease operations of every backend (ShedLock's provider test list, plus fencing).

Each test drives ``store.ops`` directly, so what is checked is the store, not the API.
"""

from __future__ import annotations

import time

from contract.contract_support import (
    acquire,
    expiry_slack_us,
    must_acquire,
    release,
    row,
    stored,
    wait_for_store_time,
    wait_until_freed,
)
from fleetcron.stores import SyncStore
from fleetcron.stores.memory import MemoryStore
from fleetcron.testing import FakeClock


def test_a_free_name_is_acquired_with_the_requested_length_on_the_store_clock(
    store: SyncStore, namespace: str
) -> None:
    record = must_acquire(store, namespace, "job", "holder-1", ttl_us=5_000_000, least_us=1_000)

    assert (record.namespace, record.name, record.holder) == (namespace, "job", "holder-1")
    assert record.acquired_us == record.now_us
    assert record.expires_us == record.acquired_us + 5_000_000
    assert record.min_until_us == record.acquired_us + 1_000
    assert record.fence >= 1
    assert stored(row(store, namespace, "job")) == stored(record)


def test_a_held_name_is_refused_to_every_other_holder_and_the_row_is_unchanged(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1")

    assert acquire(store, namespace, "job", "holder-2") is None
    assert acquire(store, namespace, "job", "holder-1") is None  # not re-entrant either
    assert stored(row(store, namespace, "job")) == stored(first)


def test_independent_names_do_not_block_each_other(store: SyncStore, namespace: str) -> None:
    first = must_acquire(store, namespace, "alpha", "holder-1")
    second = must_acquire(store, namespace, "beta", "holder-2")

    assert acquire(store, namespace, "alpha", "holder-3") is None
    assert acquire(store, namespace, "beta", "holder-3") is None
    assert release(store, first)
    assert stored(row(store, namespace, "beta")) == stored(second)
    assert acquire(store, namespace, "beta", "holder-3") is None


def test_the_same_name_in_another_namespace_is_another_lease(
    store: SyncStore, namespace: str
) -> None:
    must_acquire(store, namespace, "job", "holder-1")
    other = must_acquire(store, f"{namespace}-other", "job", "holder-2")

    assert other.namespace == f"{namespace}-other"
    assert [r.holder for r in store.run(store.ops.lease_list(namespace))] == ["holder-1"]
    assert [r.holder for r in store.run(store.ops.lease_list(f"{namespace}-other"))] == ["holder-2"]


def test_a_name_can_be_locked_again_right_after_release_ten_times_in_a_row(
    store: SyncStore, namespace: str
) -> None:
    fences = []
    for turn in range(10):
        record = must_acquire(store, namespace, "job", f"holder-{turn}")
        fences.append(record.fence)
        assert release(store, record)
        assert not row(store, namespace, "job").held

    assert fences == sorted(set(fences)), "fences must strictly increase"


def test_release_is_only_effective_once(store: SyncStore, namespace: str) -> None:
    record = must_acquire(store, namespace, "job", "holder-1")

    assert release(store, record) is True
    released = row(store, namespace, "job")
    assert release(store, record) is False
    assert stored(row(store, namespace, "job")) == stored(released)


def test_a_lease_is_refused_before_its_expiry_and_free_at_it_by_the_store_clock(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=400_000)
    assert first.expires_us == first.acquired_us + 400_000

    # Close in on the boundary, then try often: each refusal must have happened while the
    # store's clock was still before the expiry (on etcd: before etcd counted the lease's
    # whole seconds out), and the first success at or after it.
    slack = expiry_slack_us(store)
    wait_for_store_time(store, namespace, "job", first.expires_us - 80_000)
    refused_just_before = 0
    deadline = time.monotonic() + 5
    while True:
        before = row(store, namespace, "job").now_us
        taken = acquire(store, namespace, "job", "holder-2", ttl_us=400_000)
        if taken is not None:
            break
        after = row(store, namespace, "job").now_us
        assert before < first.expires_us + slack, "refused although the store clock was past expiry"
        refused_just_before += after < first.expires_us
        assert time.monotonic() < deadline, "the lease never became free"
        time.sleep(0.002)

    # (etcd's store clock, the low bound of its member's, may jump forward while its
    # bounds narrow after the store opened: no refusal need fall in the last 80 ms)
    assert refused_just_before >= 1 or slack
    assert taken.acquired_us >= first.expires_us, "granted before the store clock reached expiry"
    assert taken.acquired_us - first.expires_us < 1_000_000 + slack, "freed much later than expiry"
    assert taken.fence > first.fence


def test_memory_store_frees_a_lease_exactly_at_its_expiry_microsecond() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    first = must_acquire(store, "ns", "job", "holder-1", ttl_us=1_000)

    clock.advance(micros=999)
    assert acquire(store, "ns", "job", "holder-2") is None
    assert row(store, "ns", "job").held

    clock.advance(micros=1)
    assert not row(store, "ns", "job").held
    taken = must_acquire(store, "ns", "job", "holder-2")
    assert taken.acquired_us == first.expires_us
    assert taken.fence > first.fence


def test_lock_at_least_keeps_a_released_lease_held_until_min_until_then_frees_it(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=5_000_000, least_us=400_000)

    assert release(store, first) is True
    kept = row(store, namespace, "job")
    assert kept.expires_us == first.min_until_us
    assert kept.held
    assert acquire(store, namespace, "job", "holder-2") is None

    wait_until_freed(store, namespace, "job", first.min_until_us)
    taken = must_acquire(store, namespace, "job", "holder-2")
    assert taken.acquired_us >= first.min_until_us
    assert taken.fence > first.fence


def test_the_holder_extends_its_lease_from_the_store_clock_keeping_fence_and_start(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=1_000_000)

    extended = store.run(
        store.ops.lease_extend(namespace, "job", "holder-1", first.fence, 5_000_000)
    )

    assert extended is not None
    assert extended.expires_us == extended.now_us + 5_000_000
    assert extended.expires_us > first.expires_us
    assert (extended.fence, extended.holder, extended.acquired_us) == (
        first.fence,
        "holder-1",
        first.acquired_us,
    )
    assert stored(row(store, namespace, "job")) == stored(extended)
    again = store.run(store.ops.lease_extend(namespace, "job", "holder-1", first.fence, 6_000_000))
    assert again is not None
    assert again.expires_us > extended.expires_us


def test_an_extension_never_ends_the_lease_before_lock_at_least(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=5_000_000, least_us=3_000_000)

    extended = store.run(store.ops.lease_extend(namespace, "job", "holder-1", first.fence, 100_000))

    assert extended is not None
    assert extended.expires_us == first.min_until_us


def test_extend_and_release_by_another_holder_change_nothing(
    store: SyncStore, namespace: str
) -> None:
    first = must_acquire(store, namespace, "job", "holder-1")
    ops = store.ops

    assert (
        store.run(ops.lease_extend(namespace, "job", "intruder", first.fence, 60_000_000)) is None
    )
    assert store.run(ops.lease_release(namespace, "job", "intruder", first.fence)) is False
    assert store.run(ops.lease_extend(namespace, "nope", "holder-1", first.fence, 1_000)) is None
    assert store.run(ops.lease_release(namespace, "nope", "holder-1", first.fence)) is False
    assert stored(row(store, namespace, "job")) == stored(first)


def test_extend_and_release_with_an_old_fence_change_nothing(
    store: SyncStore, namespace: str
) -> None:
    old = must_acquire(store, namespace, "job", "holder-1")
    assert release(store, old)
    current = must_acquire(store, namespace, "job", "holder-1")  # same holder id, new fence
    assert current.fence > old.fence
    ops = store.ops

    assert store.run(ops.lease_extend(namespace, "job", "holder-1", old.fence, 60_000_000)) is None
    assert store.run(ops.lease_release(namespace, "job", "holder-1", old.fence)) is False
    assert stored(row(store, namespace, "job")) == stored(current)


def test_extend_and_release_after_expiry_change_nothing(store: SyncStore, namespace: str) -> None:
    first = must_acquire(store, namespace, "job", "holder-1", ttl_us=300_000)
    wait_until_freed(store, namespace, "job", first.expires_us)
    ops = store.ops

    assert (
        store.run(ops.lease_extend(namespace, "job", "holder-1", first.fence, 60_000_000)) is None
    )
    assert store.run(ops.lease_release(namespace, "job", "holder-1", first.fence)) is False
    assert stored(row(store, namespace, "job")) == stored(first)
    assert must_acquire(store, namespace, "job", "holder-2").fence > first.fence


def test_get_of_a_name_never_acquired_is_none_and_list_of_an_empty_namespace_is_empty(
    store: SyncStore, namespace: str
) -> None:
    assert store.run(store.ops.lease_get(namespace, "never")) is None
    assert store.run(store.ops.lease_list(namespace)) == []


def test_list_returns_every_row_of_the_namespace_held_or_not_sorted_by_name(
    store: SyncStore, namespace: str
) -> None:
    held = must_acquire(store, namespace, "b-held", "holder-1")
    free = must_acquire(store, namespace, "a-free", "holder-2")
    assert release(store, free)
    must_acquire(store, f"{namespace}-other", "c-elsewhere", "holder-3")

    listed = store.run(store.ops.lease_list(namespace))

    assert [r.name for r in listed] == ["a-free", "b-held"]
    assert [r.held for r in listed] == [False, True]
    assert stored(listed[1]) == stored(held)
    assert all(r.namespace == namespace for r in listed)
