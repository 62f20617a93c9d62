"""PostgreSQL store (psycopg 3): autocommit single statements under READ COMMITTED."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from fleetcron.errors import (
    ConfigurationError,
    FleetcronError,
    SchemaError,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from fleetcron.stores.base import Capability, connect_error, opened
from fleetcron.stores.sql.advisory_capable import AdvisoryCapable
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.postgres_operations import PostgresOperations, batch_transactions
from fleetcron.stores.sql.replication import (
    REPLICATION_QUERY,
    ReplicationFacts,
    ReplicationUnknown,
    UnreplicatedCommits,
    multi_host,
    replication_facts,
    session_defaults,
)
from fleetcron.stores.sql.runner import (
    AsyncSqlStore,
    SqlSyncStore,
    retry_pause,
    store_error,
    timed_out,
)
from fleetcron.stores.sql.statements import SqlResult
from fleetcron.stores.sql.watchdog import Deadline, deadline
from fleetcron.stores.url import StoreURL

if TYPE_CHECKING:
    from fleetcron.stores.sql.pooling import PoolingFacts, PoolingUnknown

__all__ = [
    "AsyncPostgresStore",
    "BackendPid",
    "PoolerProbe",
    "PostgresOperations",
    "PostgresStore",
    "check_conninfo",
    "connect_kwargs",
    "open_async",
    "open_sync",
]

R = TypeVar("R")

# Nothing is set for the session: behind PgBouncer in transaction pooling mode a session
# setting (or a startup ``options`` parameter, which it refuses) would reach, or come from,
# another client's server connection. What the statements rely on is carried by each
# statement or transaction instead: times are epoch microseconds (no TimeZone), a claim
# runs in ``BEGIN ISOLATION LEVEL READ COMMITTED``, and a single autocommit statement
# refused under a stricter default isolation (SQLSTATE 40001/40P01) is sent again — it
# changed nothing, being its own transaction.
_IDLE = TransactionStatus.IDLE
# Read once per connection: where the server's default is READ COMMITTED (almost always),
# a batch of one transaction is sent as one autocommit statement, without the BEGIN and
# COMMIT around it (each a statement of its own for the server and the driver).
_DEFAULT_ISOLATION = "SHOW default_transaction_isolation"
# Reads of many rows, planned at every call instead of prepared once per connection. A
# prepared plan is kept for the connection's life: made while the ledger was empty (a new
# fleet's monitor reads it before the first run), the plan of a job's history read took
# fleetcron_run_newest and read the whole namespace's ledger for every job, long after the
# ledger had grown. Planned per call, each read sees the table as it is; these statements
# run a few times a second at most, and their plan costs a fraction of what they read.
_PLANNED_PER_CALL = (
    "run_list",
    "run_list_job",
    "run_list_many",
    "run_running",
    "run_settled",
    "run_due",
)


@functools.cache
def _planned_per_call() -> frozenset[str]:
    queries = load_queries("postgres")
    return frozenset(queries[name] for name in _PLANNED_PER_CALL)


def _prepare(sql: str) -> bool | None:
    """psycopg's ``prepare`` for ``sql``: never for :data:`_PLANNED_PER_CALL`, else as the
    connection does (prepared from its fifth run unless the URL says off)."""
    return False if sql in _planned_per_call() else None


_RETRIES = 8  # tries of a single statement refused by serialization or a deadlock


def connect_kwargs(url: StoreURL) -> dict[str, Any]:
    """psycopg's connection parameters for ``url`` (a store's and an advisory session's)."""
    return {
        "autocommit": True,
        # Server-side prepared statements (psycopg's default: after 5 runs) spare the server
        # a parse and plan per statement, about a quarter of a lock cycle. Off with
        # ``?prepared_statements=off``: behind PgBouncer in transaction pooling (before 1.21,
        # or without max_prepared_statements) a statement prepared on one server connection
        # is unknown on the next ("prepared statement _pg3_0 does not exist").
        "prepare_threshold": 5 if url.prepared_statements else None,
        # libpq counts whole seconds, at least 2.
        "connect_timeout": max(2, math.ceil(url.connect_timeout_s)),
        "application_name": "fleetcron",
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        **session_defaults(url),
    }


