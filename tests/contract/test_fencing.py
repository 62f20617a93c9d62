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

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
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

            conn = pymysql.connect(**_mysql_args(), autocommit=True)
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
                args = _mysql_args()
                url = f"mysql+pymysql://{args['user']}@{args['host']}:{args['port']}/test"
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


def _mysql_args() -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(require_service("mysql"))
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "database": (parts.path or "/test").lstrip("/") or "test",
    }


def _opened(kind: str, tmp_path: Path) -> Iterator[Db]:
    opened = Db(kind, tmp_path)
    try:
        opened.setup()
        yield opened
    finally:
        opened.close()


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


def _once(db: Db, conn: Any, key: str) -> bool:
    with db.transaction(conn):
        return fencing.once(conn, key)


def _check(db: Db, conn: Any, resource: str, fence: int) -> None:
    with db.transaction(conn):
        fencing.check(conn, resource, fence)


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
