"""Shared machinery of the async SQL stores: one connection behind an ``asyncio.Lock``,
named queries, the schema check on open, migrations through the sync store.

A concrete store supplies how to connect and close, how to execute one query text and
one batch. Schema changes are rare and take the dialect's migration lock, which the sync
store already implements: an async store runs them through a throw-away sync store in a
worker thread instead of carrying a second migration path.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from fleetcron.errors import SchemaError
from fleetcron.stores.base import (
    Capability,
    Operation,
    Operations,
    SqlResult,
    Statement,
    drive_async,
)
from fleetcron.stores.sqlops import load_migrations, load_queries
from fleetcron.stores.sqlstore import SqlSyncStore
from fleetcron.stores.statements import Query, QueryBatch
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncSqlStore"]

T = TypeVar("T")


class AsyncSqlStore(ABC):
    """A SQL store driven asynchronously over one connection guarded by a lock."""

    dialect: ClassVar[str]
    capabilities: ClassVar[Capability]
    sync_store: ClassVar[type[SqlSyncStore]]  # runs the migrations

    def __init__(self, url: StoreURL, ops: Operations) -> None:
        self.url = url.redacted
        self._url = url
        self.ops = ops
        self.queries = load_queries(self.dialect)
        self._latest = max(m.version for m in load_migrations(self.dialect))
        self._lock = asyncio.Lock()
        self._conn: Any = None

    # -- what a dialect supplies -----------------------------------------------------------
    @abstractmethod
    async def _connect(self) -> Any:
        """A new connection; raises StoreUnavailable when the server cannot be reached."""

    @abstractmethod
    async def _close(self, conn: Any) -> None:
        """Close ``conn``, ignoring errors."""

    @abstractmethod
    async def _execute_text(self, sql: str, params: dict[str, object]) -> SqlResult:
        """Execute one query text; driver errors translated."""

    @abstractmethod
    async def _execute_batch(
        self, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        """Execute ``sql`` once per parameter set in one round trip, one result each."""

    # -- shared ----------------------------------------------------------------------------
    async def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        return self._conn

    async def _drop_connection(self) -> None:
        """Forget a connection the server dropped; the next statement reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._close(conn)

    async def open(self) -> None:
        """Connect and bring the schema up to date."""
        async with self._lock:
            await self._connection()
        try:
            result = await self._execute_text(self.queries["schema_version"], {})
            version = int(result.rows[0][0] or 0)
        except SchemaError:
            version = 0
        if version != self._latest:
            await self.migrate()

    async def migrate(self) -> list[str]:
        """Apply pending migrations (through the sync store, in a worker thread)."""

        def work() -> list[str]:
            store = self.sync_store(self._url, auto_migrate=False)
            try:
                if store.schema_version() > store.latest_version:
                    store.ensure_schema()  # raises the "newer schema" error
                return store.migrate()
            finally:
                store.close()

        return await asyncio.to_thread(work)

    async def _statement(self, statement: Statement) -> SqlResult | list[SqlResult]:
        match statement:
            case Query(name, params):
                return await self._execute_text(self.queries[name], dict(params))
            case QueryBatch(name, batch):
                return await self._execute_batch(self.queries[name], batch)
            case _:
                raise TypeError(f"a SQL store cannot run {statement!r}")

    async def run(self, operation: Operation[T]) -> T:
        """Carry out ``operation`` (one lock hold, so its statements are not interleaved)."""
        async with self._lock:
            return await drive_async(operation, self._statement)

    async def close(self) -> None:
        async with self._lock:
            await self._drop_connection()