# Refusals: bad credentials, no such role or database, missing privileges, a read-only
# transaction (default_transaction_read_only, a hot standby: 25006). A failed connection
# carries no SQLSTATE, only the server's FATAL message.
_REFUSED_SQLSTATES = {"28000", "28P01", "3D000", "42501", "25006"}
_REFUSED_TEXT = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|(role|database) \".*\" does not "
    r"exist|permission denied|password is required|authentication failed"
)


def translate(exc: BaseException, *, multi_host: bool = False) -> FleetcronError | None:
    """Map a psycopg exception to fleetcron's hierarchy. With several hosts in the URL a
    read-only server (25006) is one demoted by a failover, not a wrong URL: unavailable,
    so that the next statement connects again and finds the new primary."""
    if multi_host and isinstance(exc, psycopg.Error) and exc.sqlstate == "25006":
        return store_error(StoreUnavailable, exc)
    if isinstance(exc, pg_errors.UndefinedTable):
        return store_error(SchemaError, exc, "schema missing: ")
    if isinstance(exc, psycopg.Error) and (
        exc.sqlstate in _REFUSED_SQLSTATES
        or (isinstance(exc, psycopg.OperationalError) and _REFUSED_TEXT.search(str(exc)))
    ):
        return store_error(StoreRefused, exc)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return store_error(StoreUnavailable, exc)
    if isinstance(exc, psycopg.Error):
        return store_error(StoreError, exc)
    return None


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def check_conninfo(url: StoreURL) -> None:
    """Refuse, before connecting, what libpq would refuse later as a connection failure
    (an unknown parameter, an impossible ``sslmode``)."""
    try:
        params = conninfo_to_dict(url.driver_url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"backend URL {url.redacted!r}: {exc}") from None
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: sslmode must be one of {', '.join(_SSLMODES)}, "
            f"not {sslmode!r}"
        )


# The column names of each query text's answers, read from the server's result the first
# time the text is answered (again if its number of columns changes). Per result they
# would cost as much CPU as the rest of reading a one-row answer (``cur.description``
# builds a column object per field; even the names alone are a call per field). A text's
# column names do not change: a function whose result changes gets a new versioned name,
# and so a new text.
_COLUMNS: dict[str, tuple[str, ...]] = {}


def _columns(sql: str, result: Any) -> tuple[str, ...]:
    names = _COLUMNS.get(sql)
    if names is None or len(names) != result.nfields:
        names = tuple(
            (result.fname(index) or b"").decode("utf-8") for index in range(result.nfields)
        )
        _COLUMNS[sql] = names
    return names


def _result(cur: Any, sql: str) -> SqlResult:
    # The result's field count, not ``cur.description`` (see _COLUMNS).
    result = cur.pgresult
    if result is None or not result.nfields:
        return SqlResult(rows=[], rowcount=cur.rowcount)
    return SqlResult(rows=cur.fetchall(), rowcount=cur.rowcount, columns=_columns(sql, result))


async def _result_async(cur: Any, sql: str) -> SqlResult:
    result = cur.pgresult
    if result is None or not result.nfields:
        return SqlResult(rows=[], rowcount=cur.rowcount)
    rows = list(await cur.fetchall())
    return SqlResult(rows=rows, rowcount=cur.rowcount, columns=_columns(sql, result))


# A batch runs in one pipeline: one round trip. Without a Sync the server would run the
# whole pipeline as one implicit transaction (every claimed job's rows locked until the
# end, and deadlocks between replicas claiming in different orders); a BEGIN before and a
# COMMIT after each execution make each one its own READ COMMITTED transaction without
# waiting for it (a Sync would), whatever the server's default isolation.
_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
_COMMIT = "COMMIT"
_RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


def _end_failed_transaction(conn: Any) -> None:
    """A claim stopped by an error leaves its explicit transaction open (a pipeline's Sync
    does not end it): roll it back, or every later statement would be refused."""
    try:
        if not conn.closed and conn.info.transaction_status != _IDLE:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


