"""``fleetcron.fencing`` on the user's own database: sqlite3, psycopg 3 (PostgreSQL), PyMySQL
(MariaDB) and SQLAlchemy connections over each. A stale fence writes nothing; the check and
the work commit together; a processed marker makes a repeated run skip the work."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetcron import ConfigurationError, fencing
from fleetcron.fencing import StaleFence
from services import require_service

NOT_A_KEY: Any = None

KINDS = [
    "sqlite3",
    "psycopg",
    "pymysql",
    "sqlalchemy-sqlite",
    "sqlalchemy-postgres",
    "sqlalchemy-mysql",
]


class Db:
    """Connections of one kind to one database, and a transaction helper."""

    def __init__(self, kind: str, tmp: Path, *, database: str | None = None) -> None:
        self.kind = kind
        self.tmp = tmp
        self.database = database  # MySQL: another than the service's own
        self.opened: list[Any] = []
        self.table = f"work_{uuid.uuid4().hex[:8]}"
        self._engine: Any = None

    def connect(self) -> Any:
        if self.kind.startswith("sqlalchemy"):
            conn = self.engine().connect()
        elif self.kind == "sqlite3":
            conn = sqlite3.connect(self.tmp / "app.db", timeout=10, isolation_level=None)
        elif self.kind == "psycopg":
            import psycopg

            conn = psycopg.connect(_dsn("postgres"), autocommit=True)
        else:
            import pymysql

            conn = pymysql.connect(**_mysql_args(self.database), autocommit=True)
        self.opened.append(conn)
        return conn

    def engine(self) -> Any:
        if self._engine is None:
            import sqlalchemy

            if self.kind == "sqlalchemy-sqlite":
                url = f"sqlite:///{self.tmp / 'app.db'}"
            elif self.kind == "sqlalchemy-postgres":
                url = _dsn("postgres").replace("postgresql://", "postgresql+psycopg://", 1)
            else:
                args = _mysql_args(self.database)
                url = (
                    f"mysql+pymysql://{args['user']}@{args['host']}:{args['port']}/"
                    f"{args['database']}"
                )
            self._engine = sqlalchemy.create_engine(url)
        return self._engine

    @contextmanager
    def transaction(self, conn: Any) -> Iterator[None]:
        """BEGIN … COMMIT, or ROLLBACK on an exception."""
        if self.kind.startswith("sqlalchemy"):
            with conn.begin():
                yield
            return
        self.run(conn, "BEGIN IMMEDIATE" if self.kind == "sqlite3" else "BEGIN")
        try:
            yield
        except BaseException:
            self.run(conn, "ROLLBACK")
            raise
        self.run(conn, "COMMIT")

    def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        mark = "?" if "sqlite" in self.kind else "%s"
        sql = sql.replace("%s", mark)
        if self.kind.startswith("sqlalchemy"):
            result = conn.exec_driver_sql(sql, params)
            return list(result) if result.returns_rows else []
        cursor = conn.cursor()
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            cursor.close()

    def setup(self) -> None:
        conn = self.connect()
        if self.kind.startswith("sqlalchemy"):
            with conn.begin():
                fencing.create_tables(conn)
                self.run(conn, f"CREATE TABLE {self.table} (n integer)")
        else:
            fencing.create_tables(conn)
            self.run(conn, f"CREATE TABLE {self.table} (n integer)")

    def rows(self) -> list[int]:
        conn = self.connect()
        if self.kind.startswith("sqlalchemy"):
            with conn.begin():
                return sorted(r[0] for r in self.run(conn, f"SELECT n FROM {self.table}"))
        return sorted(r[0] for r in self.run(conn, f"SELECT n FROM {self.table}"))

    def close(self) -> None:
        for conn in self.opened:
            conn.close()
        if self._engine is not None:
            self._engine.dispose()


def _dsn(kind: str) -> str:
    return require_service(kind)


def _mysql_args(database: str | None = None) -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(require_service("mysql"))
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "database": database or (parts.path or "/test").lstrip("/") or "test",
    }


def _opened(kind: str, tmp_path: Path) -> Iterator[Db]:
    with _own_db(kind, tmp_path) as opened:
        opened.setup()
        yield opened


@contextmanager
def _own_db(kind: str, tmp_path: Path, charset: str | None = None) -> Iterator[Db]:
    """A :class:`Db` of ``kind``. MySQL's is a database of its own, so the fence tables
    are the ones this code makes (not those a run of another version left in the shared
    one), in the server's default character set and collation unless ``charset``."""
    if "mysql" not in kind:
        opened = Db(kind, tmp_path)
        try:
            yield opened
        finally:
            opened.close()
        return
    with _throwaway_mysql_database(charset) as name:
        opened = Db(kind, tmp_path, database=name)
        try:
            yield opened
        finally:
            opened.close()


