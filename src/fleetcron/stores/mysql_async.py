"""Async MySQL/MariaDB store (aiomysql): the same statements as the sync store."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import aiomysql
import pymysql

from fleetcron.errors import SchemaError, StoreUnavailable
from fleetcron.stores.base import Capability, Operation, SqlResult, Statement, drive_async
from fleetcron.stores.mysql import (
    MysqlOperations,
    MysqlStore,
    batch_text,
    connect_args,
    split_results,
    translate,
)
from fleetcron.stores.sqlops import load_migrations, load_queries
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncMysqlStore"]

T = TypeVar("T")


class AsyncMysqlStore:
    """Async MySQL/MariaDB store over one aiomysql connection."""

    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self._url = url
        args = connect_args(url)
        args["db"] = args.pop("database")
        self._args = args
        self.ops = MysqlOperations()
        self.queries = load_queries("mysql")
        self._latest = max(m.version for m in load_migrations("mysql"))
        self._lock = asyncio.Lock()
        self._conn: Any = None
        self._rowcount = 0

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
        def work() -> list[str]:
            store = MysqlStore(self._url, auto_migrate=False)
            try:
                if store.schema_version() > store.latest_version:
                    store.ensure_schema()  # raises the "newer schema" error
                return store.migrate()
            finally:
                store.close()

        return await asyncio.to_thread(work)

    async def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = await aiomysql.connect(**self._args)
            except (pymysql.err.MySQLError, OSError) as exc:
                raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        return self._conn

    async def _execute_text(self, sql: str, params: dict[str, object]) -> SqlResult:
        results = await self._results(sql, params)
        return results[-1] if results else SqlResult(rows=[], rowcount=self._rowcount)

    async def _execute_batch(
        self, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        conn = await self._connection()
        async with conn.cursor() as cur:
            text = batch_text(cur, sql, batch)
        return split_results(await self._results(text, {}), len(batch))

    async def _results(self, sql: str, params: dict[str, object]) -> list[SqlResult]:
        """Run one text; every result set that has columns (with the rowcount of the last
        DML before it), in order. ``_rowcount``: the last DML's."""
        conn = await self._connection()
        results: list[SqlResult] = []
        rowcount = 0
        try:
            async with conn.cursor() as cur:
                await cur.execute(sql, params or None)
                while True:
                    if cur.description is not None:
                        results.append(
                            SqlResult(rows=list(await cur.fetchall()), rowcount=rowcount)
                        )
                    else:
                        rowcount = cur.rowcount
                    if not await cur.nextset():
                        break
        except pymysql.err.MySQLError as exc:
            error = translate(exc)
            assert error is not None
            if isinstance(error, StoreUnavailable):
                conn.close()
                self._conn = None
            else:
                # A block stopped by an error leaves its transaction open: roll it back.
                try:
                    await conn.rollback()
                except pymysql.err.MySQLError:
                    pass
            raise error from exc
        self._rowcount = rowcount
        return results

    async def _statement(self, statement: Statement) -> SqlResult | list[SqlResult]:
        sql = self.queries[statement.name]
        if statement.batch is not None:
            return await self._execute_batch(sql, statement.batch)
        return await self._execute_text(sql, dict(statement.params))

    async def run(self, operation: Operation[T]) -> T:
        async with self._lock:
            return await drive_async(operation, self._statement)

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
