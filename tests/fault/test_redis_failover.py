"""Redis Sentinel and Redis Cluster failovers, on deployments of the test's own.

Redis replicates asynchronously, so exactly once does not hold across a failover (docs/ha.md
says so). What must hold: the store finds the new master by itself, an operation during
the failover fails as an outage (never hangs past the URL's timeout, never a wrong
answer), and fences stay increasing (the promoted replica shares this host's clock). What
a failover lost is measured and printed, not asserted away.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.helpers import FLEETCRON
from fleetcron.errors import StoreUnavailable
from fleetcron.models import LeaseRecord
from fleetcron.stores import SyncStore, open_store, parse_store_url
from fleetcron.stores.redis.keys import lease_key
from redis_cluster import RedisCluster, RedisSentinels

NS = "failover"
HOLDER = "host:1:tok"
TTL = 60_000_000


def _grant(store: SyncStore, name: str) -> LeaseRecord | None:
    """One acquire then release of ``name``: the grant, or ``None`` when the store did
    not answer (an outage, bounded by the URL's timeout)."""
    try:
        record = store.run(store.ops.lease_acquire(NS, name, HOLDER, TTL, 0))
        if record is not None:
            store.run(store.ops.lease_release(NS, name, HOLDER, record.fence))
        return record
    except StoreUnavailable:
        return None


def _through_failover(
    store: SyncStore,
    name: str,
    fail: Callable[[], object],
    failed_over: Callable[[], object],
    timeout: float = 60.0,
) -> tuple[list[int], list[int], int, float]:
    """Grant ``name`` in a loop; ``fail()`` once grants flow; go on until
    ``failed_over()`` and grants flow again. Fences before and after, calls that
    failed, and seconds from the fault to the first grant after it."""
    before = [r.fence for r in (_grant(store, name) for _ in range(20)) if r is not None]
    assert before, "no grant before the fault"
    fail()
    faulted = time.monotonic()
    after: list[int] = []
    failures = 0
    resumed = None
    give_up = faulted + timeout
    while time.monotonic() < give_up:
        longest = time.monotonic()
        record = _grant(store, name)
        # Connect (2 s) and reply (5 s) timeouts, and room for a loaded machine.
        assert time.monotonic() - longest < 15, "a call outlived the URL's timeouts"
        if record is None:
            failures += 1
            time.sleep(0.02)  # polling the store until it answers again, bounded above
            continue
        if failed_over():
            if resumed is None:
                resumed = time.monotonic() - faulted
            after.append(record.fence)
            if len(after) >= 20:
                break
    assert resumed is not None, f"no grant after the failover within {timeout:g} s"
    return before, after, failures, resumed


@pytest.fixture
def sentinels() -> Iterator[RedisSentinels]:
    deployment = RedisSentinels()
    yield deployment
    deployment.close()


def test_sentinel_failover_the_store_finds_the_new_master_and_fences_keep_increasing(
    sentinels: RedisSentinels, record_property: Callable[[str, object], None]
) -> None:
    store = open_store(parse_store_url(f"{sentinels.url}?timeout=5&connect_timeout=2"))
    old = sentinels.current_master()
    try:
        before, after, failures, resumed = _through_failover(
            store,
            "sentinel",
            lambda: sentinels.nodes.kill(old),
            lambda: sentinels.current_master() != old,
        )
    finally:
        store.close()
    assert sentinels.current_master() == sentinels.replica_port
    assert min(after) > max(before), (max(before), min(after))
    record_property("resumed_after_s", round(resumed, 2))
    record_property("calls_failed", failures)


@pytest.fixture
def cluster() -> Iterator[RedisCluster]:
    deployment = RedisCluster()
    yield deployment
    deployment.close()


def test_cluster_master_sigkill_operations_resume_on_the_promoted_replica(
    cluster: RedisCluster, record_property: Callable[[str, object], None]
) -> None:
    store = open_store(parse_store_url(f"{cluster.url}?timeout=5&connect_timeout=2"))
    name = "cluster"
    victim = cluster.master_of(lease_key(NS, name))
    try:
        before, after, failures, resumed = _through_failover(
            store,
            name,
            lambda: cluster.nodes.kill(victim),
            lambda: cluster.role(victim) is None and len(cluster.masters()) == 3,
        )
        # What the store says now is what the promoted replica had: the last grants of
        # the old master may be gone (asynchronous replication), counted, not asserted.
        record = store.run(store.ops.lease_get(NS, name))
    finally:
        store.close()
    assert record is not None
    assert min(after) > max(before), (max(before), min(after))
    record_property("resumed_after_s", round(resumed, 2))
    record_property("calls_failed", failures)


def _doctor(url: str, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [*FLEETCRON, "doctor", "--backend", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    return [line for line in done.stdout.splitlines() if "redis (replication)" in line]


def test_doctor_says_a_redis_cluster_replicates_asynchronously(
    cluster: RedisCluster, tmp_path: Path
) -> None:
    [line] = _doctor(cluster.url, tmp_path)
    assert line.startswith("warn"), line
    assert "3 masters, 3 replicas" in line
    assert "asynchronous" in line


def test_doctor_says_a_sentinel_master_replicates_asynchronously(
    sentinels: RedisSentinels, tmp_path: Path
) -> None:
    [line] = _doctor(sentinels.url, tmp_path)
    assert line.startswith("warn"), line
    assert "1 connected replica(s): replication is asynchronous" in line
