"""Async MySQL/MariaDB store (aiomysql): the same statements as the sync store."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiomysql
import pymysql

from fleetcron.errors import StoreError, StoreUnavailable
from fleetcron.stores.base import Capability, connect_error
from fleetcron.stores.sql.mysql import (
    RETRIES,
    MysqlOperations,
    MysqlStore,
    batch_text,
    connect_args,
    connect_timed_out,
    resendable,
    split_results,
    translate,
)
from fleetcron.stores.sql.runner import AsyncSqlStore, column_names, retry_pause, timed_out
from fleetcron.stores.sql.statements import SqlResult
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncMysqlStore"]


class AsyncMysqlStore(AsyncSqlStore):
    """Async MySQL/MariaDB store over one aiomysql connection."""

    dialect = "mysql"
    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT
    sync_store = MysqlStore

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url, MysqlOperations())
        args = connect_args(url)
        args["db"] = args.pop("database")
        # aiomysql has no read or write timeout, and its connect_timeout bounds only the TCP
        # connect: the whole connect (greeting, authentication and set-up statements
        # included) and every round trip are bounded here instead.
        self._timeout_s = args.pop("read_timeout")
        args.pop("write_timeout")
        self._args = args
        self._rowcount = 0

    async def _connect(self) -> Any:
        try:
            async with asyncio.timeout(self._url.connect_timeout_s):
                return await aiomysql.connect(**self._args)
        except TimeoutError:
            raise connect_timed_out(self._url) from None
        except pymysql.err.MySQLError as exc:
            raise connect_error(self.url, translate(exc)) from exc
        except OSError as exc:
            raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc

    async def _close(self, conn: Any) -> None:
        conn.close()  # aiomysql's close() is synchronous: it drops the socket

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
        """Run one text; every result set that has columns (with their names and the
        rowcount of the last DML before it), in order. ``_rowcount``: the last DML's. A
        block that is one transaction, refused by a deadlock, is sent again
        (:func:`resendable`)."""
        attempt = 0
        while True:
            try:
                return await self._results_once(sql, params)
            except StoreError as error:
                if attempt == RETRIES - 1 or not resendable(error.__cause__, sql):
                    raise
            await asyncio.sleep(retry_pause(attempt))
            attempt += 1

    async def _results_once(self, sql: str, params: dict[str, object]) -> list[SqlResult]:
        conn = await self._connection()
        results: list[SqlResult] = []
        rowcount = 0
        try:
            async with asyncio.timeout(self._timeout_s), conn.cursor() as cur:
                await cur.execute(sql, params or None)
                while True:
                    if cur.description is not None:
                        rows = list(await cur.fetchall())
                        results.append(SqlResult(rows, rowcount, column_names(cur.description)))
                    else:
                        rowcount = cur.rowcount
                    if not await cur.nextset():
                        break
        except TimeoutError:
            # Mid-protocol: the connection cannot be reused.
            await self._drop_connection()
            raise timed_out(self._url) from None
        except pymysql.err.MySQLError as exc:
            error = translate(exc)
            assert error is not None
            if isinstance(error, StoreUnavailable):
                await self._drop_connection()
            else:
                # A block stopped by an error leaves its transaction open: roll it back.
                try:
                    await conn.rollback()
                except pymysql.err.MySQLError:
                    pass
            raise error from exc
        self._rowcount = rowcount
        return results
