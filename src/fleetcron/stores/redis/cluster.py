"""Redis Cluster (``redis+cluster://h1:7000,h2:7000``): the Redis store's keys and scripts
on a cluster client.

Every operation's keys share one hash tag (:mod:`.keys`), so each script call runs on the
one master serving that slot; a batch is split into one call per job
(``RedisOperations(cluster=True)``) and sent as one cluster pipeline (one round trip per
master). Scripts are loaded on every master (``SCRIPT LOAD`` goes to all of them) when one
does not know them, and SCANs run on every master. Redis replication is asynchronous: a
master that fails over loses the writes its replica had not received, so a claim or an
outcome acknowledged just before can vanish (docs/ha.md); ``fleetcron doctor`` says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode as _ClusterNode
from redis.retry import Retry

from fleetcron.doctor.findings import Finding
from fleetcron.errors import StoreRefused
from fleetcron.stores.base import as_text, connect_error
from fleetcron.stores.redis.connect import PERSISTENCE_MARKER, _config, check_server
from fleetcron.stores.redis.doctor import RedisFacts
from fleetcron.stores.redis.hosts import listed_url
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.scripts import SCRIPTS
from fleetcron.stores.redis.statements import ScriptArg
from fleetcron.stores.redis.store import (
    _SCRIPT_LOAD_TRIES,
    _SETTINGS,
    ERRORS,
    AsyncRedisStore,
    RedisStore,
    translate,
)
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncRedisClusterStore", "ClusterFacts", "RedisClusterStore", "open_async", "open_sync"]

# redis-py's cluster classes are untyped: used through Any.
ClusterNode: Any = _ClusterNode
_PROBED = ("maxmemory-policy", "appendonly", "save")


def _cluster_args(url: StoreURL) -> tuple[list[Any], dict[str, Any]]:
    listed = listed_url(url, "cluster")
    nodes = [ClusterNode(host, port) for host, port in listed.addresses]
    # No retries inside the client: a call that failed on the wire may have run, and the
    # caller decides (as on one server). Redirections (MOVED, ASK) are still followed.
    return nodes, dict(listed.connection)


def _check_nodes(url: str, per_node: list[list[Any]], marker: Any, *, mark: bool) -> None:
    """:func:`check_server` on the masters' replies: each must be a primary; eviction and
    persistence are warned about once, as the first master has them (a cluster's nodes
    are configured alike; ``fleetcron doctor`` reads every master)."""
    for replies in per_node[1:]:
        role = replies[0]
        if isinstance(role, Exception):
            raise role
        if as_text(role[0]) not in ("master", "primary"):
            raise StoreRefused(f"{url}: a node the cluster lists as a master is a {role[0]!r}")
    if per_node:
        check_server(url, [*per_node[0], marker], mark=mark)


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """What ``fleetcron doctor`` judges of a Redis Cluster: each master's settings
    (``masters``, by address) and how many replicas the cluster has."""

    masters: tuple[tuple[str, RedisFacts], ...]
    replicas: int

    def findings(self) -> list[Finding]:
        """Persistence and eviction per master (the first master's wording, every
        master named where they differ), and the replication finding."""
        findings: list[Finding] = []
        seen: dict[tuple[str, str, str], list[str]] = {}
        for address, facts in self.masters:
            for finding in facts.findings()[:2]:
                key = (finding.level, finding.check, finding.message)
                if key not in seen:
                    seen[key] = []
                    findings.append(finding)
                seen[key].append(address)
        named = []
        for finding in findings:
            where = seen[(finding.level, finding.check, finding.message)]
            prefix = "every master" if len(where) == len(self.masters) else ", ".join(where)
            named.append(
                Finding(
                    level=finding.level,
                    check=finding.check,
                    message=f"{prefix}: {finding.message}",
                    advice=finding.advice,
                )
            )
        named.append(
            Finding(
                level="warn",
                check="redis (replication)",
                message=f"Redis Cluster, {len(self.masters)} masters, {self.replicas} "
                "replicas: replication is asynchronous",
                advice="a master that fails over loses what its replica had not received: "
                "a slot claimed or finished just before can lose its ledger row and run "
                "again, and a lease can be granted twice; fences stay increasing while the "
                "promoted replica's clock is not behind (docs/ha.md)",
            )
        )
        return named


class RedisClusterStore(RedisStore):
    """Sync Redis Cluster store: :class:`RedisStore`'s operations on a cluster client."""

    _client: Any  # a redis.RedisCluster (redis-py's cluster classes are untyped)

    def __init__(self, url: StoreURL, *, create: bool = True) -> None:
        self.url = url.redacted
        self.ops = RedisOperations(cluster=True)
        self._lock = threading.Lock()
        self._closed = False
        nodes, args = _cluster_args(url)
        cluster_class: Any = redis.RedisCluster
        try:
            self._client = cluster_class(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **args)
        except ERRORS as exc:
            raise connect_error(self.url, translate(exc)) from exc
        self._scripts = {name: self._client.register_script(text) for name, text in SCRIPTS.items()}
        try:
            per_node = [self._node_probe(node) for node in self._client.get_primaries()]
            if create:
                marker = self._client.set(PERSISTENCE_MARKER, "1", nx=True)
            else:
                marker = self._client.get(PERSISTENCE_MARKER)
            _check_nodes(self.url, per_node, marker, mark=create)
        except ERRORS as exc:
            self._client.close()
            raise connect_error(self.url, translate(exc)) from exc
        except StoreRefused:
            self._client.close()
            raise

    def _node_probe(self, node: Any, settings: tuple[str, ...] = _PROBED) -> list[Any]:
        """``ROLE`` and ``settings`` of one master, in one round trip."""
        client = self._client.get_redis_connection(node)
        with client.pipeline(transaction=False) as pipe:
            pipe.execute_command("ROLE")
            for key in settings:
                pipe.config_get(key)
            return list(pipe.execute(raise_on_error=False))

    def _call(self, script: Any, keys: tuple[str, ...], args: tuple[ScriptArg, ...]) -> Any:
        """One ``EVALSHA`` through the cluster client, on the master of the keys' slot
        (there is no one connection to keep, as :class:`RedisStore` does)."""
        for _ in range(_SCRIPT_LOAD_TRIES):
            try:
                return self._client.evalsha(script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                script.sha = self._client.script_load(script.script)  # on every master
        raise redis.exceptions.NoScriptError("the script cache keeps being flushed")

    def doctor_facts(self) -> tuple[ClusterFacts]:  # type: ignore[override]
        """Each master's settings and the cluster's replication (for ``fleetcron doctor``)."""
        with self._lock:
            masters = []
            for node in self._client.get_primaries():
                role, *configs = self._node_probe(node, _SETTINGS)
                read = [_config(reply, key) for reply, key in zip(configs, _SETTINGS, strict=True)]
                refused = next((r for r in configs if isinstance(r, Exception)), None)
                masters.append(
                    (
                        f"{node.host}:{node.port}",
                        RedisFacts(
                            role=as_text(role[0]) if not isinstance(role, Exception) else "?",
                            replicas=len(role[2])
                            if isinstance(role, list) and len(role) > 2
                            else 0,
                            appendonly=read[0],
                            appendfsync=read[1],
                            save=read[2],
                            maxmemory_policy=read[3],
                            config_error=None if refused is None else str(refused),
                        ),
                    )
                )
        return (ClusterFacts(tuple(masters), sum(facts.replicas for _, facts in masters)),)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._client.close()


async def _node_probe_async(cluster: Any, node: Any) -> list[Any]:
    """``ROLE`` and the settings :func:`check_server` reads, of one master."""
    replies: list[Any] = [await cluster.execute_command("ROLE", target_nodes=node)]
    for key in _PROBED:
        try:
            replies.append(await cluster.config_get(key, target_nodes=node))
        except redis.exceptions.ResponseError as exc:  # CONFIG disabled (managed Redis)
            replies.append(exc)
    return replies


class AsyncRedisClusterStore(AsyncRedisStore):
    """Async Redis Cluster store (``redis.asyncio.RedisCluster``): :class:`AsyncRedisStore`'s
    operations on a cluster client."""

    _client: Any  # a redis.asyncio.RedisCluster

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations(cluster=True)
        nodes, args = _cluster_args(url)
        cluster_class: Any = aioredis.RedisCluster
        self._client = cluster_class(
            startup_nodes=[aioredis.cluster.ClusterNode(n.host, n.port) for n in nodes],
            retry=AsyncRetry(NoBackoff(), 0),
            **args,
        )
        self._scripts = {name: self._client.register_script(text) for name, text in SCRIPTS.items()}

    async def open(self, *, create: bool = True) -> None:
        """Connect and check every master (as :class:`RedisClusterStore` does)."""
        try:
            await self._client.initialize()
            per_node = [
                await _node_probe_async(self._client, node) for node in self._client.get_primaries()
            ]
            if create:
                marker = await self._client.set(PERSISTENCE_MARKER, "1", nx=True)
            else:
                marker = await self._client.get(PERSISTENCE_MARKER)
            _check_nodes(self.url, per_node, marker, mark=create)
        except ERRORS as exc:
            await self._client.aclose()
            raise connect_error(self.url, translate(exc)) from exc
        except StoreRefused:
            await self._client.aclose()
            raise

    async def close(self) -> None:
        await self._client.aclose()


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> RedisClusterStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`)."""
    return RedisClusterStore(url, create=create)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncRedisClusterStore:
    """The backend's async entry point."""
    store = AsyncRedisClusterStore(url)
    await store.open(create=create)
    return store
