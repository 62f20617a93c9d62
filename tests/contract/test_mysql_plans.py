"""MySQL / MariaDB: the recovery poll reads the open rows, not the ledger's history.

Every replica asks for the rows due for recovery every 2 s (``run_due``: queued, running
with an expired lease, failed with a retry come, oldest slot first, up to a limit). For
``ORDER BY slot_us, job LIMIT`` the optimizer could walk the namespace's rows in slot
order and, the due rows being the newest and fewer than the limit, read every finished run
of the namespace at each poll (200,000 rows a poll at 400,000 in the ledger). The test
counts the rows the server's handlers read for a poll (``Handler_read%``), grows the
finished history tenfold (1 % of it failed) and counts again, with and without fresh
statistics. The index by state holds the failed rows with no retry left too, and a poll
reads them: its cost grows with a fleet's failures, not with its history. The read of the
runs in progress (a paged status read, at every page) takes the same index for its one
state and reads neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.test_schema import fresh_database
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.mysql import MysqlStore
from services import require_service

JOBS = 200
LIMIT = 5  # fewer rows due than the limit: a walk in slot order never stops early
SLOT_US = 1_800_000_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MysqlStore]:
    url = require_service("mysql")
    with fresh_database(url, tmp_path) as fresh:
        opened = open_store(parse_store_url(fresh))
        assert isinstance(opened, MysqlStore)
        try:
            yield opened
        finally:
            opened.close()


def _add_finished(conn: Any, first_slot: int, slots: int) -> None:
    """Finished runs of every job of two namespaces, made on the server (fast)."""
    with conn.cursor() as cur:
        cur.execute(
            """INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence,
                                          holder, run_id, `trigger`, started_us, finished_us)
               WITH RECURSIVE
                 j(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM j WHERE i + 1 < %(jobs)s),
                 s(i) AS (SELECT %(first)s UNION ALL SELECT i + 1 FROM s
                           WHERE i + 1 < %(first)s + %(slots)s),
                 ns(n) AS (SELECT 'ns-1' UNION ALL SELECT 'ns-2')
               SELECT ns.n, CONCAT('job-', LPAD(j.i, 5, '0')), %(base)s + s.i * 1000000,
                      IF((j.i + s.i) %% 97 = 0, 'failed', 'succeeded'), 1, 1, 'h', 'r',
                      'schedule', 1, 2
                 FROM ns, j, s""",
            {"jobs": JOBS, "first": first_slot, "slots": slots, "base": SLOT_US},
        )
    conn.commit()


def _failed_rows(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM fleetcron_run WHERE namespace = 'ns-1' AND state = 'failed'"
        )
        return int(cur.fetchone()[0])


def _rows_read(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
        return sum(int(value) for _, value in cur.fetchall())


def _poll_reads(store: MysqlStore, jobs: list[str] | None) -> tuple[int, int]:
    """(rows read by one recovery poll, rows it returned), on the store's own connection."""
    conn = store._connection()
    idle = _rows_read(conn)
    overhead = _rows_read(conn) - idle  # what reading the counters reads
    before = _rows_read(conn)
    due = store.run(store.ops.run_due("ns-1", LIMIT, jobs))
    return _rows_read(conn) - before - overhead, len(due)


@pytest.mark.parametrize("statistics", [False, True], ids=["as-left", "analyzed"])
@pytest.mark.parametrize("named", [False, True], ids=["namespace", "named-jobs"])
def test_the_recovery_poll_does_not_read_the_finished_history(
    store: MysqlStore, statistics: bool, named: bool
) -> None:
    conn = store._connection()
    jobs = [f"job-{j:05d}" for j in range(JOBS)] if named else None

    def analyze() -> None:
        if statistics:
            with conn.cursor() as cur:
                cur.execute("ANALYZE TABLE fleetcron_run")
                cur.fetchall()

    _add_finished(conn, 0, 10)
    with conn.cursor() as cur:  # three rows due (queued), newer than all the history
        cur.executemany(
            """INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence,
                                          holder, run_id, `trigger`)
               VALUES ('ns-1', %s, %s, 'queued', 0, 0, '', 'q', 'trigger')""",
            [(f"job-{j:05d}", SLOT_US + 1000 * 1_000_000) for j in range(3)],
        )
    conn.commit()
    analyze()
    small, found_small = _poll_reads(store, jobs)
    failed_small = _failed_rows(conn)
    _add_finished(conn, 10, 90)
    analyze()
    big, found_big = _poll_reads(store, jobs)
    failed = _failed_rows(conn) - failed_small

    assert found_small == found_big == 3
    # Ten times the history: a poll that reads it reads about ten times the rows; one
    # that reads the open and the failed rows reads the failed rows added, no more.
    assert failed > 100
    assert big - small <= 1.2 * failed + 50, (small, big, failed)


NEWEST = 20  # a running row counts among its job's newest NEWEST rows


def _running_reads(store: MysqlStore) -> tuple[int, int]:
    """(rows read by one read of the runs in progress, rows it returned)."""
    conn = store._connection()
    idle = _rows_read(conn)
    overhead = _rows_read(conn) - idle
    before = _rows_read(conn)
    jobs = [f"job-{j:05d}" for j in range(JOBS)]
    running = store.run(store.ops.run_running("ns-1", jobs, NEWEST))
    return _rows_read(conn) - before - overhead, len(running)


@pytest.mark.parametrize("statistics", [False, True], ids=["as-left", "analyzed"])
def test_the_running_rows_are_read_without_the_finished_or_failed_ones(
    store: MysqlStore, statistics: bool
) -> None:
    # A paged status read asks for the runs in progress at every page.
    conn = store._connection()
    _add_finished(conn, 0, 10)
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence,
                                          holder, run_id, `trigger`, started_us, expires_us)
               VALUES ('ns-1', %s, %s, 'running', 1, 1, 'h', 'r', 'schedule', 1, %s)""",
            [(f"job-{j:05d}", SLOT_US + 1000 * 1_000_000, 2 * SLOT_US) for j in range(3)],
        )
    conn.commit()
    if statistics:
        with conn.cursor() as cur:
            cur.execute("ANALYZE TABLE fleetcron_run")
            cur.fetchall()
    small, found_small = _running_reads(store)
    _add_finished(conn, 10, 90)
    if statistics:
        with conn.cursor() as cur:
            cur.execute("ANALYZE TABLE fleetcron_run")
            cur.fetchall()
    big, found_big = _running_reads(store)

    assert found_small == found_big == 3
    # Each running row, and its job's newer rows up to NEWEST of them: not the history,
    # nor the failed rows the index by state holds as well.
    assert _failed_rows(conn) > 100
    assert big <= 3 * (NEWEST + 2) + 20, (small, big)
