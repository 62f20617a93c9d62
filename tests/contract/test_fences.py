"""Fencing tokens strictly increase per name: across release, expiry, prune and data loss."""

from __future__ import annotations

import itertools
import urllib.parse

import pytest

from contract.contract_support import eventually, must_acquire, release, wait_until_freed
from fleetcron.stores import SyncStore, open_store, parse_store_url
from fleetcron.stores.memory import MemoryStore


def test_fences_strictly_increase_across_release_expiry_and_prune(
    store: SyncStore, namespace: str
) -> None:
    fences = []

    released = must_acquire(store, namespace, "job", "holder-1")
    fences.append(released.fence)
    assert release(store, released)

    expired = must_acquire(store, namespace, "job", "holder-2", ttl_us=300_000)
    fences.append(expired.fence)
    wait_until_freed(store, namespace, "job", expired.expires_us)

    taken_over = must_acquire(store, namespace, "job", "holder-3")
    fences.append(taken_over.fence)
    assert release(store, taken_over)

    pruned = eventually(lambda: store.run(store.ops.lease_prune(namespace, 1_000, False)))
    assert pruned == ["job"]
    assert store.run(store.ops.lease_get(namespace, "job")) is None

    recreated = must_acquire(store, namespace, "job", "holder-4")
    fences.append(recreated.fence)

    assert all(a < b for a, b in itertools.pairwise(fences)), fences


def test_prune_keeps_held_and_recently_used_rows_and_dry_run_deletes_nothing(
    store: SyncStore, namespace: str
) -> None:
    ops = store.ops
    must_acquire(store, namespace, "held", "holder-1")
    at_least = must_acquire(store, namespace, "at-least", "holder-2", least_us=5_000_000)
    assert release(store, at_least)  # still held until min_until
    recent = must_acquire(store, namespace, "recent", "holder-3")
    assert release(store, recent)

    assert store.run(ops.lease_prune(namespace, 3_600_000_000, False)) == []
    preview = eventually(lambda: store.run(ops.lease_prune(namespace, 1_000, True)))

    assert preview == ["recent"]
    assert [r.name for r in store.run(ops.lease_list(namespace))] == [
        "at-least",
        "held",
        "recent",
    ]
    assert store.run(ops.lease_prune(namespace, 1_000, False)) == ["recent"]
    assert [r.name for r in store.run(ops.lease_list(namespace))] == ["at-least", "held"]
    assert store.run(ops.lease_prune(namespace, 1_000, False)) == []


def test_prune_touches_only_its_own_namespace(store: SyncStore, namespace: str) -> None:
    other = f"{namespace}-other"
    for ns in (namespace, other):
        assert release(store, must_acquire(store, ns, "job", "holder-1"))

    eventually(lambda: store.run(store.ops.lease_prune(namespace, 1_000, False)))

    assert store.run(store.ops.lease_get(namespace, "job")) is None
    assert store.run(store.ops.lease_get(other, "job")) is not None


def test_memory_store_fences_keep_increasing_after_the_store_lost_all_data() -> None:
    first = MemoryStore()
    before = must_acquire(first, "ns", "job", "holder-1")
    assert release(first, before)

    after = must_acquire(MemoryStore(), "ns", "job", "holder-2")  # a restarted process

    assert after.fence > before.fence


def _redis_db(url: str, db: int) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))


@pytest.mark.parametrize("backend_url", ["redis"], indirect=True)
def test_redis_fences_keep_increasing_after_flushdb_lost_every_key(
    backend_url: str, namespace: str
) -> None:
    # FLUSHDB wipes a whole database: use db 15, never the db the other tests share.
    url = _redis_db(backend_url, 15)
    store = open_store(parse_store_url(url))
    try:
        fences = []
        for turn in range(3):
            record = must_acquire(store, namespace, "job", f"holder-{turn}")
            fences.append(record.fence)
            assert release(store, record)
        held = must_acquire(store, namespace, "held", "holder-x")

        client = store._client  # type: ignore[attr-defined]
        client.flushdb()
        assert store.run(store.ops.lease_get(namespace, "job")) is None

        after = must_acquire(store, namespace, "job", "holder-after")
        assert after.fence > max(fences)
        # The held lease was lost with the data: documented (a Redis without persistence
        # cannot keep it); what survives is the fence order.
        assert must_acquire(store, namespace, "held", "holder-y").fence > held.fence
    finally:
        store.close()


def test_fences_are_distinct_per_grant_even_within_one_store_clock_tick(
    store: SyncStore, namespace: str
) -> None:
    # Back-to-back grants can fall in one tick of a coarse store clock (SQLite: 1 ms);
    # the fence must still move on by at least one.
    fences = []
    for turn in range(20):
        record = must_acquire(store, namespace, "job", f"holder-{turn}")
        fences.append(record.fence)
        assert release(store, record)
    assert all(a < b for a, b in itertools.pairwise(fences)), fences
