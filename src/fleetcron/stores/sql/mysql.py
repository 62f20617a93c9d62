"""MySQL 8 / MariaDB 10.6+ store (PyMySQL).

Connections use ``CLIENT_MULTI_STATEMENTS`` so a multi-statement block is one round trip,
and ``CLIENT_FOUND_ROWS`` so an UPDATE reports the rows it matched.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
from fleetcron.stores.base import AsyncStore, Capability, opened
from fleetcron.stores.sql.checkpoints import SqlCheckpoints
from fleetcron.stores.sql.operations import SqlLedger, SqlOperations
from fleetcron.stores.sql.queue import SqlQueue
from fleetcron.stores.sql.runner import SqlSyncStore, column_names, retry_pause, store_error
from fleetcron.stores.sql.statements import SqlResult
from fleetcron.stores.sql.watchdog import deadline
from fleetcron.stores.url import StoreURL

__all__ = [
    "RETRIES",
    "MysqlOperations",
    "MysqlStore",
    "batch_text",
    "connect",
    "connect_args",
    "connect_timed_out",
    "open_async",
    "open_sync",
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

    The URL's ``connect_timeout`` is PyMySQL's, which bounds only the TCP connect
    (:func:`connect` bounds the whole connect with it); its ``timeout`` bounds every reply
    (PyMySQL's ``read_timeout``) and every send (``write_timeout``). ``unix_socket`` is the
    only other parameter; any other is refused."""
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
            "sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
            # room for the queue claim's ordered list of candidates (GROUP_CONCAT, which
            # MySQL cuts at 1,024 bytes by default): 20,064 of them at most
            "group_concat_max_len = 4194304"
        ),
    }
    if "unix_socket" in query:
        args["unix_socket"] = query.pop("unix_socket")
    if args["database"] is None:
        raise ConfigurationError(f"backend URL {url.redacted!r} names no database (mysql://…/DB)")
    return args


def connect_timed_out(url: StoreURL) -> StoreUnavailable:
    """The error of a connect given up on after the backend URL's ``connect_timeout``."""
    return StoreUnavailable(
        f"cannot connect to {url.redacted}: no answer within {url.connect_timeout_s:g} s "
        "(the backend URL's connect_timeout)"
    )


class _ConnectTimeout(pymysql.err.OperationalError):
    """The connect outlived ``connect_timeout``."""


if TYPE_CHECKING:
    _Connection = pymysql.connections.Connection[Any]  # generic in the stubs only
else:
    _Connection = pymysql.connections.Connection


class _BoundedConnection(_Connection):
    """A PyMySQL connection made within ``connect_timeout``, all of it.

    PyMySQL bounds only the TCP connect by ``connect_timeout``: the server's greeting, the
    authentication and the set-up statements then wait up to ``read_timeout`` each, so a
    server that accepts and stays silent (paused, or hung with its listen backlog still
    open) held a client for the URL's ``timeout``, 30 s by default. Here the socket is
    opened first, as PyMySQL opens it, and handed to PyMySQL under one deadline for the
    rest: when it passes, the watchdog shuts the socket down and PyMySQL, waiting on it,
    wakes up with the connection closed. (A reply that takes longer than ``read_timeout``
    is given up on sooner, as after the connect.)"""

    def connect(self, sock: socket.socket | None = None) -> None:
        if sock is not None:
            super().connect(sock)
            return
        limit = float(self.connect_timeout or 0) or None
        started = time.monotonic()
        sock = self._open_socket(limit)
        if limit is None:
            super().connect(sock)
            return
        # The watchdog gets a descriptor of its own: PyMySQL closes the socket on an error,
        # and the number it frees could be another socket's when the deadline passes.
        watched = os.dup(sock.fileno())
        cut = deadline(watched, limit - (time.monotonic() - started))
        try:
            with cut:
                super().connect(sock)
        except pymysql.err.MySQLError:
            if cut.expired:
                raise _ConnectTimeout(2013, "no answer within connect_timeout") from None
            raise
        finally:
            os.close(watched)
        if cut.expired:  # cut just as the connect ended: the socket is gone
            super().close()
            raise _ConnectTimeout(2013, "no answer within connect_timeout")

    def _open_socket(self, limit: float | None) -> socket.socket:
        """The socket PyMySQL's own ``connect`` would open (TCP with no delay and
        keepalives, or the unix socket), within ``limit`` seconds."""
        sock: socket.socket | None = None
        try:
            if self.unix_socket:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(limit)
                sock.connect(self.unix_socket)
                self.host_info = "Localhost via UNIX socket"
                # As PyMySQL's own connect marks a unix socket: the password may go in
                # clear over it (caching_sha2_password, sha256_password).
                self._secure = True
            else:
                sock = socket.create_connection((self.host, self.port), limit)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                self.host_info = f"socket {self.host}:{self.port}"
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise _ConnectTimeout(2003, "no answer within connect_timeout") from None
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise pymysql.err.OperationalError(
                2003, f"Can't connect to MySQL server on {self.host!r} ({exc})"
            ) from exc
        return sock


def connect(args: dict[str, Any], url: StoreURL) -> pymysql.connections.Connection[Any]:
    """A PyMySQL connection made with ``args`` (:func:`connect_args`) within the URL's
    ``connect_timeout``: the TCP connect, the server's greeting, the authentication and
    the set-up statements together. Raises :class:`StoreUnavailable` naming the timeout
    when it passes or a reply outlives ``timeout``, and PyMySQL's errors otherwise."""
    try:
        return _BoundedConnection(**args)
    except _ConnectTimeout:
        raise connect_timed_out(url) from None
    except pymysql.err.OperationalError as exc:
        if isinstance(exc.__context__, TimeoutError):  # a reply slower than read_timeout
            raise StoreUnavailable(
                f"cannot connect to {url.redacted}: no reply within {url.timeout_s:g} s "
                "(the backend URL's timeout)"
            ) from exc
        raise


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
        return connect(self._args, self._url)

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


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> MysqlStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`)."""
    return MysqlStore(url, auto_migrate=auto_migrate)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncStore:
    """The backend's async entry point (aiomysql): connected, and migrated when
    ``migrate``."""
    from fleetcron.stores.sql.mysql_async import AsyncMysqlStore

    store = AsyncMysqlStore(url)
    await opened(store, store.open(migrate=migrate))
    return store
