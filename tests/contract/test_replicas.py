"""Replica heartbeats on every backend (docs/design/replicas.md): a beat upserts the
replica's row at the store's clock, a row counts as up until its expiry on that clock, a
clean stop deletes it, and a later beat prunes rows expired longer than the retention.

Each test drives ``store.ops`` directly and waits on the store's clock, never for a fixed
time.
"""

from __future__ import annotations

import dataclasses
import time

from fleetcron.models import REPLICA_RETAIN_US, ReplicaInfo, ReplicaRecord
from fleetcron.stores import SyncStore

TTL_LONG_US = 30_000_000  # longer than any test: never expires by itself
HOUR_US = 3_600_000_000


def info(replica_id: str = "host-a:101:0a1b2c3d", **changes: object) -> ReplicaInfo:
    replica = ReplicaInfo(
        replica_id=replica_id,
        host="host-a",
        pid=101,
        version="1.2.3",
        mode="claim",
        jobs_fingerprint="f" * 32,
    )
    return dataclasses.replace(replica, **changes)  # type: ignore[arg-type]


def beat(
    store: SyncStore,
    namespace: str,
    replica: ReplicaInfo,
    *,
    ttl_us: int = TTL_LONG_US,
    retain_us: int = REPLICA_RETAIN_US,
) -> ReplicaRecord:
    return store.run(store.ops.replica_beat(namespace, replica, ttl_us, retain_us))


def listed(
    store: SyncStore, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
) -> list[ReplicaRecord]:
    return store.run(store.ops.replica_list(namespace, gone_within_us))


def ids(records: list[ReplicaRecord]) -> list[str]:
    return [record.replica_id for record in records]


def wait_for_store_now(store: SyncStore, target_us: int, *, timeout: float = 10.0) -> int:
    """Poll the store's clock until it has passed ``target_us``; return its reading."""
    give_up = time.monotonic() + timeout
    while True:
        now = store.run(store.ops.store_now())
        if now > target_us:
            return now
        assert time.monotonic() < give_up, "the store clock did not reach the target"
        time.sleep(min(max((target_us - now) / 1e6, 0.001), 0.05))


def test_a_beat_lists_the_replica_with_every_field_on_the_store_clock(
    store: SyncStore, namespace: str
) -> None:
    replica = info()

    written = beat(store, namespace, replica, ttl_us=TTL_LONG_US)

    assert written.started_us == written.last_seen_us == written.now_us
    assert written.expires_us == written.last_seen_us + TTL_LONG_US
    (record,) = listed(store, namespace)
    assert record == dataclasses.replace(written, now_us=record.now_us)
    assert (record.namespace, record.replica_id, record.host, record.pid) == (
        namespace,
        "host-a:101:0a1b2c3d",
        "host-a",
        101,
    )
    assert (record.version, record.mode, record.jobs_fingerprint) == ("1.2.3", "claim", "f" * 32)
    assert record.now_us >= written.now_us
    assert record.alive
    assert not record.gone
    assert ids(listed(store, namespace, 0)) == [replica.replica_id]


def test_replicas_are_listed_by_replica_id(store: SyncStore, namespace: str) -> None:
    for replica_id in ("host-c:3:cc", "host-a:1:aa", "host-b:2:bb"):
        beat(store, namespace, info(replica_id))

    assert ids(listed(store, namespace)) == ["host-a:1:aa", "host-b:2:bb", "host-c:3:cc"]


def test_a_second_beat_moves_last_seen_and_expiry_and_keeps_started(
    store: SyncStore, namespace: str
) -> None:
    first = beat(store, namespace, info())
    wait_for_store_now(store, first.last_seen_us)

    second = beat(store, namespace, info(mode="leader", version="1.2.4"), ttl_us=2 * TTL_LONG_US)

    assert second.started_us == first.started_us
    assert second.last_seen_us > first.last_seen_us
    assert second.expires_us == second.last_seen_us + 2 * TTL_LONG_US
    (record,) = listed(store, namespace)
    assert (record.started_us, record.last_seen_us) == (first.started_us, second.last_seen_us)
    assert (record.mode, record.version) == ("leader", "1.2.4")


def test_a_replica_that_stops_beating_expires_by_the_store_clock_and_is_then_listed_gone(
    store: SyncStore, namespace: str
) -> None:
    written = beat(store, namespace, info(), ttl_us=200_000)
    assert ids(listed(store, namespace, 0)) == ["host-a:101:0a1b2c3d"]

    wait_for_store_now(store, written.expires_us)

    assert listed(store, namespace, 0) == []  # not up any more
    (gone,) = listed(store, namespace)  # still shown within the retention
    assert gone.gone
    assert not gone.alive
    assert gone.now_us >= gone.expires_us
    assert gone.silent_us >= 200_000
    assert gone.last_seen_us == written.last_seen_us


def test_leaving_deletes_the_row(store: SyncStore, namespace: str) -> None:
    beat(store, namespace, info("host-a:1:aa"))
    beat(store, namespace, info("host-b:2:bb"))

    assert store.run(store.ops.replica_leave(namespace, "host-a:1:aa")) is True

    assert ids(listed(store, namespace, HOUR_US)) == ["host-b:2:bb"]
    assert store.run(store.ops.replica_leave(namespace, "host-a:1:aa")) is False
    assert store.run(store.ops.replica_leave(namespace, "never-beat")) is False


def test_a_later_beat_prunes_rows_expired_longer_than_the_retention_and_keeps_the_others(
    store: SyncStore, namespace: str
) -> None:
    retain_us = 1_000_000
    old = beat(store, namespace, info("host-a:1:old"), ttl_us=1_000)
    wait_for_store_now(store, old.expires_us + retain_us)
    recent = beat(store, namespace, info("host-b:2:recent"), ttl_us=1_000)
    wait_for_store_now(store, recent.expires_us)
    # Both are still there for a reader that asks for an hour of departed replicas.
    assert ids(listed(store, namespace, HOUR_US)) == ["host-a:1:old", "host-b:2:recent"]

    pruner = beat(store, namespace, info("host-c:3:live"), retain_us=retain_us)

    assert pruner.now_us - recent.expires_us < retain_us  # the recent one is within it
    assert ids(listed(store, namespace, HOUR_US)) == ["host-b:2:recent", "host-c:3:live"]


def test_the_namespaces_of_replicas_are_separate(store: SyncStore, namespace: str) -> None:
    other = f"{namespace}-other"
    beat(store, namespace, info("host-a:1:aa"))
    beat(store, other, info("host-a:1:aa", mode="leader"))
    beat(store, other, info("host-b:2:bb"))

    assert store.run(store.ops.replica_leave(namespace, "host-a:1:aa"))

    assert listed(store, namespace) == []
    assert ids(listed(store, other)) == ["host-a:1:aa", "host-b:2:bb"]
    assert {r.namespace for r in listed(store, other)} == {other}
    assert listed(store, other)[0].mode == "leader"


def test_replica_rows_are_no_leases_runs_or_jobs(store: SyncStore, namespace: str) -> None:
    beat(store, namespace, info("host-a:1:ends-with-brace}"), ttl_us=1_000)
    beat(store, namespace, info("host-b:2:bb"))

    assert store.run(store.ops.lease_list(namespace)) == []
    assert store.run(store.ops.lease_prune(namespace, 0, False)) == []
    assert store.run(store.ops.job_list(namespace)) == []
    assert store.run(store.ops.run_list(namespace, None, 10)) == []
    assert store.run(store.ops.run_prune(namespace, 0, 0)) == 0
    assert len(listed(store, namespace)) == 2
