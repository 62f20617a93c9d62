"""SQLite's same-host takeover, on a real database file with real processes: a lease whose
holder process is gone from this host is taken at once with a higher fence, never while
the holder lives, never from a row that does not record its holder (docs/design/leases.md).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcron import Fleet
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.files import load_migrations

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the takeover needs /proc")

# Takes the lease, says so on stdout (its fence and holder, as JSON), then holds it until
# stdin closes. `python -c`: the process whose pid the lease records is this one.
HOLDER = """
import json, sys
from fleetcron import Fleet
url, namespace, name, at_least = sys.argv[1:]
with Fleet(url, namespace=namespace) as fleet:
    lease = fleet.try_lock(name, lock_at_most="10m", lock_at_least=at_least)
    answer = None if lease is None else {"fence": lease.fence, "holder": lease.holder}
    print(json.dumps(answer), flush=True)
    sys.stdin.read()
"""


class Holders:
    """Holder processes, each the leader of a session of its own (as a service or a crontab
    line runs): killed and reaped at the end of the test."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, *, at_least: str = "0s") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, self.url, self.namespace, name, at_least],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def take(
        self, name: str, *, at_least: str = "0s"
    ) -> tuple[subprocess.Popen[str], dict[str, object]]:
        proc = self.start(name, at_least=at_least)
        assert proc.stdout is not None
        taken = json.loads(proc.stdout.readline())
        assert taken is not None, "the holder could not take the lease"
        return proc, taken

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'fleetcron.db'}"


@pytest.fixture
def holders(url: str, namespace: str) -> Iterator[Holders]:
    found = Holders(url, namespace)
    yield found
    found.close()


@pytest.fixture
def fleet(url: str, namespace: str) -> Iterator[Fleet]:
    with Fleet(url, namespace=namespace) as opened:
        yield opened


def killed(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and wait until it has exited, without reaping it: a zombie, as a
    parent that has not waited yet leaves it."""
    os.kill(proc.pid, signal.SIGKILL)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


def test_a_lease_whose_holder_was_killed_is_taken_at_once_and_the_old_holder_is_refused(
    fleet: Fleet, holders: Holders, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    proc, old = holders.take("report")
    assert fleet.try_lock("report", lock_at_most="10m") is None

    killed(proc)
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        lease = fleet.try_lock("report", lock_at_most="10m")

    assert lease is not None, "a lease whose holder is gone waited for its 10 minutes"
    assert isinstance(old["fence"], int)
    assert isinstance(old["holder"], str)
    assert lease.fence > old["fence"]
    ops = fleet.store.ops
    # The dead holder's renewal and release (were it to come back) change nothing.
    assert (
        fleet.store.run(
            ops.lease_extend(namespace, "report", old["holder"], old["fence"], 60_000_000)
        )
        is None
    )
    assert (
        fleet.store.run(ops.lease_release(namespace, "report", old["holder"], old["fence"]))
        is False
    )
    row = fleet.get("report")
    assert row is not None
    assert row.holder == lease.holder
    said = [r for r in caplog.records if getattr(r, "action", None) == "lease_holder_gone"]
    assert len(said) == 1
    assert f"pid {proc.pid}, fence {old['fence']}" in said[0].getMessage()
    assert old["holder"].rpartition(":")[2] not in said[0].getMessage()  # its secret token
    assert row.fence == lease.fence
    lease.release()


def test_a_live_holder_is_never_taken_over_even_when_stopped(
    fleet: Fleet, holders: Holders
) -> None:
    proc, _ = holders.take("report")
    assert fleet.try_lock("report") is None

    os.kill(proc.pid, signal.SIGSTOP)
    os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WNOWAIT)

    assert fleet.try_lock("report") is None  # stopped is alive: it may resume and write
    os.kill(proc.pid, signal.SIGCONT)


def test_a_dead_holders_lock_at_least_still_holds_its_lease(fleet: Fleet, holders: Holders) -> None:
    proc, _ = holders.take("report", at_least="10m")
    killed(proc)

    # Released on its behalf, as it would have released it: held until its lock_at_least.
    assert fleet.try_lock("report") is None
    row = fleet.get("report")
    assert row is not None
    assert row.expires_us == row.min_until_us


def test_of_contenders_racing_for_a_dead_holders_lease_exactly_one_takes_it(
    holders: Holders,
) -> None:
    proc, old = holders.take("report")
    killed(proc)

    contenders = [holders.start("report") for _ in range(4)]
    answers = []
    for contender in contenders:
        assert contender.stdout is not None
        answers.append(json.loads(contender.stdout.readline()))

    winners = [answer for answer in answers if answer is not None]
    assert len(winners) == 1, answers  # the winner lives on: the others find it alive
    assert isinstance(old["fence"], int)
    assert winners[0]["fence"] > old["fence"]


def test_a_lease_row_that_does_not_record_its_holder_is_never_taken_over(
    fleet: Fleet, holders: Holders, url: str, namespace: str
) -> None:
    # A dead holder's row, then taken by code that does not record its process (a replica
    # of the previous version): the process columns left behind describe the old fence.
    proc, _old = holders.take("report")
    killed(proc)
    path = parse_store_url(url).path
    assert path is not None
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE fleetcron_lease SET holder = 'old-version:1:x', fence = fence + 1 "
            "WHERE namespace = ? AND name = 'report'",
            (namespace,),
        )

    assert fleet.try_lock("report") is None
    row = fleet.get("report")
    assert row is not None
    assert row.holder == "old-version:1:x"


def test_an_older_database_is_upgraded_and_its_held_leases_wait_for_their_expiry(
    tmp_path: Path, namespace: str
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE fleetcron_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TEXT NOT NULL DEFAULT '')"
        )
        for migration in load_migrations("sqlite"):
            if migration.version > 16:
                break
            for statement in migration.statements:
                db.execute(statement)
            db.execute(
                "INSERT INTO fleetcron_schema (version, name) VALUES (?, ?)",
                (migration.version, migration.name),
            )
        # Held for an hour by a process long gone (pid 1 is init's, never ours to judge).
        db.execute(
            "INSERT INTO fleetcron_lease VALUES (?, 'report', 'old:1:x', 1, 0, "
            "(julianday('now') - 2440587.5) * 86400000000 + 3600000000, 0)",
            (namespace,),
        )

    store = open_store(parse_store_url(f"sqlite:///{path}"))
    try:
        assert store.migrate() == []  # upgraded on open
        with sqlite3.connect(path) as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(fleetcron_lease)")}
        assert {
            "holder_fence",
            "holder_scope",
            "holder_pid",
            "holder_start",
            "holder_group",
        } <= columns
        with Fleet(store, namespace=namespace) as fleet:
            assert fleet.try_lock("report") is None
    finally:
        store.close()
