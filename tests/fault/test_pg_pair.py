"""The PostgreSQL pair of the failover scenarios does what it says: a synchronous commit
waits once replication is cut and is gone after the promotion; an asynchronous one is
acknowledged and lost; the promoted standby writes on a new timeline, inherits the wait for
``s2`` until it is cleared, and keeps the clock offset it was started with. Waits are on
conditions, except where a check proves that something does *not* happen in a short window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psycopg

from fault.clock import FaketimeUnavailable, faketime_env
from fault.pg_pair import PostgresPair
from fault.servers import PG_BIN, wait_until
from fault.test_injectors import _need, _unavailable


def _need_pair(*, faketime: bool = False) -> None:
    for binary in ("postgres", "pg_basebackup", "pg_ctl"):
        _need(str(PG_BIN / binary))
    if faketime:
        try:
            faketime_env(0)
        except FaketimeUnavailable as exc:
            _unavailable(str(exc))


def _execute(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql)
        return list(cur.fetchall()) if cur.description else []


def _on_standby(pair: PostgresPair, sql: str, expected: list[tuple[object, ...]]) -> None:
    """Wait until ``sql`` answers ``expected`` on the standby: a synchronous commit returns
    once the standby has the WAL on disk, which it replays a moment later."""

    def there() -> bool:
        try:
            return _execute(pair.standby_url, sql) == expected
        except psycopg.errors.UndefinedTable:  # not even the table replayed yet
            return False

    wait_until(there, 30, f"{sql} to answer {expected} on the standby")


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``work`` in a daemon thread; its result (or exception) lands in the list."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(work())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_sync_pair_waits_after_the_cut_and_fails_over(tmp_path: Path) -> None:
    _need_pair()
    with PostgresPair(tmp_path, synchronous=True) as pair:
        _execute(pair.primary_url, "CREATE TABLE t (n int)")
        _execute(pair.primary_url, "INSERT INTO t VALUES (1)")  # acknowledged: on the standby
        _on_standby(pair, "SELECT n FROM t", [(1,)])

        pair.cut()
        waiting, _ = _in_thread(lambda: _execute(pair.primary_url, "INSERT INTO t VALUES (2)"))
        waiting.join(0.5)
        assert waiting.is_alive(), "a synchronous commit returned with replication cut"
        assert pair.lsn_diff(pair.primary_lsn(), pair.received_lsn()) > 0

        pair.crash_primary()
        waiting.join(30)
        assert not waiting.is_alive()
        wait_until(pair.replayed, 30, "the standby to replay what it received")
        pair.promote()
        assert not pair.in_recovery()
        assert pair.timeline() == 2
        assert _execute(pair.libpq_url, "SELECT n FROM t") == [(1,)]  # the waiting commit is gone

        # The promoted standby still names s2, as the primary it copied did: writes wait
        # until the name is cleared, as Patroni clears it.
        blocked, result = _in_thread(lambda: _execute(pair.libpq_url, "INSERT INTO t VALUES (3)"))
        blocked.join(0.5)
        assert blocked.is_alive(), "a commit on the promoted standby did not wait for s2"
        pair.clear_synchronous()
        blocked.join(30)
        assert result == [[]]
        assert _execute(pair.libpq_url, "SELECT n FROM t ORDER BY n") == [(1,), (3,)]


def test_async_pair_loses_what_the_cut_acknowledged(tmp_path: Path) -> None:
    _need_pair(faketime=True)
    with PostgresPair(tmp_path, synchronous=False, standby_offset_s=-5) as pair:
        assert -5.5 < pair.clock_offset_s() < -4.5
        assert abs(pair.clock_offset_s(pair.primary_url)) < 0.5
        _execute(pair.primary_url, "CREATE TABLE t (n int)")
        _execute(pair.primary_url, "INSERT INTO t VALUES (1)")
        _on_standby(pair, "SELECT n FROM t", [(1,)])
        pair.cut()
        _execute(pair.primary_url, "INSERT INTO t VALUES (2)")  # acknowledged at once
        assert _execute(pair.primary_url, "SELECT count(*) FROM t") == [(2,)]
        pair.crash_primary()
        wait_until(pair.replayed, 30, "the standby to replay what it received")
        pair.promote()
        pair.clear_synchronous()
        assert pair.timeline() == 2
        assert _execute(pair.libpq_url, "SELECT n FROM t") == [(1,)]  # the acknowledged 2 is lost
        assert -5.5 < pair.clock_offset_s() < -4.5
