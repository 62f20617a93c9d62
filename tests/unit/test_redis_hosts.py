"""Redis Cluster and Sentinel: their URLs (addresses, service, parameters, refusals) and
the errors of a cluster in failover."""

from __future__ import annotations

import pytest
import redis

from fleetcron.errors import ConfigurationError, StoreUnavailable
from fleetcron.stores.redis.hosts import listed_url
from fleetcron.stores.redis.store import translate
from fleetcron.stores.url import parse_store_url


def test_a_cluster_url_lists_its_nodes_with_the_default_port_where_none_is_given() -> None:
    url = parse_store_url("redis+cluster://10.0.0.1:7000,10.0.0.2,[::1]:7002?timeout=5")
    listed = listed_url(url, "cluster")
    assert listed.addresses == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert listed.service == ""
    assert not listed.tls
    assert listed.connection["socket_timeout"] == 5.0


def test_a_sentinel_url_names_its_sentinels_service_and_database() -> None:
    url = parse_store_url("redis+sentinel://:secret@s1,s2:26380/mymaster/2")
    listed = listed_url(url, "sentinel")
    assert listed.addresses == (("s1", 26379), ("s2", 26380))
    assert listed.service == "mymaster"
    assert listed.connection["db"] == 2
    assert listed.connection["password"] == "secret"
    assert listed.connection["username"] == "default"


def test_tls_schemes_take_the_tls_parameters() -> None:
    url = parse_store_url("rediss+cluster://n1:7000?ssl_cert_reqs=none")
    listed = listed_url(url, "cluster")
    assert listed.tls
    assert listed.connection["ssl"] is True
    assert listed.connection["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(
    ("text", "kind", "problem"),
    [
        ("redis+cluster://n1:7000/3", "cluster", "database 0 only"),
        ("redis+cluster://n1:7000?db=1", "cluster", r"unknown parameter\(s\) db"),
        ("redis+sentinel://s1:26379", "sentinel", "names no service"),
        ("redis+sentinel://s1:26379/m/1/2", "sentinel", "the path is"),
        ("redis+sentinel://s1:26379/m/1?db=2", "sentinel", "database twice"),
        ("redis+sentinel://s1:26379/m?ssl_cert_reqs=none", "sentinel", "unknown parameter"),
        ("redis+sentinel://:a@s1/m?password=b", "sentinel", "password twice"),
    ],
)
def test_what_the_deployment_cannot_mean_is_refused_naming_it(
    text: str, kind: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        listed_url(parse_store_url(text), kind)


def test_each_listed_port_is_checked_before_anything_is_opened() -> None:
    with pytest.raises(ConfigurationError, match="port must be a number"):
        parse_store_url("redis+cluster://n1:7000,n2:0")
    assert parse_store_url("redis+sentinel://s1:26379,s2:26379/m").kind == "redis-sentinel"
    assert parse_store_url("rediss+cluster://n1:7000,n2:7001").kind == "redis-cluster"


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
        redis.exceptions.TryAgainError("TRYAGAIN"),
        redis.exceptions.SlotNotCoveredError("Slot 42 is not covered by the cluster."),
        redis.exceptions.RedisClusterException("Redis Cluster cannot be connected."),
    ],
)
def test_a_cluster_in_failover_is_an_outage_not_an_error(error: Exception) -> None:
    assert isinstance(translate(error), StoreUnavailable)
