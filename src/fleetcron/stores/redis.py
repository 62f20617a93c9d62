"""Redis store (redis-py): one Lua script per operation, so each is one round trip.

A lease is a hash with no TTL — like a SQL row it stays until ``prune`` — and expiry is
decided inside the script by the server's ``TIME``. The fence is
``max(previous + 1, TIME in µs)``: it keeps increasing even after a restart that lost
every key, as long as the server clock does not step back. Keys are hash-tagged
``fleetcron:{<len(ns)>:<ns>:<name>}`` so each operation touches one Cluster slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

from fleetcron.errors import ConfigurationError, FleetcronError, StoreError, StoreUnavailable
from fleetcron.models import LeaseRecord
from fleetcron.stores.base import Capability, Operation, Statement, drive, drive_async
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncRedisStore", "RedisOperations", "RedisStore", "lease_key"]

T = TypeVar("T")
log = logging.getLogger("fleetcron")

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function s(n) return string.format('%d', n) end
"""

LEASE_ACQUIRE = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, ttl_us, least_us, namespace, name
-- returns false when held at TIME, else {fence, now} as integers (exact below 2^53;
-- the caller derives expires = now + ttl and min_until = now + least)
local cur = redis.call('HMGET', KEYS[1], 'expires', 'fence')
if cur[1] and tonumber(cur[1]) > now then return false end
local fence = now
if cur[2] and tonumber(cur[2]) + 1 > fence then fence = tonumber(cur[2]) + 1 end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'fence', s(fence), 'acquired', s(now),
           'expires', s(now + tonumber(ARGV[2])), 'min_until', s(now + tonumber(ARGV[3])))
if not cur[2] then redis.call('HSET', KEYS[1], 'ns', ARGV[4], 'name', ARGV[5]) end
return {fence, now}
"""
)

LEASE_EXTEND = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, fence, ttl_us
-- returns false unless held by exactly (holder, fence),
-- else {fence, acquired, expires, min_until, now}
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until', 'acquired')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return false end
local expires = math.max(now + tonumber(ARGV[3]), tonumber(cur[4]))
redis.call('HSET', KEYS[1], 'expires', s(expires))
return {cur[2], cur[5], s(expires), cur[4], s(now)}
"""
)

LEASE_RELEASE = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, fence
-- returns 1 when released (expiry = max(now, min_until)), 0 when not ours: nothing changes
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'expires', s(math.max(now, tonumber(cur[4]))))
return 1
"""
)

LEASE_GET = (
    _NOW
    + """
-- KEYS[1] lease hash; returns false when absent,
-- else {holder, fence, acquired, expires, min_until, now, name}
local cur = redis.call('HMGET', KEYS[1],
                      'holder', 'fence', 'acquired', 'expires', 'min_until', 'name')
if not cur[2] then return false end
return {cur[1], cur[2], cur[3], cur[4], cur[5], s(now), cur[6]}
"""
)

LEASE_PRUNE = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: older_than_us, dry_run (1/0)
-- returns the name when the row is (or would be) deleted, else false
local cur = redis.call('HMGET', KEYS[1], 'expires', 'min_until', 'fence', 'name')
if not cur[1] then return false end
local limit = now - tonumber(ARGV[1])
if tonumber(cur[1]) < limit and tonumber(cur[2]) < limit and tonumber(cur[3]) < now then
  if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) end
  return cur[4]
end
return false
"""
)

SCRIPTS = {
    "lease_acquire": LEASE_ACQUIRE,
    "lease_extend": LEASE_EXTEND,
    "lease_release": LEASE_RELEASE,
    "lease_get": LEASE_GET,
    "lease_prune": LEASE_PRUNE,
}


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lease_key(namespace: str, name: str) -> str:
    """The hash-tagged key of a lease; the length prefix keeps ``ns``/``name`` unambiguous."""
    return f"fleetcron:{{{len(namespace)}:{namespace}:{name}}}"


def _namespace_pattern(namespace: str) -> str:
    return f"fleetcron:{{{len(namespace)}:{_glob_escape(namespace)}:*"


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _record(namespace: str, name: str, holder: str, reply: list[Any]) -> LeaseRecord:
    fence, acquired, expires, min_until, now = (int(_text(v)) for v in reply[:5])
    return LeaseRecord(
        namespace=namespace,
        name=name,
        holder=holder,
        fence=fence,
        acquired_us=acquired,
        expires_us=expires,
        min_until_us=min_until,
        now_us=now,
    )


def _from_get(namespace: str, reply: Any) -> LeaseRecord | None:
    if not reply:
        return None
    holder, name = _text(reply[0]), _text(reply[6])
    return _record(namespace, name, holder, reply[1:6])


