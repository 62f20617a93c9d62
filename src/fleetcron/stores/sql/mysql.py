"""MySQL 8 / MariaDB 10.6+ store (PyMySQL).

Connections use ``CLIENT_MULTI_STATEMENTS`` so a multi-statement block is one round trip,
and ``CLIENT_FOUND_ROWS`` so an UPDATE reports the rows it matched.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import pymysql
from pymysql.constants import CLIENT

from fleetcron.errors import (
    ConfigurationError,
    FleetcronError,
    SchemaError,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from fleetcron.stores.base import Capability, SqlResult
from fleetcron.stores.sql.checkpoints import SqlCheckpoints
from fleetcron.stores.sql.operations import SqlLedger, SqlOperations
from fleetcron.stores.sql.queue import SqlQueue
from fleetcron.stores.sql.runner import SqlSyncStore, column_names, retry_pause, store_error
from fleetcron.stores.url import StoreURL

__all__ = [
    "RETRIES",
    "MysqlOperations",
    "MysqlStore",
    "batch_text",
    "connect_args",
    "resendable",
    "split_results",
]

_UNAVAILABLE_CODES = {2002, 2003, 2005, 2006, 2013, 2055, 1040, 1053}
_NO_TABLE = 1146
# Access denied (1044, 1045, 1698), unknown database (1049), command/column denied
# (1142, 1143), missing privilege (1227), read-only server (1290, 1836).
_REFUSED_CODES = {1044, 1045, 1049, 1142, 1143, 1227, 1290, 1698, 1836}
# A deadlock (1213; 1467 when MariaDB found it while the victim waited for a table's
# AUTO-INC lock, as concurrent queue puts can): InnoDB rolls the victim's transaction back.
_DEADLOCK_CODES = {1213, 1467}
RETRIES = 8
"""Tries of a block that is one transaction, refused by a deadlock."""


_QUERY_KEYS = ("unix_socket",)


def connect_args(url: StoreURL) -> dict[str, Any]:
    """PyMySQL keyword arguments from a ``mysql://user:pass@host:port/db?…`` URL.

    The URL's ``connect_timeout`` bounds the TCP connect; its ``timeout`` bounds the
    greeting and every reply (PyMySQL's ``read_timeout``) and every send
    (``write_timeout``). ``unix_socket`` is the only other parameter; any other is refused."""
    parts = urllib.parse.urlsplit(url.driver_url)
    query = url.query
    unknown = sorted(set(query) - set(_QUERY_KEYS))
    if unknown:
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: unknown parameter(s) {', '.join(unknown)}; "
            "known: timeout, connect_timeout, unix_socket"
        )
    args: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": urllib.parse.unquote(parts.username or "root"),
        "password": urllib.parse.unquote(parts.password or ""),
        "database": urllib.parse.unquote(parts.path.lstrip("/")) or None,
        "charset": "utf8mb4",
        "autocommit": True,
        "connect_timeout": url.connect_timeout_s,
        "read_timeout": url.timeout_s,
        "write_timeout": url.timeout_s,
        "client_flag": CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS,
        # Pin what the statements rely on, whatever the server's defaults; sent together
        # with the isolation level below in one round trip.
        "init_command": (
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;"
            "SET SESSION time_zone = '+00:00', "
            "sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
        ),
    }
    if "unix_socket" in query:
        args["unix_socket"] = query.pop("unix_socket")
    if args["database"] is None:
        raise ConfigurationError(f"backend URL {url.redacted!r} names no database (mysql://…/DB)")
    return args


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a PyMySQL exception to fleetcron's hierarchy."""
    if not isinstance(exc, pymysql.err.MySQLError):
        return None
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code == _NO_TABLE:
        return store_error(SchemaError, exc, "schema missing: ")
    if code in _REFUSED_CODES:
        return store_error(StoreRefused, exc)
    if code in _UNAVAILABLE_CODES or isinstance(exc, pymysql.err.InterfaceError):
        return store_error(StoreUnavailable, exc)
    if isinstance(exc, pymysql.err.OperationalError) and code is not None and code >= 2000:
        return store_error(StoreUnavailable, exc)
    return store_error(StoreError, exc)


def resendable(exc: BaseException | None, sql: str) -> bool:
    """Whether the block ``sql``, stopped by ``exc``, may be sent again: a deadlock of a
    block that is one transaction (``START TRANSACTION`` first) changed nothing, its
    transaction being rolled back. A block of several transactions is never sent again:
    the ones before the failure stay committed."""
    code = exc.args[0] if isinstance(exc, pymysql.err.MySQLError) and exc.args else None
    return code in _DEADLOCK_CODES and sql.lstrip().upper().startswith("START TRANSACTION")


class MysqlOperations(SqlOperations, SqlLedger, SqlQueue, SqlCheckpoints):
    """Lease, run-ledger, work-queue and checkpoint operations of MySQL/MariaDB
    (``lease_acquire`` needs ``lease_create`` for a name's first use)."""

    def __init__(self) -> None:
        super().__init__(creates_rows=True)


def batch_text(cur: Any, sql: str, batch: Sequence[Mapping[str, object]]) -> str:
    """One text running ``sql`` once per parameter set, each bound with the driver's
    escaping (``mogrify``): sent as one multi-statement round trip. Every statement of a
    batch happens at one store time, ``@fc_batch_t`` (set first, cleared last; a batch
    stopped by an error leaves it set, but every batch sets it again before use)."""
    parts = [cur.mogrify(sql, dict(params)) for params in batch]
    return ";\n".join(["SET @fc_batch_t = UTC_TIMESTAMP(6)", *parts, "SET @fc_batch_t = NULL"])


def split_results(results: list[SqlResult], expected: int) -> list[SqlResult]:
    """Check that a batch gave one result set per parameter set."""
    if len(results) != expected:
        raise StoreError(f"a batch of {expected} statements returned {len(results)} result sets")
    return results


class MysqlStore(SqlSyncStore):
    """Sync MySQL/MariaDB store."""

    dialect = "mysql"
    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT

    def __init__(self, url: StoreURL, *, auto_migrate: bool = True) -> None:
        self._args = connect_args(url)
        super().__init__(url, auto_migrate=auto_migrate)

    def _operations(self) -> MysqlOperations:
        return MysqlOperations()

    def _connect(self) -> Any:
        return pymysql.connect(**self._args)

    def _execute(self, conn: Any, sql: str, params: Mapping[str, object]) -> SqlResult:
        with conn.cursor() as cur:
            text = cur.mogrify(sql, params or None)
            for attempt in range(RETRIES):
                try:
                    sets, rowcount = _result_sets(conn, cur, text)
                    break
                except pymysql.err.MySQLError as exc:
                    if attempt == RETRIES - 1 or not resendable(exc, sql):
                        raise
                    time.sleep(retry_pause(attempt))
        if not sets:
            return SqlResult(rows=[], rowcount=rowcount)
        return SqlResult(rows=sets[-1].rows, rowcount=rowcount, columns=sets[-1].columns)

    def _execute_batch(
        self, conn: Any, sql: str, batch: Sequence[Mapping[str, object]]
    ) -> list[SqlResult]:
        with conn.cursor() as cur:
            sets, _ = _result_sets(conn, cur, batch_text(cur, sql, batch))
        return split_results(sets, len(batch))

    def _translate(self, exc: BaseException) -> FleetcronError | None:
        return translate(exc)

    def _migrate_locked(self) -> list[str]:
        conn = self._connection()
        applied: list[str] = []
        try:
            self._execute(conn, self.queries["migration_lock"], {})
            try:
                self._execute(conn, self.queries["schema_init"], {})
                for migration in self._pending():
                    for statement in migration.statements:
                        self._execute(conn, statement, {})
                    self._execute(
                        conn,
                        self.queries["schema_record"],
                        {"version": migration.version, "name": migration.name},
                    )
                    applied.append(migration.name)
            finally:
                self._execute(conn, self.queries["migration_unlock"], {})
        except pymysql.err.MySQLError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc
        return applied


def _result_sets(conn: Any, cur: Any, text: str) -> tuple[list[SqlResult], int]:
    """Run a (multi-statement) text in one round trip: every result set that has columns, in
    order, each with its column names and the matched count of the statement before it,
    and the last DML's count.
    On an error the transaction a block opened is rolled back, never left for a commit."""
    sets: list[SqlResult] = []
    rowcount = 0
    try:
        cur.execute(text)
        while True:
            if cur.description is not None:
                rows = list(cur.fetchall())
                sets.append(SqlResult(rows, rowcount, column_names(cur.description)))
            else:
                rowcount = cur.rowcount
            if not cur.nextset():
                break
    except pymysql.err.MySQLError:
        try:
            conn.rollback()
        except pymysql.err.MySQLError:
            pass
        raise
    return sets, rowcount
