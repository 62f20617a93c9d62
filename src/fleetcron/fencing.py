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

Resources and markers compare as exact text on every database: two keys that differ in
case, accents or trailing spaces are two keys. On MySQL and MariaDB the keys are their
UTF-8 bytes (``VARBINARY``), whatever the database's default collation or character set;
tables made by an earlier fleetcron (``varchar`` in that collation) are refused until
:func:`create_tables` upgrades them (:func:`upgrade_sql` gives the statements).
"""

from __future__ import annotations

import sqlite3
import weakref
from typing import Any, Literal

from fleetcron.errors import ConfigurationError, FleetcronError

__all__ = ["MAX_FENCE", "StaleFence", "check", "create_tables", "once", "table_sql", "upgrade_sql"]

Dialect = Literal["sqlite", "postgresql", "mysql"]
MAX_FENCE = 2**63 - 1
"""The highest fence the tables hold (a signed 64-bit ``bigint``, SQLite's ``INTEGER``);
every fencing token fleetcron hands out fits in it."""
_MAX_KEY = 255
# UTF-8 takes at most 4 bytes a character: the MySQL column holds a key of _MAX_KEY.
_MAX_KEY_BYTES = 4 * _MAX_KEY
_KEY_COLUMNS = {"fleetcron_fence": "resource", "fleetcron_once": "marker"}


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
    """The statements that create the two tables on ``dialect`` (idempotent). Keys compare
    byte for byte: ``text`` on SQLite and PostgreSQL (whose deterministic collations call
    two strings equal only when their bytes are), ``VARBINARY`` of the UTF-8 bytes on
    MySQL (a ``varchar`` would take the database's default collation, as a rule blind to
    case and accents, often to trailing spaces, and maybe latin1)."""
    key = f"varbinary({_MAX_KEY_BYTES})" if dialect == "mysql" else "text"
    fence = "INTEGER" if dialect == "sqlite" else "bigint"
    return [
        "CREATE TABLE IF NOT EXISTS fleetcron_fence ("
        f"resource {key} NOT NULL PRIMARY KEY, fence {fence} NOT NULL)",
        "CREATE TABLE IF NOT EXISTS fleetcron_once ("
        f"marker {key} NOT NULL PRIMARY KEY, fence {fence})",
    ]


def upgrade_sql(dialect: Dialect) -> list[str]:
    """The statements that give tables made by an earlier fleetcron exact keys on
    ``dialect``, for your migrations (:func:`create_tables` runs them itself when they are
    needed). Only MySQL has any: its key columns were ``varchar(255)`` in the database's
    default collation. Run them once, on tables whose key columns are still ``varchar``;
    existing keys stay findable, and each ``ALTER TABLE`` commits and copies its table."""
    if dialect != "mysql":
        return []
    return [sql for table, column in _KEY_COLUMNS.items() for sql in _mysql_upgrade(table, column)]


def _mysql_upgrade(table: str, column: str) -> list[str]:
    return [
        # Into UTF-8 first: the change to VARBINARY keeps the bytes as they are, and a
        # latin1 key's bytes are not its UTF-8 bytes (it would never be found again).
        f"ALTER TABLE {table} MODIFY {column} varchar({_MAX_KEY}) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
        f"ALTER TABLE {table} MODIFY {column} varbinary({_MAX_KEY_BYTES}) NOT NULL",
    ]


def create_tables(conn: Any) -> None:
    """Create ``fleetcron_fence`` and ``fleetcron_once`` in the connection's database if
    they do not exist, and upgrade in place those an earlier fleetcron made with inexact
    keys (MySQL: the statements of :func:`upgrade_sql`, one connection at a time;
    existing keys stay findable). DDL: on MySQL it commits what the connection had
    pending."""
    db = _Db(conn)
    for statement in table_sql(db.dialect):
        db.execute(statement, ())
    if db.dialect == "mysql":
        _upgrade_mysql(db)


def _check_fence(fence: object) -> None:
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
        raise ConfigurationError(f"a fence is a non-negative integer, not {fence!r}")
    if fence > MAX_FENCE:
        # Refused on every database alike (SQLite's driver raised OverflowError, the
        # others their own errors), before anything is written in the caller's transaction.
        raise ConfigurationError(f"a fence is 0 to {MAX_FENCE}, not {fence}")


def check(conn: Any, resource: str, fence: int) -> None:
    """Accept ``fence`` for ``resource`` or raise :class:`StaleFence`, inside the caller's
    transaction: a fence at least as high as every one accepted before is recorded (the
    row stays locked until the transaction ends, so two holders cannot both pass); a
    lower one writes nothing and raises. The same fence passes again (one holder, many
    writes). ``resource`` is compared exactly (case, accents and trailing spaces count);
    on MySQL, tables an earlier fleetcron made are refused with
    :class:`~fleetcron.errors.ConfigurationError` until :func:`create_tables` upgrades
    them. A fence outside 0 to :data:`MAX_FENCE` is a ConfigurationError too, and nothing
    is written."""
    name = _key(resource, "resource")
    _check_fence(fence)
    db = _Db(conn)
    if db.dialect == "mysql":
        _require_exact_keys(db)
        key = _hex(name)
        # No RETURNING: the upsert takes the row lock; the read under it sees the outcome.
        db.execute(
            "INSERT INTO fleetcron_fence (resource, fence) VALUES (UNHEX(%s), %s) "
            "ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
            (key, fence),
        )
        highest = int(
            db.fetch("SELECT fence FROM fleetcron_fence WHERE resource = UNHEX(%s)", (key,))
        )
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
    transaction, so a crash before the commit leaves the work to be done again. ``key`` is
    compared exactly, and refused on older MySQL tables, as :func:`check` does."""
    marker = _key(key, "marker")
    if fence is not None:
        _check_fence(fence)
    db = _Db(conn)
    if db.dialect == "mysql":
        _require_exact_keys(db)
        # A failed statement does not end an InnoDB transaction, so the duplicate key is
        # the answer (never INSERT IGNORE, which would hide truncation too).
        try:
            db.execute(
                "INSERT INTO fleetcron_once (marker, fence) VALUES (UNHEX(%s), %s)",
                (_hex(marker), fence),
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


def _hex(key: str) -> str:
    """``key``'s UTF-8 bytes as hex digits, for MySQL's ``UNHEX``: ASCII reads the same in
    every connection character set, while a driver may send bytes as a string literal of
    that character set (PyMySQL does, unless the connection has ``binary_prefix``)."""
    return key.encode().hex()


# The DB-API connections whose fence tables were seen to have exact keys: the look costs a
# round trip, paid once per connection instead of on every check (weak: a connection
# closed and collected leaves the set).
_exact_keys: weakref.WeakSet[Any] = weakref.WeakSet()


def _require_exact_keys(db: _Db) -> None:
    """Refuse MySQL fence tables whose keys do not compare byte for byte (made by an
    earlier fleetcron): they take keys that differ in case, accents or trailing spaces
    for one, so a marker would call work done that never was."""
    raw = db.dbapi_connection
    if raw in _exact_keys:
        return
    columns = _mysql_key_columns(db)
    loose = [
        f"{table}.{_KEY_COLUMNS[table]} is {found}"
        for table, found in sorted(columns.items())
        if found is not None
    ]
    if loose:
        raise ConfigurationError(
            f"{', '.join(loose)}, not varbinary({_MAX_KEY_BYTES}): keys that differ in "
            "case, accents or trailing spaces can be taken for one. "
            "fleetcron.fencing.create_tables(conn) upgrades the tables in place and keeps "
            "their keys (or run the statements of fleetcron.fencing.upgrade_sql('mysql'); "
            "docs/idempotency.md)"
        )
    if len(columns) == len(_KEY_COLUMNS):  # a missing table is not remembered as sound
        _exact_keys.add(raw)


def _mysql_key_columns(db: _Db) -> dict[str, str | None]:
    """The key column of each fence table in the connection's database: ``None`` where
    it compares exactly, else what it is (``varchar(255) in latin1_swedish_ci``); a
    table that does not exist is left out."""
    rows = db.rows(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, COLUMN_TYPE, "
        "COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME IN ('fleetcron_fence', 'fleetcron_once') "
        "AND COLUMN_NAME IN ('resource', 'marker')",
        (),
    )
    columns: dict[str, str | None] = {}
    for table, column, data_type, length, column_type, collation in map(_texts, rows):
        if _KEY_COLUMNS.get(table) != column:
            continue
        if data_type == "varbinary" and int(length) >= _MAX_KEY_BYTES:
            columns[table] = None
        else:
            columns[table] = f"{column_type} in {collation}" if collation else column_type
    return columns


def _texts(row: Any) -> list[Any]:
    # Some servers declare information_schema's text binary, and drivers answer bytes.
    return [bytes(v).decode() if isinstance(v, bytes | bytearray) else v for v in row]


_UPGRADE_LOCK = "fleetcron.fencing.upgrade"
_UPGRADE_WAIT_S = 600


def _upgrade_mysql(db: _Db) -> None:
    """Bring fence tables made by an earlier fleetcron to exact keys, one connection at a
    time (a named lock): a second upgrader that had looked before the first one finished
    would take the finished column back through ``varchar``, where keys written since
    can collide."""
    if all(found is None for found in _mysql_key_columns(db).values()):
        _exact_keys.add(db.dbapi_connection)
        return
    if db.fetch("SELECT GET_LOCK(%s, %s)", (_UPGRADE_LOCK, _UPGRADE_WAIT_S)) != 1:
        raise FleetcronError(
            f"the fence tables were not upgraded: the lock {_UPGRADE_LOCK!r} was not free "
            f"within {_UPGRADE_WAIT_S} s (another connection's upgrade still running?)"
        )
    try:
        for table, found in _mysql_key_columns(db).items():  # again, under the lock
            if found is not None:
                for statement in _mysql_upgrade(table, _KEY_COLUMNS[table]):
                    db.execute(statement, ())
    finally:
        db.execute("DO RELEASE_LOCK(%s)", (_UPGRADE_LOCK,))
    _exact_keys.add(db.dbapi_connection)


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

    @property
    def dbapi_connection(self) -> Any:
        """The driver's own connection (a SQLAlchemy ``Connection`` wraps a pooled one that
        outlives it)."""
        return self.conn.connection.dbapi_connection if self.sqlalchemy else self.conn

    def rows(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Run ``sql``; all its rows."""
        if self.sqlalchemy:
            return list(self.conn.exec_driver_sql(sql, params))
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
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