@contextmanager
def _throwaway_mysql_database(charset: str | None) -> Iterator[str]:
    """A new database, dropped after."""
    import pymysql

    name = f"fleetcron_fencing_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(**{**_mysql_args(), "database": None}, autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute(
                f"CREATE DATABASE {name}" + (f" CHARACTER SET {charset}" if charset else "")
            )
        yield name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture(params=KINDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    yield from _opened(request.param, tmp_path)


# SQLite serialises whole transactions (BEGIN IMMEDIATE): it has no row lock to race on.
@pytest.fixture(params=[kind for kind in KINDS if "sqlite" not in kind])
def server_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    yield from _opened(request.param, tmp_path)


def _work(db: Db, conn: Any, resource: str, fence: int, n: int) -> None:
    with db.transaction(conn):
        fencing.check(conn, resource, fence)
        db.run(conn, f"INSERT INTO {db.table} (n) VALUES (%s)", (n,))


def test_a_higher_or_equal_fence_passes_and_a_lower_one_writes_nothing(db: Db) -> None:
    resource = f"invoices-{uuid.uuid4().hex[:6]}"
    conn = db.connect()
    _work(db, conn, resource, 10, 1)
    _work(db, conn, resource, 10, 2)  # the same holder again
    _work(db, conn, resource, 12, 3)

    with pytest.raises(StaleFence) as caught:
        _work(db, conn, resource, 11, 4)

    assert (caught.value.fence, caught.value.highest) == (11, 12)
    assert "another holder" in str(caught.value)
    assert db.rows() == [1, 2, 3], "the stale holder's work was rolled back with the check"
    _work(db, conn, f"{resource}-other", 1, 5)  # resources are independent
    assert db.rows() == [1, 2, 3, 5]


def test_two_holders_are_serialised_by_the_check(server_db: Db) -> None:
    db = server_db
    resource = f"r-{uuid.uuid4().hex[:6]}"
    newer, older = db.connect(), db.connect()
    outcome: list[str] = []
    entered = threading.Event()

    def stale() -> None:
        entered.wait(10)
        try:
            _work(db, older, resource, 5, 50)  # blocks on the row until the newer commits
        except StaleFence:
            outcome.append("refused")
        else:
            outcome.append("accepted")

    thread = threading.Thread(target=stale)
    thread.start()
    with db.transaction(newer):
        fencing.check(newer, resource, 7)
        entered.set()
        _wait_for_a_lock_wait(db)  # the older holder is now waiting on the row
        db.run(newer, f"INSERT INTO {db.table} (n) VALUES (%s)", (70,))
    thread.join(20)

    assert outcome == ["refused"]
    assert db.rows() == [70]


def _wait_for_a_lock_wait(db: Db) -> None:
    """Until the server shows a transaction waiting for a row lock."""
    watcher = db.connect()
    if "postgres" in db.kind or db.kind == "psycopg":
        sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    else:
        sql = "SELECT count(*) FROM information_schema.innodb_lock_waits"
    give_up = time.monotonic() + 20
    while True:
        if db.kind.startswith("sqlalchemy"):
            with watcher.begin():
                waiting = db.run(watcher, sql)[0][0]
        else:
            waiting = db.run(watcher, sql)[0][0]
        if waiting:
            return
        assert time.monotonic() < give_up, "the older holder never waited on the row"
        time.sleep(0.01)


def test_once_marks_work_done_in_the_same_transaction(db: Db) -> None:
    conn = db.connect()
    key = f"invoice:cust-4211:{uuid.uuid4().hex[:6]}"

    def run_job(fail: bool = False) -> bool:
        with db.transaction(conn):
            if not fencing.once(conn, key, fence=3):
                return False
            db.run(conn, f"INSERT INTO {db.table} (n) VALUES (%s)", (1,))
            if fail:
                raise RuntimeError("crash before the commit")
        return True

    with pytest.raises(RuntimeError):
        run_job(fail=True)
    assert db.rows() == [], "rolled back, marker included"
    assert run_job() is True
    assert run_job() is False, "a repeated run skips the work"
    assert db.rows() == [1]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda c: fencing.check(c, "", 1), "non-empty string"),
        (lambda c: fencing.check(c, "r", -1), "non-negative integer"),
        (lambda c: fencing.check(c, "r", True), "non-negative integer"),
        (lambda c: fencing.check(c, "r" * 256, 1), "at most 255"),
        (lambda c: fencing.once(c, NOT_A_KEY), "non-empty string"),
        (lambda c: fencing.once(c, "k", fence="x"), "non-negative integer"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_are_refused(call: Callable[[Any], None], says: str, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(ConfigurationError, match=says):
        call(conn)


def test_an_unknown_connection_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="sqlite3, psycopg 3, PyMySQL and SQLAlchemy"):
        fencing.check(object(), "r", 1)


# Keys that a case- or accent-insensitive, PAD SPACE collation takes for one.
LOOKALIKE_KEYS = [
    ("invoice:cus_AbC:2026-10", "invoice:cus_abc:2026-10"),
    ("café", "cafe"),
    ("report ", "report"),
]


def _once(db: Db, conn: Any, key: str) -> bool:
    with db.transaction(conn):
        return fencing.once(conn, key)


def _check(db: Db, conn: Any, resource: str, fence: int) -> None:
    with db.transaction(conn):
        fencing.check(conn, resource, fence)


def test_markers_that_differ_in_case_accents_or_trailing_spaces_are_distinct(db: Db) -> None:
    conn = db.connect()
    prefix = uuid.uuid4().hex[:6]
    for first, second in LOOKALIKE_KEYS:
        assert _once(db, conn, f"{prefix}:{first}") is True
        assert _once(db, conn, f"{prefix}:{second}") is True, f"{second!r} is not {first!r}"
        assert _once(db, conn, f"{prefix}:{first}") is False
        assert _once(db, conn, f"{prefix}:{second}") is False


def test_resources_that_differ_in_case_accents_or_trailing_spaces_are_distinct(db: Db) -> None:
    conn = db.connect()
    prefix = uuid.uuid4().hex[:6]
    for first, second in LOOKALIKE_KEYS:
        _check(db, conn, f"{prefix}:{first}", 10)
        _check(db, conn, f"{prefix}:{second}", 5)  # a resource never written before
        with pytest.raises(StaleFence) as caught:
            _check(db, conn, f"{prefix}:{second}", 4)
        assert caught.value.highest == 5
        with pytest.raises(StaleFence) as caught:
            _check(db, conn, f"{prefix}:{first}", 9)
        assert caught.value.highest == 10


def test_a_key_of_255_characters_of_four_utf8_bytes_each_fits(db: Db) -> None:
    conn = db.connect()
    key = uuid.uuid4().hex[:6] + "😀" * 249
    assert _once(db, conn, key) is True
    assert _once(db, conn, key) is False
    _check(db, conn, key, 3)
    with pytest.raises(StaleFence):
        _check(db, conn, key, 2)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("invoice:\x00cust", "cannot hold a NUL character: .* at position 8"),
        ("invoice:\ud800", "text that UTF-8 can encode"),
    ],
    ids=["nul", "lone-surrogate"],
)
def test_a_key_that_is_not_storable_text_is_refused_on_every_database(
    db: Db, key: str, says: str
) -> None:
    conn = db.connect()
    with pytest.raises(ConfigurationError, match=says):
        _once(db, conn, key)
    with pytest.raises(ConfigurationError, match=says):
        _check(db, conn, key, 1)
    assert _once(db, conn, f"after-{uuid.uuid4().hex[:6]}") is True, "the connection still works"


