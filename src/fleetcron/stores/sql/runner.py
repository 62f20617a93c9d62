"""The SQL runner, sync and async: query lookup, one connection behind a lock, schema
checks and migrations.

A concrete store supplies how to connect, how to execute one query text (and one batch),
and how to translate its driver's exceptions. Everything else — which statement an
operation needs, when the schema is created — is decided here once. Schema changes are
rare and take the dialect's migration lock, which the sync store implements: an async
store runs them through a throw-away sync store in a worker thread instead of carrying a
second migration path.
"""

from __future__ import annotations

import asyncio
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from fleetcron.errors import (
    FleetcronError,
    SchemaError,
    StoreError,
    StoreMissing,
    StoreUnavailable,
)
from fleetcron.stores.base import (
    Capability,
    Operation,
    Operations,
    Statement,
    connect_error,
    drive,
    drive_async,
)
from fleetcron.stores.sql.files import Migration, load_migrations, load_queries
from fleetcron.stores.sql.statements import Query, QueryBatch, SqlResult
from fleetcron.stores.url import StoreURL

__all__ = [
    "AsyncSqlStore",
    "SqlSyncStore",
    "column_names",
    "retry_pause",
    "schema_refusal",
    "store_error",
    "timed_out",
]

T = TypeVar("T")
R = TypeVar("R")


def schema_refusal(url: str, version: int, latest: int) -> StoreError | None:
    """Why a store whose schema is at ``version`` cannot be used as it is by this
    fleetcron (whose schema is at ``latest``): :class:`StoreMissing` when there is none,
    :class:`SchemaError` when it is older or newer; ``None`` when it is current."""
    if version == 0:
        return StoreMissing(
            f"no fleetcron store in {url}: it has no fleetcron tables (start a replica or "
            "run `fleetcron migrate` to create them)"
        )
    if version > latest:
        return SchemaError(
            f"the schema in {url} is version {version}, newer than this fleetcron "
            f"understands ({latest}); upgrade fleetcron"
        )
    if version < latest:
        return SchemaError(
            f"the schema in {url} is version {version}, older than this fleetcron's "
            f"({latest}); run `fleetcron migrate`, or start a replica of this version, to "
            "upgrade it"
        )
    return None


