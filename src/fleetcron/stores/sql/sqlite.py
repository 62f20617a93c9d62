"""SQLite store: one host, zero set-up. WAL, ``busy_timeout``, ``BEGIN IMMEDIATE``.

Every process on the host shares one clock, SQLite's ``'now'``, read inside the write
transaction. WAL needs shared memory, so a database on a network filesystem is refused.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from fleetcron.errors import (
    ConfigurationError,
    FleetcronError,
    SchemaError,
    StoreError,
    StoreMissing,
    StoreRefused,
    StoreReplaced,
    StoreUnavailable,
)
from fleetcron.stores.base import Capability, Operation, drive
from fleetcron.stores.sql.runner import SqlSyncStore, column_names, store_error
from fleetcron.stores.sql.sqlite_file import DatabaseFile
from fleetcron.stores.sql.sqlite_operations import SqliteOperations
from fleetcron.stores.sql.statements import SqlResult
from fleetcron.stores.url import StoreURL, default_sqlite_path, sqlite_url

__all__ = [
    "NETWORK_FILESYSTEMS",
    "SqliteStore",
    "check_relative_directory",
    "check_sqlite_path",
    "filesystem_type",
    "open_sync",
]

T = TypeVar("T")

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "9p", "afs",
        "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "davfs", "fuse.sshfs",
        "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "fuse.davfs",
    }
)  # fmt: skip
MOUNTINFO = Path("/proc/self/mountinfo")


def filesystem_type(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The filesystem type holding ``path`` (longest matching mount point), if known."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, best_type = "", None
    for line in lines:
        fields = line.split()
        try:
            mount_point = fields[4].replace("\\040", " ")
            fs_type = fields[fields.index("-") + 1]
        except (IndexError, ValueError):
            continue
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fs_type
    return best_type


def check_sqlite_path(path: Path, *, create_parent: bool, mountinfo: Path = MOUNTINFO) -> Path:
    """Refuse paths SQLite cannot serve safely; return the absolute path.

    Raises :class:`ConfigurationError` for a network filesystem, a missing or read-only
    directory, or a read-only database file — before anything is created.
    """
    path = path.expanduser().absolute()
    parent = path.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    # Refuse a network filesystem before creating anything on it.
    fs_type = filesystem_type(existing, mountinfo)
    if fs_type is not None and (fs_type in NETWORK_FILESYSTEMS or fs_type.startswith("nfs")):
        raise ConfigurationError(
            f"SQLite database {path} is on a network filesystem ({fs_type}); SQLite's WAL "
            "needs one host — use postgresql://, mysql:// or redis:// for a fleet"
        )
    if not parent.exists():
        if not create_parent:
            raise ConfigurationError(f"SQLite database directory {parent} does not exist")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot create SQLite database directory {parent}: {exc.strerror}"
            ) from None
    if not parent.is_dir():
        raise ConfigurationError(f"SQLite database directory {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"SQLite database directory {parent} is not writable (WAL needs to create "
            f"{path.name}-wal and {path.name}-shm beside the database)"
        )
    if path.is_dir():
        raise ConfigurationError(f"SQLite database {path} is a directory, not a file")
    if path.exists() and not path.is_file():
        raise ConfigurationError(
            f"SQLite database {path} is not a regular file (a device, a pipe or a socket)"
        )
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigurationError(f"SQLite database {path} is not writable")
    return path


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a sqlite3 exception to fleetcron's hierarchy."""
    if not isinstance(exc, sqlite3.Error):
        return None
    text = str(exc)
    if "no such table" in text:
        return store_error(SchemaError, exc, "schema missing: ")
    if "not a database" in text or "readonly database" in text:
        return store_error(StoreRefused, exc)
    if isinstance(exc, sqlite3.OperationalError) and (
        "unable to open" in text or "disk I/O" in text or "locked" in text or "busy" in text
    ):
        return store_error(StoreUnavailable, exc)
    return store_error(StoreError, exc)


_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_LOW_SPACE_BYTES = 1 << 20


