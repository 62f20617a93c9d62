"""SQLite: a read or a change of named rows costs the same however big the ledger or the
queue has grown.

SQLite plans each statement without statistics unless someone runs ``ANALYZE``, and some
of its choices read a whole prefix of an index: the settled read (a JSON array of slots
joined to the ledger) was planned as a scan of the namespace's ledger with the array read
again for every row, 110-200 ms a call at a few thousand rows, inside the write lock that
every replica on the host waits for. These tests count the virtual machine's steps of
each statement (``set_progress_handler``) on a ledger and a queue, grow them tenfold with
rows the statement must not look at, and count again — with and without statistics.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.files import load_queries

JOBS = 200
SLOT_US = 1_800_000_000_000_000
QUEUE_HELD = 20  # claimed items a batch names
STEP = 50  # VM instructions per progress call
QUERIES = load_queries("sqlite")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "plans.db"
    open_store(parse_store_url(f"sqlite:///{path}")).close()  # migrates
    return path


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    yield
    conn.execute("COMMIT")


def _add_runs(conn: sqlite3.Connection, first_slot: int, slots: int) -> None:
    """Finished runs of every job of two namespaces, slots ``first_slot`` onwards."""
    rows = [
        (namespace, f"job-{j:05d}", SLOT_US + s * 1_000_000)
        for namespace in ("ns-1", "ns-2")
        for j in range(JOBS)
        for s in range(first_slot, first_slot + slots)
    ]
    with _transaction(conn):
        conn.executemany(
            """INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence,
                                          holder, run_id, trigger, started_us, finished_us)
               VALUES (?, ?, ?, 'succeeded', 1, 1, 'h', 'r', 'schedule', 1, 2)""",
            rows,
        )


def _add_done_items(conn: sqlite3.Connection, count: int) -> None:
    with _transaction(conn):
        conn.executemany(
            """INSERT INTO fleetcron_queue_item (namespace, queue, payload, state, attempts,
                                                 max_attempts, fence, available_us,
                                                 created_us, finished_us)
               VALUES ('ns-1', 'q', '{}', 'done', 1, 3, 1, 0, 0, 1)""",
            [() for _ in range(count)],
        )


def _steps(conn: sqlite3.Connection, sql: str, params: dict[str, object]) -> int:
    """How many ``STEP``-instruction slices ``sql`` took, run in a transaction that is
    rolled back (the rows stay as they were for the next count)."""
    calls = 0

    def count() -> int:
        nonlocal calls
        calls += 1
        return 0

    conn.execute("BEGIN IMMEDIATE")
    conn.set_progress_handler(count, STEP)
    try:
        conn.execute(sql, params).fetchall()
    finally:
        conn.set_progress_handler(None, STEP)
        conn.execute("ROLLBACK")
    return calls


def _grows(before: int, after: int) -> bool:
    # Ten times the rows: a statement that reads them takes about ten times the steps; a
    # lookup's count moves by a few slices (a deeper B-tree).
    return after > 1.5 * before + 20


@pytest.mark.parametrize("statistics", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.parametrize("name", ["run_settled", "run_due"])
def test_a_read_of_named_slots_or_open_rows_does_not_read_the_ledger(
    database: Path, name: str, statistics: bool
) -> None:
    pairs = [[f"job-{j:05d}", SLOT_US + 3 * 1_000_000] for j in range(0, JOBS, 3)]
    pairs.append(["job-99999", SLOT_US + 3 * 1_000_000])  # no row
    asked: dict[str, dict[str, object]] = {
        "run_settled": {"namespace": "ns-1", "pairs": json.dumps(pairs)},
        "run_due": {"namespace": "ns-1", "jobs": None, "limit": 100},
    }
    params = asked[name]
    with contextlib.closing(_connect(database)) as conn:
        _add_runs(conn, 0, 10)
        if statistics:
            conn.execute("ANALYZE")
        small = _steps(conn, QUERIES[name], params)
        _add_runs(conn, 10, 90)
        if statistics:
            conn.execute("ANALYZE")
        big = _steps(conn, QUERIES[name], params)
        answered = conn.execute(QUERIES[name], params).fetchall()

    assert len(answered) == {"run_settled": len(pairs) - 1, "run_due": 0}[name]
    assert not _grows(small, big), (name, small, big)


def _claimed(conn: sqlite3.Connection) -> list[int]:
    with _transaction(conn):
        conn.executemany(
            """INSERT INTO fleetcron_queue_item (namespace, queue, payload, state, attempts,
                                                 max_attempts, fence, holder, available_us,
                                                 created_us)
               VALUES ('ns-1', 'q', '{}', 'claimed', 1, 3, 7, 'h', ?, 0)""",
            [(SLOT_US * 2,) for _ in range(QUEUE_HELD)],
        )
    rows = conn.execute("SELECT id FROM fleetcron_queue_item WHERE state = 'claimed'")
    return [int(row[0]) for row in rows.fetchall()]


@pytest.mark.parametrize("statistics", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.parametrize("name", ["queue_extend", "queue_ack", "queue_nack", "queue_requeue"])
def test_a_change_of_named_items_does_not_read_the_queue(
    database: Path, name: str, statistics: bool
) -> None:
    with contextlib.closing(_connect(database)) as conn:
        _add_done_items(conn, 500)
        ids = _claimed(conn)
        claims = json.dumps([[item, 7] for item in ids])
        params: dict[str, object] = {
            "namespace": "ns-1",
            "queue": "q",
            "claims": claims,
            "nacks": json.dumps([[item, 7, "boom", 1_000_000] for item in ids]),
            "ids": json.dumps(ids),
            "visibility_us": 30_000_000,
        }
        wanted = set(re.findall(r":(\w+)", QUERIES[name]))
        asked = {key: value for key, value in params.items() if key in wanted}
        assert set(asked) == wanted, wanted - set(asked)
        if statistics:
            conn.execute("ANALYZE")
        small = _steps(conn, QUERIES[name], asked)
        _add_done_items(conn, 4500)
        if statistics:
            conn.execute("ANALYZE")
        big = _steps(conn, QUERIES[name], asked)

    assert not _grows(small, big), (name, small, big)


def _add_open_runs(conn: sqlite3.Connection, state: str, jobs: range, slot: int) -> None:
    """A ``state`` row of each job of ``jobs`` in namespace ns-1 at slot ``slot``."""
    with _transaction(conn):
        conn.executemany(
            """INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence,
                                          holder, run_id, trigger, started_us, expires_us)
               VALUES ('ns-1', ?, ?, ?, 1, 1, 'h', 'r', 'schedule', 1, ?)""",
            [(f"job-{j:05d}", SLOT_US + slot * 1_000_000, state, 2 * SLOT_US) for j in jobs],
        )


@pytest.mark.parametrize("statistics", [False, True], ids=["no-stats", "analyzed"])
def test_the_running_rows_are_read_without_the_finished_or_failed_ones(
    database: Path, statistics: bool
) -> None:
    # A paged status read asks for the runs in progress at every page: the failed rows,
    # kept for the retention and held by the index of open rows too, must not be read.
    params = {"namespace": "ns-1", "skip": 49}
    with contextlib.closing(_connect(database)) as conn:
        _add_runs(conn, 0, 10)
        _add_open_runs(conn, "running", range(0, JOBS, 20), 1000)
        if statistics:
            conn.execute("ANALYZE")
        small = _steps(conn, QUERIES["run_running"], params)
        _add_runs(conn, 10, 90)
        for slot in range(1001, 1010):
            _add_open_runs(conn, "failed", range(JOBS), slot)
        if statistics:
            conn.execute("ANALYZE")
        big = _steps(conn, QUERIES["run_running"], params)
        answered = conn.execute(QUERIES["run_running"], params).fetchall()

    assert len(answered) == JOBS // 20
    assert not _grows(small, big), (small, big)