class SqlSyncStore(ABC):
    """A SQL store driven synchronously over one connection guarded by a lock."""

    dialect: ClassVar[str]
    capabilities: Capability

    def __init__(self, url: StoreURL, *, auto_migrate: bool = True) -> None:
        self.url = url.redacted
        self._url = url
        self.ops: Operations = self._operations()
        self.queries = load_queries(self.dialect)
        self.migrations: list[Migration] = load_migrations(self.dialect)
        self._lock = threading.RLock()
        self._conn: Any = None
        with self._lock:
            self._connection()
        if auto_migrate:
            self.ensure_schema()

    @property
    def store_url(self) -> StoreURL:
        """The parsed URL, credentials included: for a connection of a caller's own to the
        same server (an advisory lock's session, :mod:`fleetcron.stores.sql.advisory`)."""
        return self._url

    # -- what a dialect supplies -------------------------------------------------------
    @abstractmethod
    def _operations(self) -> Operations:
        """The dialect's operations (leases and the run ledger)."""

    @abstractmethod
    def _connect(self) -> Any:
        """Open a new connection (autocommit, READ COMMITTED, UTC)."""

    @abstractmethod
    def _execute(self, conn: Any, sql: str, params: Mapping[str, object]) -> SqlResult:
        """Execute one query text (it may hold several statements where the dialect allows)."""

    @abstractmethod
    def _translate(self, exc: BaseException) -> FleetcronError | None:
        """Map a driver exception to the error hierarchy; ``None`` when it is not the driver's."""

    def _close_connection(self, conn: Any) -> None:
        try:
            conn.close()
        except Exception:
            pass

    # -- running operations ------------------------------------------------------------
    def _connection(self) -> Any:
        if self._conn is None:
            try:
                self._conn = self._connect()
            except FleetcronError:
                raise
            except Exception as exc:
                error = self._translate(exc)
                if error is None:
                    raise
                raise connect_error(self.url, error) from exc
        return self._conn

    def _discard(self) -> None:
        if self._conn is not None:
            self._close_connection(self._conn)
            self._conn = None

    def _execute_batch(
        self, conn: Any, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        """Execute ``sql`` once per parameter set, one result each (a ``QueryBatch``).
        This default loops; a dialect overrides it to send them all in one round trip."""
        return [self._execute(conn, sql, params) for params in batch]

    def execute_text(self, sql: str, params: Mapping[str, object] | None = None) -> SqlResult:
        """Execute ``sql`` on the store's connection, translating driver errors once."""
        return self._guarded(lambda conn: self._execute(conn, sql, params or {}))

    def _guarded(self, work: Callable[[Any], R]) -> R:
        """Run ``work(connection)`` under the lock, translating driver errors once."""
        with self._lock:
            conn = self._connection()
            try:
                return work(conn)
            except Exception as exc:
                error = self._translate(exc)
                if error is None:
                    self._discard()  # a bug or an interruption mid-protocol: start afresh
                    raise
                if isinstance(error, StoreUnavailable):
                    self._discard()
                raise error from exc
            except BaseException:
                # Interrupted inside the driver (LeaseLost raised into this thread,
                # KeyboardInterrupt): the connection may be mid-protocol; never reuse it.
                self._discard()
                raise

    def _statement(self, statement: Statement) -> SqlResult | list[SqlResult]:
        match statement:
            case Query(name, params):
                return self.execute_text(self.queries[name], params)
            case QueryBatch(name, batch):
                sql = self.queries[name]
                return self._guarded(lambda conn: self._execute_batch(conn, sql, batch))
            case _:
                raise TypeError(f"a SQL store cannot run {statement!r}")

    def run(self, operation: Operation[T]) -> T:
        """Carry out ``operation`` (one lock hold, so its statements are not interleaved)."""
        with self._lock:
            return drive(operation, self._statement)

    # -- schema ------------------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return self.migrations[-1].version if self.migrations else 0

    def schema_version(self) -> int:
        """The version recorded in the store, 0 when the schema was never created."""
        try:
            result = self.execute_text(self.queries["schema_version"])
        except SchemaError:
            return 0
        return int(result.rows[0][0] or 0)

    def ensure_schema(self) -> None:
        """Create or upgrade the schema when needed; refuse a schema newer than the code."""
        version = self.schema_version()
        if version > self.latest_version:
            refusal = schema_refusal(self.url, version, self.latest_version)
            assert refusal is not None
            raise refusal
        if version < self.latest_version:
            self.migrate()

    def require_schema(self) -> None:
        """Refuse, changing nothing, a store whose schema is not this fleetcron's: none
        (:class:`StoreMissing`), older or newer (:class:`SchemaError`). For the commands
        that use a store as it is and never create or upgrade one."""
        refusal = schema_refusal(self.url, self.schema_version(), self.latest_version)
        if refusal is not None:
            raise refusal

    def migrate(self) -> list[str]:
        """Apply pending migrations under the dialect's migration lock."""
        with self._lock:
            return self._migrate_locked()

    def _pending(self) -> list[Migration]:
        current = self.schema_version()
        return [m for m in self.migrations if m.version > current]

    @abstractmethod
    def _migrate_locked(self) -> list[str]:
        """Apply pending migrations atomically with respect to other processes."""

    def close(self) -> None:
        with self._lock:
            self._discard()


def _driver_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def column_names(description: Sequence[Sequence[Any]]) -> tuple[str, ...]:
    """The column names of a result, from its DB-API ``cursor.description`` (the first
    item of each column's entry)."""
    return tuple([column[0] for column in description])


def timed_out(url: StoreURL) -> StoreUnavailable:
    """The error of a round trip given up on after the backend URL's ``timeout``."""
    return StoreUnavailable(
        f"{url.redacted} did not answer within {url.timeout_s:g} s (the backend URL's timeout)"
    )


def retry_pause(attempt: int) -> float:
    """How long to wait before sending again, for the ``attempt``-th time (from 0), what
    the server refused for a conflict with a concurrent transaction: doubling, jittered, so
    the transactions that collided do not collide again."""
    return 0.001 * (1 << attempt) * random.uniform(0.5, 1.0)


def store_error(kind: type[StoreError], exc: BaseException, prefix: str = "") -> StoreError:
    """Build ``kind`` with the first line of the driver's message."""
    return kind(f"{prefix}{_driver_message(exc)}")


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

    @property
    def store_url(self) -> StoreURL:
        """The parsed URL, credentials included: for a connection of a caller's own to the
        same server (an advisory lock's session, :mod:`fleetcron.stores.sql.advisory`)."""
        return self._url

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

    async def open(self, *, migrate: bool = True) -> None:
        """Connect and bring the schema up to date; without ``migrate``, refuse a schema
        that is not current instead, changing nothing (see
        :meth:`SqlSyncStore.require_schema`)."""
        async with self._lock:
            await self._connection()
        try:
            result = await self._execute_text(self.queries["schema_version"], {})
            version = int(result.rows[0][0] or 0)
        except SchemaError:
            version = 0
        if version == self._latest:
            return
        if migrate:
            await self.migrate()
            return
        refusal = schema_refusal(self.url, version, self._latest)
        assert refusal is not None
        raise refusal

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
