"""Redis behind Sentinel (``redis+sentinel://s1:26379,s2:26379/mymaster``): the Redis store
on the master the sentinels name, found again after a failover.

Each connection asks the sentinels for the master's address when it connects; a
connection still on a master that was demoted is answered ``READONLY``, which redis-py's
Sentinel connection turns into a lost connection: the operation fails as an outage
(``StoreUnavailable``, retried like one) and the next connects to the new master. Redis
replication is asynchronous: what the old master acknowledged and its replica had not
received is lost at the failover (docs/ha.md).
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel
import redis.sentinel

from fleetcron.stores.redis.hosts import listed_url
from fleetcron.stores.redis.store import AsyncRedisStore, RedisStore
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncRedisSentinelStore", "RedisSentinelStore", "open_async", "open_sync"]

# redis-py's Sentinel classes are untyped: used through Any.
_Sentinel: Any = redis.sentinel.Sentinel
_AsyncSentinel: Any = redis.asyncio.sentinel.Sentinel


def _sentinel_args(
    url: StoreURL,
) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """``(sentinels, service, the master's connection arguments, the sentinels')``."""
    listed = listed_url(url, "sentinel")
    master = dict(listed.connection)
    sentinel_password = url.query.get("sentinel_password")
    sentinels = {
        key: value for key, value in master.items() if key not in ("db", "password", "username")
    }
    if sentinel_password:
        sentinels["password"] = sentinel_password
    return list(listed.addresses), listed.service, master, sentinels


class RedisSentinelStore(RedisStore):
    """Sync store on the master Sentinel names (:class:`RedisStore`'s operations)."""

    def _new_client(self, url: StoreURL) -> redis.Redis:
        addresses, service, master, sentinels = _sentinel_args(url)
        sentinel = _Sentinel(addresses, sentinel_kwargs=sentinels, **master)
        client: redis.Redis = sentinel.master_for(service, **master)
        return client


class AsyncRedisSentinelStore(AsyncRedisStore):
    """Async store on the master Sentinel names."""

    def _new_client(self, url: StoreURL) -> aioredis.Redis:
        addresses, service, master, sentinels = _sentinel_args(url)
        sentinel = _AsyncSentinel(addresses, sentinel_kwargs=sentinels, **master)
        client: aioredis.Redis = sentinel.master_for(service, **master)
        return client


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> RedisSentinelStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`)."""
    return RedisSentinelStore(url, create=create)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncRedisSentinelStore:
    """The backend's async entry point."""
    store = AsyncRedisSentinelStore(url)
    await store.open(create=create)
    return store
