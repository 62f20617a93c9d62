"""Fixtures of the contract suite: an open store and a fleet on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from etcd_server import EtcdCluster
from fleetcron import AsyncFleet, Fleet
from fleetcron.stores import SyncStore, open_store, parse_store_url
from redis_cluster import RedisCluster, RedisSentinels
from services import BACKENDS, url_of

CONTRACT_BACKENDS = (*BACKENDS, "redis-cluster", "redis-sentinel", "etcd")
"""The contract suite runs on every backend, and on Redis Cluster and Sentinel deployments
of its own (three masters and three replicas; a master, a replica and three sentinels),
and on an etcd cluster of its own (three members)."""


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(3)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def redis_sentinels() -> Iterator[RedisSentinels]:
    sentinels = RedisSentinels()
    yield sentinels
    sentinels.close()


@pytest.fixture(params=CONTRACT_BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of each backend in turn (SQLite in the test's temporary directory)."""
    kind = request.param
    if kind == "redis-cluster":
        yield request.getfixturevalue("redis_cluster").url
    elif kind == "redis-sentinel":
        yield request.getfixturevalue("redis_sentinels").url
    elif kind == "etcd":
        cluster = request.getfixturevalue("etcd_cluster")
        members = ",".join(f"{host}:{port}" for host, port in cluster.endpoints)
        yield f"etcd://{members}/fleetcron-tests"
    else:
        yield url_of(kind, tmp_path)


@pytest.fixture
def store(backend_url: str) -> Iterator[SyncStore]:
    """A connected sync store of the backend under test (schema created on first use)."""
    opened = open_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def fleet(store: SyncStore, namespace: str) -> Iterator[Fleet]:
    """A fleet over :func:`store`, in this test's own namespace."""
    with Fleet(store, namespace=namespace) as opened:
        yield opened


@pytest.fixture
async def async_fleet(backend_url: str, namespace: str) -> AsyncIterator[AsyncFleet]:
    """An :class:`AsyncFleet` connected the public way, ``await AsyncFleet.connect(url)``."""
    connected = await AsyncFleet.connect(backend_url, namespace=namespace)
    try:
        yield connected
    finally:
        await connected.close()