class RedisOperations:
    """Lease operations as script invocations."""

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        reply = yield Statement(
            "lease_acquire",
            {"argv": (holder, ttl_us, least_us, namespace, name)},
            keys=(lease_key(namespace, name),),
        )
        if not reply:
            return None
        fence, now = int(reply[0]), int(reply[1])
        return LeaseRecord(
            namespace=namespace,
            name=name,
            holder=holder,
            fence=fence,
            acquired_us=now,
            expires_us=now + ttl_us,
            min_until_us=now + least_us,
            now_us=now,
        )

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        reply = yield Statement(
            "lease_extend", {"argv": (holder, fence, ttl_us)}, keys=(lease_key(namespace, name),)
        )
        return _record(namespace, name, holder, reply) if reply else None

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        reply = yield Statement(
            "lease_release", {"argv": (holder, fence)}, keys=(lease_key(namespace, name),)
        )
        return bool(reply)

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        reply = yield Statement("lease_get", {"argv": ()}, keys=(lease_key(namespace, name),))
        return _from_get(namespace, reply)

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        keys = yield Statement("scan", {"match": _namespace_pattern(namespace)})
        replies = yield Statement("lease_get[]", {"argv": ()}, keys=tuple(keys))
        records = [r for r in (_from_get(namespace, reply) for reply in replies) if r]
        return sorted(records, key=lambda record: record.name)

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        keys = yield Statement("scan", {"match": _namespace_pattern(namespace)})
        replies = yield Statement(
            "lease_prune[]", {"argv": (older_than_us, 1 if dry_run else 0)}, keys=tuple(keys)
        )
        return sorted(_text(reply) for reply in replies if reply)


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a redis-py exception to fleetcron's hierarchy."""
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return ConfigurationError(
            "the Redis server is a read-only replica; point the backend URL at the primary"
        )
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return StoreError(f"Redis refused the credentials or command: {exc}")
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return StoreUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, redis.exceptions.RedisError):
        return StoreError(f"Redis error: {exc}")
    return None


def _client_kwargs() -> dict[str, Any]:
    return {
        "socket_connect_timeout": 10,
        "socket_timeout": 30,
        "socket_keepalive": True,
        "health_check_interval": 0,
    }


def _warn_about_config(url: str, policy: str | None, role: str | None) -> None:
    if role and role not in ("master", "primary"):
        raise ConfigurationError(f"{url} is a Redis {role}, not a primary; point at the primary")
    if policy and policy.startswith("allkeys-"):
        log.warning(
            "Redis maxmemory-policy is %s: lease hashes can be evicted under memory "
            "pressure (fences stay monotonic; a lease may be lost early)",
            policy,
            extra={"action": "store_warning", "store": url},
        )


class RedisStore:
    """Sync Redis store."""

    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations()
        self._lock = threading.Lock()
        self._client: redis.Redis = redis.Redis.from_url(url.raw, **_client_kwargs())
        self._scripts: dict[str, Script] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }
        try:
            role = self._client.execute_command("ROLE")[0]  # type: ignore[no-untyped-call]
            policy = self._config_get("maxmemory-policy")
        except redis.exceptions.RedisError as exc:
            self._client.close()
            error = translate(exc)
            assert error is not None
            raise StoreUnavailable(f"cannot connect to {self.url}: {error.message}") from exc
        _warn_about_config(self.url, policy, _text(role))

    def _config_get(self, key: str) -> str | None:
        try:
            reply = self._client.config_get(key)
        except redis.exceptions.ResponseError:  # CONFIG may be disabled (managed Redis)
            return None
        value = reply.get(key) if isinstance(reply, dict) else None
        return _text(value) if value is not None else None

    def _execute(self, statement: Statement) -> Any:
        if statement.name == "scan":
            return [_text(k) for k in self._client.scan_iter(match=str(statement.params["match"]))]
        argv = list(statement.params.get("argv", ()))  # type: ignore[call-overload]
        if statement.name.endswith("[]"):
            script = self._scripts[statement.name[:-2]]
            pipe = self._client.pipeline(transaction=False)
            for key in statement.keys:
                script(keys=[key], args=argv, client=pipe)
            return pipe.execute() if statement.keys else []
        return self._scripts[statement.name](keys=list(statement.keys), args=argv)

    def _guarded(self, statement: Statement) -> Any:
        try:
            return self._execute(statement)
        except redis.exceptions.RedisError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    def run(self, operation: Operation[T]) -> T:
        with self._lock:
            return drive(operation, self._guarded)

    def migrate(self) -> list[str]:
        """Redis keeps no schema; nothing to apply."""
        return []

    def close(self) -> None:
        self._client.close()


class AsyncRedisStore:
    """Async Redis store (``redis.asyncio``)."""

    capabilities = RedisStore.capabilities

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations()
        self._client: aioredis.Redis = aioredis.Redis.from_url(url.raw, **_client_kwargs())
        self._scripts: dict[str, AsyncScript] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }

    async def open(self) -> None:
        try:
            role = (await self._client.execute_command("ROLE"))[0]  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError as exc:
            await self._client.aclose()
            raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        _warn_about_config(self.url, None, _text(role))

    async def _execute(self, statement: Statement) -> Any:
        try:
            if statement.name == "scan":
                match = str(statement.params["match"])
                return [_text(k) async for k in self._client.scan_iter(match=match)]
            argv = list(statement.params.get("argv", ()))  # type: ignore[call-overload]
            if statement.name.endswith("[]"):
                script = self._scripts[statement.name[:-2]]
                return list(
                    await asyncio.gather(*(script(keys=[k], args=argv) for k in statement.keys))
                )
            return await self._scripts[statement.name](keys=list(statement.keys), args=argv)
        except redis.exceptions.RedisError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    async def run(self, operation: Operation[T]) -> T:
        return await drive_async(operation, self._execute)

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        await self._client.aclose()