def test_a_fence_no_database_can_hold_is_refused_and_nothing_is_written(db: Db) -> None:
    conn = db.connect()
    resource = f"r-{uuid.uuid4().hex[:6]}"
    for fence in (fencing.MAX_FENCE + 1, 2**70):
        says = f"^a fence is 0 to {fencing.MAX_FENCE}, not {fence}$"
        with pytest.raises(ConfigurationError, match=says):
            _work(db, conn, resource, fence, 1)
        with pytest.raises(ConfigurationError, match=says), db.transaction(conn):
            fencing.once(conn, f"k-{uuid.uuid4().hex[:6]}", fence=fence)
    assert db.rows() == []

    _work(db, conn, resource, fencing.MAX_FENCE, 2)  # the highest a table holds
    with pytest.raises(StaleFence) as caught:
        _work(db, conn, resource, fencing.MAX_FENCE - 1, 3)
    assert caught.value.highest == fencing.MAX_FENCE
    with db.transaction(conn):
        assert fencing.once(conn, f"k-{uuid.uuid4().hex[:6]}", fence=fencing.MAX_FENCE)
    assert db.rows() == [2]


# MySQL and MariaDB: the keys' column type, and fence tables made by an earlier fleetcron.

MYSQL_KINDS = ["pymysql", "sqlalchemy-mysql"]