async def _end_failed_transaction_async(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        if not conn.closed and conn.info.transaction_status != _IDLE:
            await conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


class BackendPid(NamedTuple):
    """The server process behind one statement: the pid the server ``announced`` at
    connect (BackendKeyData, libpq's ``backend_pid``) and the one ``pg_backend_pid()``
    ``reported``. A pooler answers the connect itself, with a pid of its own."""

    announced: int
    reported: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolerProbe:
    """What :meth:`PostgresStore.backend_pids` saw: a :class:`BackendPid` per statement on
    the store's connection (``first``) and, interleaved, on a second one (``second``);
    and the store's ``prepare_threshold`` (``None``: it prepares no statement)."""

    first: tuple[BackendPid, ...]
    second: tuple[BackendPid, ...]
    prepare_threshold: int | None


# A diagnostic of the connection (fleetcron doctor), not a store operation: not in
# queries.sql, never prepared, and it neither reads nor writes a table.
_BACKEND_PID = "SELECT pg_backend_pid()"


def _backend_pid(conn: Any) -> BackendPid:
    row = conn.execute(_BACKEND_PID, prepare=False).fetchone()
    return BackendPid(announced=int(conn.info.backend_pid), reported=int(row[0]))


class PostgresStore(AdvisoryCapable, SqlSyncStore):
    """Sync PostgreSQL store."""

    dialect = "postgres"
    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT

    def __init__(self, url: StoreURL, *, auto_migrate: bool = True) -> None:
        check_conninfo(url)
        self._cursor: Any = None
        self._read_committed = False  # the connection's default isolation
        self._multi_host = multi_host(url)
        self._unreplicated = UnreplicatedCommits()
        super().__init__(url, auto_migrate=auto_migrate)

    def _operations(self) -> PostgresOperations:
        return PostgresOperations()

    def _connect(self) -> Any:
        conn = psycopg.connect(self._url.driver_url, **connect_kwargs(self._url))
        try:
            row = conn.execute(_DEFAULT_ISOLATION, prepare=False).fetchone()
        except BaseException:
            conn.close()
            raise
        self._read_committed = row is not None and row[0] == "read committed"
        conn.add_notice_handler(self._unreplicated.notice)
        return conn

    def _guarded(self, work: Callable[[Any], R]) -> R:
        def bounded(conn: Any) -> R:
            fd = conn.pgconn.socket
            self._unreplicated.forget()
            try:
                # The deadline bounds a commit waiting for a synchronous standby too, which
                # statement_timeout does not (it is off by then).
                with deadline(fd, self._url.timeout_s) as limit:
                    result = work(conn)
            except psycopg.Error as exc:
                if limit.expired:
                    raise timed_out(self._url) from exc
                raise
            if limit.expired:
                # Cut just after the reply came: the result stands, the socket does not.
                self._discard()
            self._unreplicated.check(self._url)
            return result

        return super()._guarded(bounded)

    def _execute(self, conn: Any, sql: str, params: Mapping[str, object]) -> SqlResult:
        # One cursor per connection, reused: creating one costs as much as the Python side
        # of the statement itself.
        cur = self._cursor
        if cur is None or cur.connection is not conn or cur.closed:
            cur = self._cursor = conn.cursor()
        prepare = _prepare(sql)
        for attempt in range(_RETRIES):
            try:
                cur.execute(sql, params, prepare=prepare)
                break
            except _RETRYABLE:
                if attempt == _RETRIES - 1 or conn.info.transaction_status != _IDLE:
                    raise
                time.sleep(retry_pause(attempt))
        return _result(cur, sql)

    def _execute_batch(
        self, conn: Any, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        groups = batch_transactions(batch)
        if len(batch) == 1 and self._read_committed:
            return [self._execute(conn, sql, batch[0])]  # its own READ COMMITTED transaction
        attempt = 0
        while True:
            cursors = [conn.cursor() for _ in batch]
            try:
                with conn.cursor() as side, conn.pipeline():
                    for group in groups:
                        side.execute(_BEGIN)
                        for index in group:
                            cursors[index].execute(sql, batch[index])
                        side.execute(_COMMIT)
                return [_result(cur, sql) for cur in cursors]
            except _RETRYABLE:
                _end_failed_transaction(conn)
                # One transaction refused as a whole changed nothing: send it again. With
                # several, one may have committed before: the error goes up.
                if attempt == _RETRIES - 1 or len(groups) > 1:
                    raise
                time.sleep(retry_pause(attempt))
                attempt += 1
            except psycopg.Error:
                _end_failed_transaction(conn)
                raise
            finally:
                for cur in cursors:
                    cur.close()

    def _translate(self, exc: BaseException) -> FleetcronError | None:
        return translate(exc, multi_host=self._multi_host)

    def doctor_facts(
        self,
    ) -> tuple[PoolingFacts | PoolingUnknown, ReplicationFacts | ReplicationUnknown]:
        """What ``fleetcron doctor`` judges of this connection: whether a pooler stands
        before the server, and in which mode (:mod:`fleetcron.stores.sql.pooling`); the
        replication mode (:mod:`fleetcron.stores.sql.replication`). A probe refused for a
        reason other than an outage (too many clients) is said as unknown."""
        from fleetcron.stores.sql.pooling import PoolingFacts, PoolingUnknown

        pooling: PoolingFacts | PoolingUnknown
        try:
            probe = self.backend_pids()
        except StoreUnavailable:
            raise
        except StoreError as exc:
            pooling = PoolingUnknown(exc.message)
        else:
            pooling = PoolingFacts(
                first=tuple((pid.announced, pid.reported) for pid in probe.first),
                second=tuple((pid.announced, pid.reported) for pid in probe.second),
                prepares=probe.prepare_threshold is not None,
            )
        return pooling, self.replication()

    def replication(self) -> ReplicationFacts | ReplicationUnknown:
        """The replication mode of the server this store writes to (for ``fleetcron
        doctor``). Changes nothing."""
        try:
            row = self._guarded(
                lambda conn: conn.execute(REPLICATION_QUERY, prepare=False).fetchone()
            )
        except StoreUnavailable:
            raise
        except StoreError as exc:
            return ReplicationUnknown(exc.message)
        return replication_facts(tuple(row), multi=self._multi_host)

    def backend_pids(self, statements: int = 3) -> PoolerProbe:
        """Whether a connection pooler stands between this store and PostgreSQL, and
        whether it pools per transaction (for ``fleetcron doctor``): ``statements``
        autocommit statements on this store's connection, each followed by one on a second
        connection opened for the purpose and closed after. Without a pooler each
        connection reports the pid announced at connect, every time. A pooler announces a
        pid of its own; in transaction mode it hands the server connection one client's
        statement just released to the other client's (PgBouncer reuses the most recently
        used one), so the two report the same pid. Changes nothing and sets nothing."""
        other = PostgresStore(self._url, auto_migrate=False)
        try:
            first, second = [], []
            for _ in range(statements):
                first.append(self._guarded(_backend_pid))
                second.append(other._guarded(_backend_pid))
            threshold = self._guarded(lambda conn: conn.prepare_threshold)
        finally:
            other.close()
        return PoolerProbe(first=tuple(first), second=tuple(second), prepare_threshold=threshold)

    def _migrate_locked(self) -> list[str]:
        conn = self._connection()
        applied: list[str] = []
        try:
            with conn.transaction():
                # Transaction-local: nothing of it outlives the migration.
                conn.execute(self.queries["migration_settings"])
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
            error = self._translate(exc)
            assert error is not None
            raise error from exc
        return applied


class AsyncPostgresStore(AdvisoryCapable, AsyncSqlStore):
    """Async PostgreSQL store over one ``psycopg.AsyncConnection``."""

    dialect = "postgres"
    capabilities = PostgresStore.capabilities
    sync_store = PostgresStore

    def __init__(self, url: StoreURL) -> None:
        check_conninfo(url)
        self._read_committed = False  # the connection's default isolation
        self._multi_host = multi_host(url)
        self._unreplicated = UnreplicatedCommits()
        super().__init__(url, PostgresOperations())

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url.driver_url, **connect_kwargs(self._url)
            )
        except psycopg.Error as exc:
            raise connect_error(self.url, self._translate(exc)) from exc
        try:
            row = await (await conn.execute(_DEFAULT_ISOLATION, prepare=False)).fetchone()
        except psycopg.Error as exc:
            await self._close(conn)
            raise connect_error(self.url, self._translate(exc)) from exc
        except BaseException:
            await self._close(conn)
            raise
        self._read_committed = row is not None and row[0] == "read committed"
        conn.add_notice_handler(self._unreplicated.notice)
        return conn

    def _translate(self, exc: BaseException) -> FleetcronError | None:
        return translate(exc, multi_host=self._multi_host)

    async def _close(self, conn: Any) -> None:
        with contextlib.suppress(psycopg.Error):
            await conn.close()

    async def _bounded(
        self,
        conn: psycopg.AsyncConnection[Any],
        work: Callable[[], Awaitable[R]],
        *,
        in_transaction: bool = False,
    ) -> R:
        """Run ``work`` under the read timeout's watchdog, translating driver errors; a
        connection cut or broken is dropped (the next statement reconnects)."""
        limit: Deadline | None = None
        self._unreplicated.forget()
        try:
            limit = deadline(conn.pgconn.socket, self._url.timeout_s)
            with limit:  # a commit waiting for a synchronous standby too
                result = await work()
        except psycopg.Error as exc:
            expired = limit is not None and limit.expired
            error = timed_out(self._url) if expired else self._translate(exc)
            assert error is not None
            if isinstance(error, StoreUnavailable):
                await self._drop_connection()
            elif in_transaction:
                await _end_failed_transaction_async(conn)
            raise error from exc
        if limit.expired:  # set: the block ran
            # Cut just after the reply came: the result stands, the socket does not.
            await self._drop_connection()
        try:
            self._unreplicated.check(self._url)
        except StoreUnavailable:
            await self._drop_connection()
            raise
        return result

    async def _execute_text(self, sql: str, params: dict[str, object]) -> SqlResult:
        conn = await self._connection()
        return await self._bounded(conn, lambda: self._execute_on(conn, sql, params))

    async def _execute_on(
        self, conn: psycopg.AsyncConnection[Any], sql: str, params: dict[str, object]
    ) -> SqlResult:
        prepare = _prepare(sql)
        async with conn.cursor() as cur:
            for attempt in range(_RETRIES):
                try:
                    await cur.execute(sql, params, prepare=prepare)
                    break
                except _RETRYABLE:
                    if attempt == _RETRIES - 1 or conn.info.transaction_status != _IDLE:
                        raise
                    await asyncio.sleep(retry_pause(attempt))
            return await _result_async(cur, sql)

    async def _execute_batch(
        self, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        conn = await self._connection()
        if len(batch) == 1 and self._read_committed:
            # Its own READ COMMITTED transaction, as one statement.
            return [await self._bounded(conn, lambda: self._execute_on(conn, sql, dict(batch[0])))]
        groups = batch_transactions(batch)
        attempt = 0
        while True:
            cursors = [conn.cursor() for _ in batch]

            async def work(cursors: list[Any] = cursors) -> list[SqlResult]:
                async with conn.cursor() as side, conn.pipeline():
                    for group in groups:
                        await side.execute(_BEGIN)
                        for index in group:
                            await cursors[index].execute(sql, batch[index])
                        await side.execute(_COMMIT)
                return [await _result_async(cur, sql) for cur in cursors]

            try:
                return await self._bounded(conn, work, in_transaction=True)
            except StoreError as error:
                # As in the sync face: one transaction refused as a whole is sent again.
                if (
                    not isinstance(error.__cause__, _RETRYABLE)
                    or attempt == _RETRIES - 1
                    or len(groups) > 1
                ):
                    raise
            finally:
                for cur in cursors:
                    await cur.close()
            await asyncio.sleep(retry_pause(attempt))
            attempt += 1


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> PostgresStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`)."""
    return PostgresStore(url, auto_migrate=auto_migrate)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncPostgresStore:
    """The backend's async entry point: connected, and migrated when ``migrate``."""
    store = AsyncPostgresStore(url)
    await opened(store, store.open(migrate=migrate))
    return store
