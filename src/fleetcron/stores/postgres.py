"""PostgreSQL store (psycopg 3): autocommit single statements under READ COMMITTED."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors

from fleetcron.errors import FleetcronError, SchemaError, StoreError, StoreUnavailable
from fleetcron.stores.base import Capability, Operation, SqlResult, Statement, drive_async
from fleetcron.stores.sqlops import SqlOperations, load_migrations, load_queries
from fleetcron.stores.sqlstore import SqlSyncStore, store_error
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncPostgresStore", "PostgresStore"]

T = TypeVar("T")

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


class PostgresStore(SqlSyncStore):
    """Sync PostgreSQL store."""

    dialect = "postgres"
    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT

    def __init__(self, url: StoreURL, *, auto_migrate: bool = True) -> None:
        self._cursor: Any = None
        super().__init__(url, auto_migrate=auto_migrate)

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


class AsyncPostgresStore:
    """Async PostgreSQL store over one ``psycopg.AsyncConnection``."""

    capabilities = PostgresStore.capabilities

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self._url = url
        self.ops = SqlOperations()
        self.queries = load_queries("postgres")
        self._latest = max(m.version for m in load_migrations("postgres"))
        self._lock = asyncio.Lock()
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def open(self) -> None:
        """Connect and check the schema (creating it through the sync path if missing)."""
        async with self._lock:
            await self._connection()
        version = await self._schema_version()
        if version != self._latest:
            await self.migrate()

    async def _schema_version(self) -> int:
        try:
            result = await self._execute_text(self.queries["schema_version"], {})
        except SchemaError:
            return 0
        return int(result.rows[0][0] or 0)

    async def migrate(self) -> list[str]:
        def work() -> list[str]:
            store = PostgresStore(self._url, auto_migrate=False)
            try:
                if store.schema_version() > store.latest_version:
                    store.ensure_schema()  # raises the "newer schema" error
                return store.migrate()
            finally:
                store.close()

        return await asyncio.to_thread(work)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._url.raw, **_connect_kwargs()
                )
            except psycopg.Error as exc:
                raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        return self._conn

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
                await conn.close()
                self._conn = None
            raise error from exc

    async def _statement(self, statement: Statement) -> SqlResult:
        return await self._execute_text(self.queries[statement.name], dict(statement.params))

    async def run(self, operation: Operation[T]) -> T:
        async with self._lock:
            return await drive_async(operation, self._statement)

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