def _out_of_space(exc: sqlite3.Error, path: Path) -> bool:
    """Whether ``exc`` comes from a full disk: SQLITE_FULL, or an I/O error while the
    file system holding the database has (almost) no space left — a WAL or shared-memory
    file that cannot grow is reported as ``disk I/O error``."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code == _SQLITE_FULL:
        return True
    if code != _SQLITE_IOERR:
        return False
    try:
        stats = os.statvfs(path.parent)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < _LOW_SPACE_BYTES


def _result(cur: sqlite3.Cursor) -> SqlResult:
    """What a statement returned: its rows and their column names (none for a statement
    without a result), and its count."""
    description = cur.description
    if description is None:
        return SqlResult(rows=[], rowcount=cur.rowcount)
    return SqlResult(rows=cur.fetchall(), rowcount=cur.rowcount, columns=column_names(description))


def _roll_back(conn: sqlite3.Connection) -> None:
    """End a failed transaction. A rollback that fails too (the disk is full, the
    connection broken) must not hide the first error; SQLite rolls the journal back on
    the next open."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _set_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Put the database in WAL mode. While another process is creating the same new
    database, the switch can answer "locked" at once, without waiting for busy_timeout:
    try again until the timeout has passed."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() > give_up:
                raise
            time.sleep(0.01)


def check_relative_directory(url: StoreURL) -> None:
    """Refuse a URL of a path relative to the working directory (``sqlite:///tmp/x.db``)
    whose directory is not there but is from the root (``/tmp``): most likely the
    absolute path was meant, written with three slashes where it takes four. Said before
    anything else, with both spellings, since any other error would name a directory
    the writer never meant."""
    assert url.path is not None
    written = url.path
    if written.is_absolute() or str(written).startswith("~"):
        return
    try:
        here = Path.cwd()
    except OSError:  # a deleted working directory: the open says so
        return
    rooted = Path("/") / written
    if (here / written).parent.is_dir() or not rooted.parent.is_dir():
        return
    raise ConfigurationError(
        f"backend URL {url.redacted!r} names {written} relative to the working directory "
        f"{here}, whose directory {written.parent} does not exist; for the absolute path "
        f"{rooted} write {sqlite_url(rooted)!r}"
    )


def _missing_store(path: Path) -> StoreMissing | None:
    """The error of a SQLite store that is not there — ``path`` or its directory does not
    exist, or the file is empty — else ``None``."""
    path = path.expanduser().absolute()
    advice = "start a replica or run `fleetcron migrate` to create it"
    if path.is_file() and path.stat().st_size == 0:
        # SQLite takes an empty file for an empty database, and its first commit, even of
        # a transaction that only read, writes the header: not for a reader to do.
        return StoreMissing(f"no fleetcron store at {path}: the file is empty ({advice})")
    if path.exists():
        return None
    if not path.parent.is_dir():
        return StoreMissing(
            f"no fleetcron store at {path}: its directory {path.parent} does not exist "
            f"(check the path; {advice} in an existing directory)"
        )
    return StoreMissing(f"no fleetcron store at {path}: the file does not exist ({advice})")


