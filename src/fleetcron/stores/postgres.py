"""PostgreSQL store (psycopg 3): autocommit single statements under READ COMMITTED."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from fleetcron.errors import FleetcronError, SchemaError, StoreError, StoreUnavailable
from fleetcron.stores.async_sqlstore import AsyncSqlStore
from fleetcron.stores.base import Capability, SqlResult
from fleetcron.stores.sqlops import SqlLedger, SqlOperations
from fleetcron.stores.sqlstore import SqlSyncStore, store_error
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncPostgresStore", "PostgresOperations", "PostgresStore"]

# Every session pins what the lease statements rely on, whatever the role's defaults: a
# RR/SERIALIZABLE default would turn contention into SQLSTATE 40001 instead of 0 rows.
_SESSION_OPTIONS = (
    "-c default_transaction_isolation=read\\ committed "
    "-c TimeZone=UTC -c idle_in_transaction_session_timeout=0"
)
_CONNECT_TIMEOUT = 10


def _connect_kwargs() -> dict[str, Any]:
    return {
        "autocommit": True,
        "connect_timeout": _CONNECT_TIMEOUT,
        "options": _SESSION_OPTIONS,
        "application_name": "fleetcron",
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a psycopg exception to fleetcron's hierarchy."""
    if isinstance(exc, pg_errors.UndefinedTable):
        return store_error(SchemaError, exc, "schema missing: ")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return store_error(StoreUnavailable, exc)
    if isinstance(exc, psycopg.Error):
        return store_error(StoreError, exc)
    return None


def _result(cur: Any) -> SqlResult:
    rows = cur.fetchall() if cur.description is not None else []
    return SqlResult(rows=rows, rowcount=cur.rowcount)


# A batch runs in one pipeline: one round trip. Without a Sync the server would run the
# whole pipeline as one implicit transaction (every claimed job's rows locked until the
# end, and deadlocks between replicas claiming in different orders); a COMMIT queued after
# each execution makes each one its own transaction without waiting for it (a Sync would).
_COMMIT = "COMMIT"
# Every statement of a batch happens at one store time: the batch's first execution reads
# the clock into this setting (fleetcron_run_claim uses it), the last one clears it.
_BATCH_CLOCK = "SELECT set_config('fleetcron.batch_now', clock_timestamp()::text, false)"
_BATCH_CLOCK_CLEAR = "SELECT set_config('fleetcron.batch_now', '', false)"


class PostgresOperations(SqlOperations, SqlLedger):
    """Lease and run-ledger operations of PostgreSQL."""


def _clear_batch_clock(conn: Any) -> None:
    """A batch stopped by an error never reached its last statement: forget its clock."""
    try:
        if not conn.closed:
            conn.execute(_BATCH_CLOCK_CLEAR)
    except psycopg.Error:
        pass


async def _clear_batch_clock_async(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        if not conn.closed:
            await conn.execute(_BATCH_CLOCK_CLEAR)
    except psycopg.Error:
        pass


class PostgresStore(SqlSyncStore):
    """Sync PostgreSQL store."""

    dialect = "postgres"
    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT

    def __init__(self, url: StoreURL, *, auto_migrate: bool = True) -> None:
        self._cursor: Any = None
        super().__init__(url, auto_migrate=auto_migrate)
        self.ops = PostgresOperations()

    def _connect(self) -> Any:
        return psycopg.connect(self._url.raw, **_connect_kwargs())

    def _execute(self, conn: Any, sql: str, params: Mapping[str, object]) -> SqlResult:
        # One cursor per connection, reused: creating one costs as much as the Python side
        # of the statement itself.
        cur = self._cursor
        if cur is None or cur.connection is not conn or cur.closed:
            cur = self._cursor = conn.cursor()
        cur.execute(sql, params)
        return _result(cur)

    def _execute_batch(
        self, conn: Any, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        cursors = [conn.cursor() for _ in batch]
        try:
            with conn.cursor() as side, conn.pipeline():
                side.execute(_BATCH_CLOCK)
                for cur, params in zip(cursors, batch, strict=True):
                    cur.execute(sql, params)
                    side.execute(_COMMIT)
                side.execute(_BATCH_CLOCK_CLEAR)
            return [_result(cur) for cur in cursors]
        except psycopg.Error:
            _clear_batch_clock(conn)
            raise
        finally:
            for cur in cursors:
                cur.close()

    def _translate(self, exc: BaseException) -> FleetcronError | None:
        return translate(exc)

    def _migrate_locked(self) -> list[str]:
        conn = self._connection()
        applied: list[str] = []
        try:
            with conn.transaction():
                conn.execute(self.queries["migration_lock"])
                conn.execute(self.queries["schema_init"])
                for migration in self._pending():
                    for statement in migration.statements:
                        conn.execute(statement)
                    conn.execute(
                        self.queries["schema_record"],
                        {"version": migration.version, "name": migration.name},
                    )
                    applied.append(migration.name)
        except psycopg.Error as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc
        return applied


class AsyncPostgresStore(AsyncSqlStore):
    """Async PostgreSQL store over one ``psycopg.AsyncConnection``."""

    dialect = "postgres"
    capabilities = PostgresStore.capabilities
    sync_store = PostgresStore

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url, PostgresOperations())

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(self._url.raw, **_connect_kwargs())
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc

    async def _close(self, conn: Any) -> None:
        with contextlib.suppress(psycopg.Error):
            await conn.close()

    async def _execute_text(self, sql: str, params: dict[str, object]) -> SqlResult:
        conn = await self._connection()
        try:
            async with conn.cursor() as cur:
                await cur.execute(sql, params)
                rows = await cur.fetchall() if cur.description is not None else []
                return SqlResult(rows=list(rows), rowcount=cur.rowcount)
        except psycopg.Error as exc:
            error = translate(exc)
            assert error is not None
            if isinstance(error, StoreUnavailable):
                await self._drop_connection()
            raise error from exc

    async def _execute_batch(
        self, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        conn = await self._connection()
        cursors = [conn.cursor() for _ in batch]
        try:
            async with conn.cursor() as side, conn.pipeline():
                await side.execute(_BATCH_CLOCK)
                for cur, params in zip(cursors, batch, strict=True):
                    await cur.execute(sql, params)
                    await side.execute(_COMMIT)
                await side.execute(_BATCH_CLOCK_CLEAR)
            results = []
            for cur in cursors:
                rows = await cur.fetchall() if cur.description is not None else []
                results.append(SqlResult(rows=list(rows), rowcount=cur.rowcount))
            return results
        except psycopg.Error as exc:
            error = translate(exc)
            assert error is not None
            if isinstance(error, StoreUnavailable):
                await self._drop_connection()
            else:
                await _clear_batch_clock_async(conn)
            raise error from exc
        finally:
            for cur in cursors:
                await cur.close()
