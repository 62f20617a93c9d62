"""Fencing and idempotency for your own database: the checks that make a stale holder's
writes fail, inside the transaction that does the work (docs/idempotency.md).

A lease cannot stop a holder that was paused past its expiry from writing when it wakes;
the data can. Every lease, run and queue delivery carries a fencing token (``ctx.fence``,
``lease.fence``, ``item.fence``) strictly greater than every earlier one of the same name.
:func:`check` records the highest token a *resource* has accepted, in a table of your
database, and refuses a lower one — in the same transaction as the work, so the work and
the check commit together or not at all::

    with conn.transaction():                      # psycopg; or sqlite3/PyMySQL/SQLAlchemy
        fencing.check(conn, "invoices", ctx.fence)   # StaleFence: nothing is written
        conn.execute("INSERT INTO invoices …")

:func:`once` is the processed marker: it records a key in the same transaction as the work
and says whether the key was new, so a repeated run skips work that committed already.

Both take a DB-API connection of ``sqlite3``, psycopg 3 or PyMySQL, or a SQLAlchemy
``Connection``; they run on it and never commit or roll back (the transaction is yours).
Their tables (``fleetcron_fence``, ``fleetcron_once``) are made by :func:`create_tables`
(or by your migrations: :func:`table_sql` gives the statements).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Literal

from fleetcron.errors import ConfigurationError, FleetcronError

__all__ = ["StaleFence", "check", "create_tables", "once", "table_sql"]

Dialect = Literal["sqlite", "postgresql", "mysql"]
_MAX_KEY = 255


class StaleFence(FleetcronError):
    """A write under a fencing token lower than one the resource has already accepted:
    the holder has lost its lease (another holder has worked since). Roll back and stop."""

    def __init__(self, resource: str, fence: int, highest: int) -> None:
        super().__init__(
            f"stale fence for {resource!r}: {fence} is lower than {highest}, which the "
            "resource has accepted already (another holder has the lease): roll back"
        )
        self.resource = resource
        self.fence = fence
        self.highest = highest


def table_sql(dialect: Dialect) -> list[str]:
    """The statements that create the two tables on ``dialect`` (idempotent)."""
    key = "text" if dialect != "mysql" else f"varchar({_MAX_KEY})"
    fence = "INTEGER" if dialect == "sqlite" else "bigint"
    return [
        "CREATE TABLE IF NOT EXISTS fleetcron_fence ("
        f"resource {key} NOT NULL PRIMARY KEY, fence {fence} NOT NULL)",
        "CREATE TABLE IF NOT EXISTS fleetcron_once ("
        f"marker {key} NOT NULL PRIMARY KEY, fence {fence})",
    ]


def create_tables(conn: Any) -> None:
    """Create ``fleetcron_fence`` and ``fleetcron_once`` in the connection's database if
    they do not exist (DDL: on MySQL it commits what the connection had pending)."""
    db = _Db(conn)
    for statement in table_sql(db.dialect):
        db.execute(statement, ())


def _check_fence(fence: object) -> None:
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
        raise ConfigurationError(f"a fence is a non-negative integer, not {fence!r}")


def check(conn: Any, resource: str, fence: int) -> None:
    """Accept ``fence`` for ``resource`` or raise :class:`StaleFence`, inside the caller's
    transaction: a fence at least as high as every one accepted before is recorded (the
    row stays locked until the transaction ends, so two holders cannot both pass); a
    lower one writes nothing and raises. The same fence passes again (one holder, many
    writes)."""
    name = _key(resource, "resource")
    _check_fence(fence)
    db = _Db(conn)
    if db.dialect == "mysql":
        # No RETURNING: the upsert takes the row lock; the read under it sees the outcome.
        db.execute(
            "INSERT INTO fleetcron_fence (resource, fence) VALUES (%s, %s) "
            "ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
            (name, fence),
        )
        highest = int(db.fetch("SELECT fence FROM fleetcron_fence WHERE resource = %s", (name,)))
    else:
        mark = "?" if db.dialect == "sqlite" else "%s"
        row = db.fetch(
            f"INSERT INTO fleetcron_fence (resource, fence) VALUES ({mark}, {mark}) "
            "ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence "
            "WHERE fleetcron_fence.fence <= excluded.fence RETURNING fence",
            (name, fence),
            optional=True,
        )
        if row is not None:
            return
        highest = int(
            db.fetch(f"SELECT fence FROM fleetcron_fence WHERE resource = {mark}", (name,))
        )
    if highest > fence:
        raise StaleFence(name, fence, highest)


def once(conn: Any, key: str, fence: int | None = None) -> bool:
    """Record the processed marker ``key`` in the caller's transaction; whether it is new.
    ``False``: the work it marks has committed already — skip it. Rolled back with the
    transaction, so a crash before the commit leaves the work to be done again."""
    marker = _key(key, "marker")
    if fence is not None:
        _check_fence(fence)
    db = _Db(conn)
    if db.dialect == "mysql":
        # A failed statement does not end an InnoDB transaction, so the duplicate key is
        # the answer (never INSERT IGNORE, which would hide truncation too).
        try:
            db.execute(
                "INSERT INTO fleetcron_once (marker, fence) VALUES (%s, %s)", (marker, fence)
            )
        except Exception as exc:
            if _mysql_errno(exc) == _DUPLICATE_KEY:
                return False
            raise
        return True
    mark = "?" if db.dialect == "sqlite" else "%s"
    row = db.fetch(
        f"INSERT INTO fleetcron_once (marker, fence) VALUES ({mark}, {mark}) "
        "ON CONFLICT (marker) DO NOTHING RETURNING marker",
        (marker, fence),
        optional=True,
    )
    return row is not None


_DUPLICATE_KEY = 1062


def _mysql_errno(exc: BaseException) -> int | None:
    """The MySQL error number of a PyMySQL error, or of one SQLAlchemy wraps."""
    for error in (exc, getattr(exc, "orig", None)):
        args = getattr(error, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def _key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"a {what} is a non-empty string, not {value!r}")
    if len(value) > _MAX_KEY:
        raise ConfigurationError(
            f"a {what} is at most {_MAX_KEY} characters, not {len(value)}: {value[:40]!r}…"
        )
    # Refused on every database alike, so that a key that works on one works on all:
    # PostgreSQL's text cannot hold a NUL, and a lone surrogate has no UTF-8 bytes.
    nul = value.find("\x00")
    if nul >= 0:
        raise ConfigurationError(
            f"a {what} cannot hold a NUL character: {value[:40]!r} has one at position {nul}"
        )
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"a {what} is text that UTF-8 can encode, not {value[:40]!r} "
            f"({exc.reason} at position {exc.start})"
        ) from None
    return value


class _Db:
    """One connection of a known kind, with its parameter style."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sqlalchemy = hasattr(conn, "exec_driver_sql")
        self.dialect = _dialect(conn)

    def execute(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run ``sql``; the rows it changed."""
        if self.sqlalchemy:
            return int(self.conn.exec_driver_sql(sql, params).rowcount)
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def fetch(self, sql: str, params: tuple[Any, ...], *, optional: bool = False) -> Any:
        """Run ``sql``; the first column of its first row (``None`` for no row, when
        ``optional``)."""
        if self.sqlalchemy:
            # exec_driver_sql hands the text to the DB-API driver as it is: the statements
            # here are written in each driver's own parameter style.
            row = self.conn.exec_driver_sql(sql, params).first()
        else:
            cursor = self.conn.cursor()
            try:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            finally:
                cursor.close()
        if row is None:
            if optional:
                return None
            raise FleetcronError(f"no row from {sql.split()[0]} on fleetcron's fence tables")
        return row[0]


def _dialect(conn: Any) -> Dialect:
    if hasattr(conn, "exec_driver_sql"):  # a SQLAlchemy Connection
        name = conn.dialect.name
    elif isinstance(conn, sqlite3.Connection):
        name = "sqlite"
    else:
        module = type(conn).__module__.split(".")[0]
        name = {"psycopg": "postgresql", "pymysql": "mysql"}.get(module, module)
    if name == "sqlite":
        return "sqlite"
    if name == "postgresql":
        return "postgresql"
    if name in ("mysql", "mariadb"):
        return "mysql"
    raise ConfigurationError(
        f"fleetcron.fencing works with sqlite3, psycopg 3, PyMySQL and SQLAlchemy "
        f"connections, not {type(conn).__module__}.{type(conn).__name__}"
    )
