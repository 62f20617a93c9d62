"""A PostgreSQL primary whose synchronous standby never answers.

With ``synchronous_standby_names`` naming a standby that is not connected, every commit
waits for it: fleetcron must bound that wait by the URL's ``timeout`` (statement_timeout
does not: it is off by the time a commit waits), and a commit whose wait was cancelled
(PostgreSQL then reports success with only a notice) must be taken as not written, since
a failover would lose it. ``fleetcron doctor`` says that writes wait.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from e2e.helpers import FLEETCRON
from fault.servers import PG_BIN, PostgresCluster
from fault.test_injectors import _in_thread, _need, wait_for
from fleetcron.errors import StoreUnavailable
from fleetcron.stores import open_async_store, open_store, parse_store_url

T = TypeVar("T")
NS = "syncrep"


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresCluster]:
    """A primary whose commits wait for a synchronous standby that never comes."""
    _need(str(PG_BIN / "postgres"))
    cluster = PostgresCluster(tmp_path_factory.mktemp("syncrep"), settings={"lc_messages": "C"})
    store = open_store(parse_store_url(cluster.url))  # the schema, before commits wait
    store.close()
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (nobody)'")
        conn.execute("SELECT pg_reload_conf()")

    def reloaded() -> bool:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
        return row is not None and row[0] != ""

    wait_for(reloaded, 30, "synchronous_standby_names to be set")
    yield cluster
    cluster.close()


@pytest.fixture
def primary(waiting: PostgresCluster) -> Iterator[PostgresCluster]:
    """The waiting primary, with no session of a test before still waiting on it (a commit
    whose client went away waits on until it is ended)."""
    yield waiting
    with psycopg.connect(waiting.url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
    wait_for(lambda: _waiting_backend(waiting.url) is None, 30, "no session left waiting")


def _waiting_backend(url: str) -> int | None:
    """The pid of a fleetcron session waiting for the synchronous standby, if any."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
            "AND application_name = 'fleetcron'"
        ).fetchone()
    return None if row is None else int(row[0])


def _holder_row(url: str, name: str) -> str | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT holder FROM fleetcron_lease WHERE namespace = %s AND name = %s", (NS, name)
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_commit_waiting_for_the_standby_ends_at_the_urls_timeout(
    primary: PostgresCluster,
) -> None:
    store = open_store(parse_store_url(f"{primary.url}?timeout=2"))
    try:
        thread, result = _in_thread(
            lambda: store.run(store.ops.lease_acquire(NS, "bounded", "h:1:a", 60_000_000, 0))
        )
        wait_for(lambda: _waiting_backend(primary.url), 30, "the commit waiting for a standby")
        thread.join(60)  # the 2 s timeout, with room for a loaded machine
        assert not thread.is_alive(), "the commit's wait was not bounded by timeout=2"
        assert len(result) == 1, result
        assert isinstance(result[0], StoreUnavailable), result
        assert "did not answer within 2 s" in str(result[0])
    finally:
        store.close()


def test_a_cancelled_wait_for_the_standby_is_a_failed_write_not_a_success(
    primary: PostgresCluster,
) -> None:
    store = open_store(parse_store_url(f"{primary.url}?timeout=120"))
    try:
        thread, result = _in_thread(
            lambda: store.run(store.ops.lease_acquire(NS, "cancelled", "h:1:b", 60_000_000, 0))
        )
        pid = wait_for(lambda: _waiting_backend(primary.url), 30, "the commit waiting")
        with psycopg.connect(primary.url, autocommit=True) as conn:
            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(60)
        assert not thread.is_alive()
        # PostgreSQL committed it on the primary and said success with a notice: fleetcron
        # says the write did not happen, since a failover would lose it.
        assert _holder_row(primary.url, "cancelled") == "h:1:b"
        assert len(result) == 1, result
        assert isinstance(result[0], StoreUnavailable), result
        assert "without its synchronous standby" in str(result[0])
    finally:
        store.close()


def test_the_async_store_takes_a_cancelled_wait_as_a_failed_write(
    primary: PostgresCluster,
) -> None:
    async def scenario() -> BaseException | None:
        store = await open_async_store(parse_store_url(f"{primary.url}?timeout=120"))
        try:
            acquire = asyncio.ensure_future(
                store.run(store.ops.lease_acquire(NS, "async", "h:1:c", 60_000_000, 0))
            )
            give_up = time.monotonic() + 30
            while (pid := await asyncio.to_thread(_waiting_backend, primary.url)) is None:
                assert time.monotonic() < give_up, "no commit waiting for the standby"
                await asyncio.sleep(0.02)
            await asyncio.to_thread(_cancel, primary.url, pid)
            try:
                await asyncio.wait_for(acquire, 60)
            except StoreUnavailable as exc:
                return exc
            return None
        finally:
            await store.close()

    error = asyncio.run(scenario())
    assert isinstance(error, StoreUnavailable), error
    assert "without its synchronous standby" in str(error)


def _cancel(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))


def test_doctor_says_every_write_waits_for_a_standby_that_is_not_there(
    primary: PostgresCluster, tmp_path: Path
) -> None:
    done = subprocess.run(
        [*FLEETCRON, "doctor", "--backend", f"{primary.url}?timeout=5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    line = next((row for row in done.stdout.splitlines() if "postgres (replication)" in row), None)
    assert line is not None, done.stdout + done.stderr
    assert line.startswith("warn"), line
    assert "no synchronous standby is connected" in line
    assert "every write waits" in line
