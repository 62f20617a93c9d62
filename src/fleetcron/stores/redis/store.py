"""The Redis store (redis-py), sync and async: one Lua script per operation, so each is
one round trip; a batch of calls is one pipeline. The keys and the operations are in
:mod:`fleetcron.stores.redis.operations`, the scripts in ``scripts.lua``."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.commands.core import Script as RedisScript

from fleetcron.errors import (
    FleetcronError,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from fleetcron.stores.base import (
    Capability,
    Operation,
    Statement,
    as_text,
    connect_error,
    drive,
    drive_async,
)
from fleetcron.stores.redis.connect import (
    _config,
    async_client,
    check_password,
    check_password_async,
    check_server,
    probe,
    sync_client,
)
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.scripts import SCRIPTS
from fleetcron.stores.redis.statements import KeyScan, Script, ScriptArg, ScriptCalls
from fleetcron.stores.url import StoreURL

if TYPE_CHECKING:
    from fleetcron.stores.redis.doctor import RedisFacts

__all__ = [
    "ERRORS",
    "AsyncRedisStore",
    "RedisStore",
    "ServerSettings",
    "open_async",
    "open_sync",
    "translate",
]

T = TypeVar("T")
log = logging.getLogger("fleetcron")


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a redis-py exception to fleetcron's hierarchy."""
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return StoreRefused(
            "the Redis server is a read-only replica; point the backend URL at the primary"
        )
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return StoreRefused(f"Redis refused the credentials or command: {exc}")
    if isinstance(exc, redis.exceptions.ResponseError) and "DB index" in str(exc):
        return StoreRefused(
            f"Redis refused the database number of the backend URL: {exc} (the server's "
            "`databases` setting bounds it, 16 by default)"
        )
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return StoreUnavailable(f"Redis unreachable: {exc}")
    if isinstance(
        exc,
        redis.exceptions.ClusterDownError  # CLUSTERDOWN, MASTERDOWN: a failover under way
        | redis.exceptions.TryAgainError  # a slot moving between masters
        | redis.exceptions.RedisClusterException,  # no node reachable, a slot not covered
    ):
        return StoreUnavailable(f"Redis unavailable: {exc}")
    if isinstance(exc, redis.exceptions.RedisError):
        return StoreError(f"Redis error: {exc}")
    return None


Call = tuple[tuple[str, ...], tuple[ScriptArg, ...]]

ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
"""What redis-py raises, its cluster client included: RedisClusterException (no node
reachable, a slot not covered) is not a RedisError."""


def _not_redis(statement: Statement) -> TypeError:
    return TypeError(f"the Redis store cannot run {statement!r}")


def _collect(pending: list[int], replies: list[Any], results: list[Any]) -> list[int]:
    """Store each reply of a pipeline in ``results``; return the calls the server did not
    run because it did not know the script (``NOSCRIPT``), to run again after loading it.
    Any other error is raised."""
    missing = []
    for index, reply in zip(pending, replies, strict=True):
        if isinstance(reply, redis.exceptions.NoScriptError):
            missing.append(index)
        elif isinstance(reply, Exception):
            raise reply
        else:
            results[index] = reply
    return missing


_SCRIPT_LOAD_TRIES = 3
# Keys a SCAN step looks at: the default (10) costs one round trip per 10 keys of the
# whole database, fleetcron's or not.
_SCAN_COUNT = 1000

_SETTINGS = ("appendonly", "appendfsync", "save", "maxmemory-policy")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """What :meth:`RedisStore.server_settings` reads: the server's ``role`` and how many
    replicas are connected to it, and its persistence and eviction settings, each
    ``None`` when ``CONFIG GET`` was refused (``config_error`` says how)."""

    role: str
    replicas: int
    appendonly: str | None
    appendfsync: str | None
    save: str | None
    maxmemory_policy: str | None
    config_error: str | None