# What table_sql("mysql") gave before keys were compared as bytes: varchar in the
# database's default collation.
LEGACY_MYSQL_TABLES = [
    "CREATE TABLE fleetcron_fence (resource varchar(255) NOT NULL PRIMARY KEY, "
    "fence bigint NOT NULL)",
    "CREATE TABLE fleetcron_once (marker varchar(255) NOT NULL PRIMARY KEY, fence bigint)",
]


@pytest.fixture(params=MYSQL_KINDS)
def latin1_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """MariaDB's upstream default: a database whose tables are latin1 unless told."""
    with _own_db(request.param, tmp_path, "latin1") as opened:
        yield opened


def _key_columns(db: Db, conn: Any) -> dict[str, str]:
    with db.transaction(conn):
        rows = db.run(
            conn,
            "SELECT TABLE_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME IN ('resource', 'marker')",
        )
    return dict(rows)


def test_mysql_keys_are_utf8_bytes_in_a_latin1_database(latin1_db: Db) -> None:
    db = latin1_db
    db.setup()
    conn = db.connect()
    key = "invoice:Łódź ✓ 請求書"  # outside Latin-1: error 1366 in a latin1 column
    assert _once(db, conn, key) is True
    assert _once(db, conn, key) is False
    _check(db, conn, key, 7)
    with pytest.raises(StaleFence):
        _check(db, conn, key, 6)
    with db.transaction(conn):
        stored = db.run(conn, "SELECT marker FROM fleetcron_once")
    assert stored == [(key.encode(),)]
    assert _key_columns(db, conn) == {
        "fleetcron_fence": "varbinary(1020)",
        "fleetcron_once": "varbinary(1020)",
    }


