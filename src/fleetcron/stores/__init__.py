"""Stores behind backend URLs: ``memory://``, ``sqlite:///…``, ``postgresql://…``,
``mysql://…`` and ``redis://…``. See :mod:`fleetcron.stores.base` for the contract."""

from __future__ import annotations

import os

from fleetcron.errors import ConfigurationError
from fleetcron.stores.base import AsyncStore, Capability, SyncStore
from fleetcron.stores.url import StoreURL, default_sqlite_path, parse_store_url

__all__ = [
    "AsyncStore",
    "Capability",
    "StoreURL",
    "SyncStore",
    "open_async_store",
    "open_store",
    "parse_store_url",
    "resolve_backend",
]

BACKEND_ENV = "FLEETCRON_BACKEND"


def resolve_backend(explicit: str | None = None, configured: str | None = None) -> StoreURL:
    """Pick the backend URL: explicit > ``$FLEETCRON_BACKEND`` > jobs file > SQLite default."""
    for candidate in (explicit, os.environ.get(BACKEND_ENV) or None, configured):
        if candidate is not None:
            return parse_store_url(candidate)
    path = default_sqlite_path()
    return StoreURL(raw=f"sqlite://{path}", kind="sqlite", redacted=f"sqlite://{path}", path=path)


def _missing_driver(kind: str, extra: str, exc: ImportError) -> ConfigurationError:
    return ConfigurationError(
        f"the {kind} backend needs its driver: pip install 'fleetcron[{extra}]' ({exc.name})"
    )


def open_store(url: StoreURL, *, auto_migrate: bool = True) -> SyncStore:
    """Connect a sync store. Raises ``StoreUnavailable`` / ``ConfigurationError``."""
    if url.kind == "memory":
        from fleetcron.stores.memory import MemoryStore

        return MemoryStore()
    if url.kind == "sqlite":
        from fleetcron.stores.sql.sqlite import SqliteStore

        assert url.path is not None
        default = url.path == default_sqlite_path()
        return SqliteStore(url, auto_migrate=auto_migrate, create_parent=default)
    try:
        if url.kind == "postgres":
            from fleetcron.stores.sql.postgres import PostgresStore

            return PostgresStore(url, auto_migrate=auto_migrate)
        if url.kind == "mysql":
            from fleetcron.stores.sql.mysql import MysqlStore

            return MysqlStore(url, auto_migrate=auto_migrate)
        from fleetcron.stores.redis.store import RedisStore

        return RedisStore(url)
    except ImportError as exc:
        raise _missing_driver(url.kind, url.kind, exc) from None


async def open_async_store(url: StoreURL) -> AsyncStore:
    """Connect an async store: native asyncio for PostgreSQL, MySQL and Redis; SQLite
    (a local file, no network wait) runs its statements in a worker thread."""
    import asyncio

    from fleetcron.stores.threaded import ThreadedAsyncStore

    try:
        if url.kind == "postgres":
            from fleetcron.stores.sql.postgres import AsyncPostgresStore

            pg = AsyncPostgresStore(url)
            await pg.open()
            return pg
        if url.kind == "mysql":
            from fleetcron.stores.sql.mysql_async import AsyncMysqlStore

            my = AsyncMysqlStore(url)
            await my.open()
            return my
        if url.kind == "redis":
            from fleetcron.stores.redis.store import AsyncRedisStore

            rd = AsyncRedisStore(url)
            await rd.open()
            return rd
    except ImportError as exc:
        raise _missing_driver(url.kind, url.kind, exc) from None
    if url.kind == "memory":
        from fleetcron.stores.memory import AsyncMemoryStore

        return AsyncMemoryStore()
    return ThreadedAsyncStore(await asyncio.to_thread(open_store, url))