class RedisStore:
    """Sync Redis store."""

    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK

    def __init__(self, url: StoreURL, *, create: bool = True) -> None:
        """Connect and check the server. ``create=False``: opening writes nothing (the
        persistence marker is read, not set)."""
        self.url = url.redacted
        self.ops = RedisOperations()
        self._lock = threading.Lock()
        self._closed = False
        self._client: redis.Redis = self._new_client(url)
        self._scripts: dict[str, RedisScript] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }
        try:
            with self._client.pipeline(transaction=False) as pipe:
                probe(pipe, mark=create)
                replies = pipe.execute(raise_on_error=False)
            check_server(self.url, replies, mark=create)
            check_password(self.url, self._client)
            self._conn: Any = self._client.connection_pool.get_connection()
        except redis.exceptions.RedisError as exc:
            self._client.close()
            raise connect_error(self.url, translate(exc)) from exc
        except StoreRefused:
            self._client.close()
            raise

    def _new_client(self, url: StoreURL) -> redis.Redis:
        """The client of ``url`` (a subclass's may find its server another way)."""
        return sync_client(url)

    def _execute(self, statement: Statement) -> Any:
        match statement:
            case KeyScan(pattern):
                return [
                    as_text(k) for k in self._client.scan_iter(match=pattern, count=_SCAN_COUNT)
                ]
            case ScriptCalls(name, calls):
                return self._pipeline(self._scripts[name], list(calls))
            case Script(name, keys, args):
                return self._call(self._scripts[name], keys, args)
            case _:
                raise _not_redis(statement)

    def _call(self, script: RedisScript, keys: tuple[str, ...], args: tuple[ScriptArg, ...]) -> Any:
        """One ``EVALSHA`` on the store's own connection (the script is loaded and the call
        sent again only after a script cache flush).

        The client's command path (pool checkout, telemetry, reply callbacks) costs as
        much CPU as the rest of a lock cycle; the store serialises its calls under its lock,
        so it keeps one connection and sends on it. As through the client (no retries), a
        call that failed on the wire is never sent again: it may have run."""
        conn = self._ready()
        for _ in range(_SCRIPT_LOAD_TRIES):
            try:
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                return conn.read_response()
            except redis.exceptions.NoScriptError:
                script.sha = self._client.script_load(script.script)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                conn.disconnect()  # its reply may still come: the connection is done
                raise
        raise redis.exceptions.NoScriptError("the script cache keeps being flushed")

    def _ready(self) -> Any:
        """The store's connection, connected and with nothing unread: one the server closed
        (or that holds a stray reply) is opened again before anything is sent on it, as the
        pool does at a checkout; one inherited across a fork is replaced, never shared.
        Connecting is tried once per call, so an outage costs one ``connect_timeout``."""
        conn = self._conn
        if conn.pid != os.getpid():
            conn.disconnect()  # in a child: closes its copy, leaves the parent's socket be
            conn.pid = os.getpid()  # the connection made next is this process's own
        if conn._sock is None:
            conn.connect()
            return conn
        try:
            if conn.can_read():
                raise redis.exceptions.ConnectionError("the connection has unread data")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
        return conn

    def _pipeline(self, script: RedisScript, calls: list[Call]) -> list[Any]:
        """Run every call of ``script`` in one pipeline: one round trip (``EVALSHA``; the
        script is loaded and the refused calls re-sent only after a script cache flush)."""
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(_SCRIPT_LOAD_TRIES):
            if not pending:
                break
            pipe: Any
            with self._client.pipeline(transaction=False) as pipe:
                for index in pending:
                    keys, argv = calls[index]
                    # The command itself, not pipe.evalsha, which redis-py's cluster
                    # pipeline refuses; either client routes it by its first key.
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)
                replies = pipe.execute(raise_on_error=False)
            pending = _collect(pending, replies, results)
            if pending:
                script.sha = self._client.script_load(script.script)
        if pending:
            raise redis.exceptions.NoScriptError("the script cache keeps being flushed")
        return results

    def _guarded(self, statement: Statement) -> Any:
        try:
            return self._execute(statement)
        except ERRORS as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    def run(self, operation: Operation[T]) -> T:
        with self._lock:
            return drive(operation, self._guarded)

    def migrate(self) -> list[str]:
        """Redis keeps no schema; nothing to apply."""
        return []

    def doctor_facts(self) -> tuple[RedisFacts]:
        """What ``fleetcron doctor`` judges of this server: role, replicas, persistence and
        eviction (:mod:`fleetcron.stores.redis.doctor`)."""
        from fleetcron.stores.redis.doctor import RedisFacts

        server = self.server_settings()
        return (
            RedisFacts(
                role=server.role,
                replicas=server.replicas,
                appendonly=server.appendonly,
                appendfsync=server.appendfsync,
                save=server.save,
                maxmemory_policy=server.maxmemory_policy,
                config_error=server.config_error,
            ),
        )

    def server_settings(self) -> ServerSettings:
        """The server's role, replicas, persistence and eviction settings, in one round trip
        that changes nothing (``ROLE`` and ``CONFIG GET``; for ``fleetcron doctor``)."""
        try:
            with self._lock, self._client.pipeline(transaction=False) as pipe:
                pipe.role()
                for key in _SETTINGS:
                    pipe.config_get(key)
                role_reply, *configs = pipe.execute(raise_on_error=False)
            if isinstance(role_reply, Exception):
                raise role_reply
        except redis.exceptions.RedisError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc
        role = as_text(role_reply[0])
        linked = role_reply[2] if role in ("master", "primary") and len(role_reply) > 2 else []
        values = [_config(reply, key) for reply, key in zip(configs, _SETTINGS, strict=True)]
        refused = next((reply for reply in configs if isinstance(reply, Exception)), None)
        return ServerSettings(
            role=role,
            replicas=len(linked),
            appendonly=values[0],
            appendfsync=values[1],
            save=values[2],
            maxmemory_policy=values[3],
            config_error=None if refused is None else str(refused),
        )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._client.connection_pool.release(self._conn)
            self._client.close()