@pytest.mark.parametrize("upgrade", ["create_tables", "upgrade_sql"])
@pytest.mark.parametrize("charset", ["latin1", "utf8mb4"])
@pytest.mark.parametrize("kind", MYSQL_KINDS)
def test_mysql_tables_of_an_earlier_version_are_refused_until_upgraded_keeping_their_keys(
    kind: str, charset: str, upgrade: str, tmp_path: Path
) -> None:
    with _own_db(kind, tmp_path, charset) as db:
        writer = db.connect()
        with db.transaction(writer):
            for statement in LEGACY_MYSQL_TABLES:
                db.run(writer, statement)
        with db.transaction(writer):  # as the earlier fleetcron wrote them: text, not bytes
            db.run(writer, "INSERT INTO fleetcron_once (marker, fence) VALUES (%s, 1)", ("café",))
            db.run(
                writer, "INSERT INTO fleetcron_fence (resource, fence) VALUES (%s, 10)", ("Rés",)
            )

        with pytest.raises(ConfigurationError) as refused:
            _once(db, writer, "cafe")
        assert f"fleetcron_once.marker is varchar(255) in {charset}_" in str(refused.value)
        assert "fleetcron.fencing.create_tables(conn) upgrades the tables" in str(refused.value)
        with pytest.raises(ConfigurationError, match=r"fleetcron_fence\.resource is varchar"):
            _check(db, writer, "rés", 1)

        upgrader = db.connect()
        with db.transaction(upgrader):
            if upgrade == "create_tables":
                fencing.create_tables(upgrader)
            else:
                for statement in fencing.upgrade_sql("mysql"):
                    db.run(upgrader, statement)

        assert set(_key_columns(db, writer).values()) == {"varbinary(1020)"}
        assert _once(db, writer, "café") is False, "a key written before the upgrade is found"
        assert _once(db, writer, "cafe") is True
        with pytest.raises(StaleFence) as caught:
            _check(db, writer, "Rés", 9)
        assert caught.value.highest == 10
        _check(db, writer, "rés", 1)
        with db.transaction(writer):
            stored = db.run(writer, "SELECT marker FROM fleetcron_once ORDER BY marker")
        assert stored == [(b"cafe",), ("café".encode(),)]
        with db.transaction(upgrader):
            fencing.create_tables(upgrader)  # again: nothing left to upgrade
        assert _once(db, upgrader, "café") is False


def test_mysql_upgrades_wait_for_each_other_and_are_not_done_twice(tmp_path: Path) -> None:
    # The second upgrader looked before the first began; once it has the lock it looks
    # again and leaves the upgraded tables alone (back through varchar, "a" and "a " would
    # be one key, and keys written since the upgrade would collide).
    with _own_db("pymysql", tmp_path, "latin1") as db:
        first, second = db.connect(), db.connect()
        for statement in LEGACY_MYSQL_TABLES:
            db.run(first, statement)
        db.run(first, "SELECT GET_LOCK('fleetcron.fencing.upgrade', 30)")
        failed: list[BaseException] = []

        def upgrade() -> None:
            try:
                fencing.create_tables(second)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=upgrade)
        thread.start()
        _wait_for_a_user_lock_wait(db, second.thread_id())
        for statement in fencing.upgrade_sql("mysql"):
            db.run(first, statement)
        assert _once(db, first, "a") is True
        assert _once(db, first, "a ") is True
        db.run(first, "DO RELEASE_LOCK('fleetcron.fencing.upgrade')")
        thread.join(30)

        assert not thread.is_alive()
        assert failed == []
        assert _once(db, second, "a") is False
        assert _once(db, second, "a ") is False


def _wait_for_a_user_lock_wait(db: Db, connection_id: int) -> None:
    """Until the server shows connection ``connection_id`` waiting in ``GET_LOCK``."""
    watcher = db.connect()
    give_up = time.monotonic() + 20
    while not db.run(
        watcher,
        "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s AND STATE = 'User lock'",
        (connection_id,),
    ):
        assert time.monotonic() < give_up, "the second upgrader never waited for the lock"