class SqliteStore(SqlSyncStore):
    """Sync SQLite store; all processes on one host share the database file.

    Every call raises :class:`~fleetcron.errors.StoreReplaced` once the path no longer
    names the file the store opened (:mod:`fleetcron.stores.sql.sqlite_file`).
    ``create=False`` opens only a database file that exists, as it is: a missing one is
    :class:`StoreMissing`, never created (nor by a reconnection after it was deleted), and
    its journal mode is not changed; pass ``auto_migrate=False`` too to leave its schema
    as found."""

    dialect = "sqlite"
    capabilities = Capability.PERSISTENT

    def __init__(
        self,
        url: StoreURL,
        *,
        auto_migrate: bool = True,
        create_parent: bool = False,
        create: bool = True,
    ) -> None:
        assert url.path is not None
        check_relative_directory(url)
        missing = None if create else _missing_store(url.path)
        if missing is not None:
            raise missing
        self._create = create
        self.path = check_sqlite_path(url.path, create_parent=create_parent)
        self.file = DatabaseFile(self.path)
        self._in_operation = False
        super().__init__(url, auto_migrate=auto_migrate)

    def _operations(self) -> SqliteOperations:
        return SqliteOperations()

    def _connect(self) -> Any:
        self.file.check()  # never a connection again once the path names another file
        # mode=rw opens the file only if it exists (sqlite3 would create it): a store
        # deleted or renamed after the check in __init__ is not made again, empty.
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=rw"
        conn = sqlite3.connect(
            self.path if self._create else uri,
            timeout=self._url.timeout_s,
            isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
            check_same_thread=False,  # guarded by the store's lock
            uri=not self._create,
        )
        try:
            # SQLite has just opened the file: the one the path names now (the stat comes
            # microseconds later).
            self.file.opened()
            conn.execute(f"PRAGMA busy_timeout = {max(1, round(self._url.timeout_s * 1000))}")
            # WAL is a setting of the file: set when a store may be made; a file opened as
            # it is is in WAL already if fleetcron made it, and left as found if not.
            if self._create:
                _set_wal(conn, self._url.timeout_s)
            # FULL: a fence handed out must survive a power cut, or it could be issued twice.
            conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _execute(self, conn: Any, sql: str, params: Mapping[str, object]) -> SqlResult:
        if self._in_operation:
            return _result(conn.execute(sql, params))
        self._check_file()
        # BEGIN IMMEDIATE takes the write lock up front, so busy_timeout applies; a
        # DEFERRED read-then-write would fail at once with SQLITE_BUSY instead of waiting.
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = _result(conn.execute(sql, params))
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        self._check_file()
        return result

    def run(self, operation: Operation[T]) -> T:
        """Carry out ``operation`` in one ``BEGIN IMMEDIATE`` transaction: its statements
        read and write rows atomically, whatever other processes do meanwhile."""
        with self._lock:
            self._check_file()
            conn = self._connection()
            self._in_operation = True
            try:
                self._sqlite(conn, "BEGIN IMMEDIATE")
                result = drive(operation, self._statement)
                self._sqlite(conn, "COMMIT")  # a full disk shows here, when the WAL grows
            except BaseException:
                if self._conn is conn:
                    _roll_back(conn)
                raise
            finally:
                self._in_operation = False
            # Replaced while the transaction ran: what it decided (a claim, a lease) holds
            # in a file the fleet no longer sees, so the caller must not act on it.
            self._check_file()
            return result

    def lease_group(self, namespace: str, name: str, holder: str, fence: int, group: int) -> bool:
        """Name the process group the work of a lease held here runs in — ``fleetcron
        exec``'s command, :data:`~fleetcron.local_holder.PENDING_GROUP` while it is being
        started — so that its holder counts as gone only once that group is too
        (:meth:`SqliteOperations.lease_group`). Only this store has it: elsewhere a lease
        is never taken over before it expires."""
        ops = self.ops
        assert isinstance(ops, SqliteOperations)
        return self.run(ops.lease_group(namespace, name, holder, fence, group))

    def _check_file(self) -> None:
        """Go no further once the path no longer names the file this store opened; its
        connection is closed (no checkpoint: SQLite sees the file has moved)."""
        try:
            self.file.check()
        except StoreReplaced:
            self._discard()
            raise

    def _sqlite(self, conn: sqlite3.Connection, sql: str) -> None:
        try:
            conn.execute(sql)
        except sqlite3.Error as exc:
            error = self._translate(exc)
            assert error is not None
            raise error from exc

    def _translate(self, exc: BaseException) -> FleetcronError | None:
        error = translate(exc)
        if isinstance(exc, sqlite3.Error) and _out_of_space(exc, self.path):
            return store_error(StoreUnavailable, exc, f"the disk holding {self.path} is full: ")
        return error

    def _migrate_locked(self) -> list[str]:
        self._check_file()
        conn = self._connection()
        applied: list[str] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(self.queries["schema_init"])
                for migration in self._pending():
                    for statement in migration.statements:
                        conn.execute(statement)
                    conn.execute(
                        self.queries["schema_record"],
                        {"version": migration.version, "name": migration.name},
                    )
                    applied.append(migration.name)
                conn.execute("COMMIT")
            except BaseException:
                _roll_back(conn)
                raise
        except sqlite3.Error as exc:
            error = self._translate(exc)  # a full disk is said as such here too
            assert error is not None
            raise error from exc
        return applied

    def schema_version(self) -> int:
        # _pending() runs inside the migration transaction: read without a nested BEGIN.
        conn = self._connection()
        if conn.in_transaction:
            try:
                row = conn.execute(self.queries["schema_version"]).fetchone()
            except sqlite3.OperationalError:
                return 0
            return int(row[0] or 0)
        return super().schema_version()


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> SqliteStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`). The default file's
    directory (``~/.local/state/fleetcron``) is made when a store may be created; any
    other path's directory must be there. No async entry point: a local file has no
    network wait, so the async face runs this store in a worker thread."""
    assert url.path is not None
    default = create and url.path == default_sqlite_path()
    return SqliteStore(url, auto_migrate=auto_migrate, create_parent=default, create=create)