class AsyncRedisStore:
    """Async Redis store (``redis.asyncio``)."""

    capabilities = RedisStore.capabilities

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations()
        self._client: aioredis.Redis = self._new_client(url)
        self._scripts: dict[str, AsyncScript] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }

    def _new_client(self, url: StoreURL) -> aioredis.Redis:
        """The client of ``url`` (a subclass's may find its server another way)."""
        return async_client(url)

    async def open(self, *, create: bool = True) -> None:
        """Connect and check the server. ``create=False``: opening writes nothing (the
        persistence marker is read, not set)."""
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                probe(pipe, mark=create)
                replies = await pipe.execute(raise_on_error=False)
            check_server(self.url, replies, mark=create)
            await check_password_async(self.url, self._client)
        except redis.exceptions.RedisError as exc:
            await self._client.aclose()
            raise connect_error(self.url, translate(exc)) from exc
        except StoreRefused:
            await self._client.aclose()
            raise

    async def _execute(self, statement: Statement) -> Any:
        try:
            match statement:
                case KeyScan(pattern):
                    keys = self._client.scan_iter(match=pattern, count=_SCAN_COUNT)
                    return [as_text(k) async for k in keys]
                case ScriptCalls(name, calls):
                    return await self._pipeline(self._scripts[name], list(calls))
                case Script(name, keys, args):
                    return await self._scripts[name](keys=list(keys), args=list(args))
                case _:
                    raise _not_redis(statement)
        except ERRORS as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    async def _pipeline(self, script: AsyncScript, calls: list[Call]) -> list[Any]:
        """Async twin of :meth:`RedisStore._pipeline`."""
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(_SCRIPT_LOAD_TRIES):
            if not pending:
                break
            async with self._client.pipeline(transaction=False) as pipe:
                for index in pending:
                    keys, argv = calls[index]
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *argv)
                replies = await pipe.execute(raise_on_error=False)
            pending = _collect(pending, replies, results)
            if pending:
                script.sha = await self._client.script_load(script.script)
        if pending:
            raise redis.exceptions.NoScriptError("the script cache keeps being flushed")
        return results

    async def run(self, operation: Operation[T]) -> T:
        return await drive_async(operation, self._execute)

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        await self._client.aclose()


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> RedisStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`): Redis keeps no
    schema; ``create=False`` reads its persistence marker instead of setting it."""
    return RedisStore(url, create=create)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncRedisStore:
    """The backend's async entry point."""
    store = AsyncRedisStore(url)
    await store.open(create=create)
    return store
