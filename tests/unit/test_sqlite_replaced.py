"""A SQLite file deleted or replaced under a process that has it open: the store refuses
every call from then on (it would work in a file nobody else sees), and a scheduler that
meets it says so once, stops claiming and raises it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetcron import Fleet
from fleetcron.bridge import ThreadedAsyncStore
from fleetcron.errors import StoreReplaced
from fleetcron.job_options import job_spec
from fleetcron.models import LeaseRecord, SlotClaim
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.base import Operation
from fleetcron.stores.sql.sqlite import SqliteStore

NS = "replaced"
SAID = "was deleted or replaced since this process opened it"
GONE = "no file is at that path now"
OTHER = "another file is at that path now"


def _open(path: Path) -> SqliteStore:
    store = open_store(parse_store_url(f"sqlite:///{path}"))
    assert isinstance(store, SqliteStore)
    return store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "fc.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteStore]:
    opened = _open(db)
    yield opened
    opened.close()


def _acquire(store: SqliteStore, name: str = "report") -> Operation[LeaseRecord | None]:
    return store.ops.lease_acquire(NS, name, "host:1:a", 10_000_000, 0)


def _remove_with_side_files(db: Path) -> None:
    """``rm fc.db*``."""
    for path in db.parent.glob(db.name + "*"):
        path.unlink()


def _other_database(db: Path) -> Path:
    """A fleetcron database of its own beside ``db``, closed (no side files left)."""
    other = db.with_name("other.db")
    _open(other).close()
    return other


def _refused(call: Callable[[], object], *fragments: str) -> None:
    with pytest.raises(StoreReplaced) as raised:
        call()
    for fragment in (SAID, *fragments):
        assert fragment in raised.value.message, raised.value.message


def test_a_deleted_database_refuses_every_call_and_never_makes_a_new_one(
    store: SqliteStore, db: Path
) -> None:
    assert store.run(_acquire(store)) is not None
    _remove_with_side_files(db)

    _refused(lambda: store.run(_acquire(store, "another")), str(db), GONE)
    # Not only claims: an outcome, a read, the clock — nothing more is done in the file.
    _refused(lambda: store.run(store.ops.lease_release(NS, "report", "host:1:a", 1)), GONE)
    _refused(lambda: store.run(store.ops.store_now()), GONE)
    _refused(lambda: store.execute_text("SELECT 1"), GONE)
    assert not db.exists()  # no silent reconnection that creates a fresh store


def test_a_database_renamed_over_refuses_every_call_and_writes_nothing_beside_it(
    store: SqliteStore, db: Path
) -> None:
    assert store.run(_acquire(store)) is not None
    wal = db.with_name(db.name + "-wal")
    logged = wal.read_bytes()
    os.replace(_other_database(db), db)  # mv other.db fc.db

    _refused(lambda: store.run(_acquire(store, "another")), OTHER)
    claim = SlotClaim(job="job", slot_us=1, run_id="r1")
    _refused(lambda: store.run(store.ops.run_claim(NS, [claim], "h", 10**7)), OTHER)
    _refused(lambda: store.run(store.ops.lease_release(NS, "report", "host:1:a", 1)), OTHER)
    # The old write-ahead log is still found by name beside the new file: not one more
    # frame went into it (the next process to open the path reads it as the new file's).
    assert wal.read_bytes() == logged


def test_a_database_renamed_away_and_back_stays_refused(store: SqliteStore, db: Path) -> None:
    away = db.with_name("away.db")
    db.rename(away)
    _refused(lambda: store.run(_acquire(store)), GONE)
    away.rename(db)
    # Once noticed, never again: meanwhile another process may have made a store there.
    _refused(lambda: store.run(_acquire(store)), GONE)


def test_a_store_opened_again_does_not_reconnect_to_the_file_now_at_the_path(
    store: SqliteStore, db: Path
) -> None:
    store.close()  # the next call connects again, by the path
    os.replace(_other_database(db), db)
    _refused(lambda: store.run(_acquire(store)), OTHER)


def test_a_transaction_during_which_the_file_was_deleted_is_not_answered(
    store: SqliteStore, db: Path
) -> None:
    def acquire_while_deleted() -> Operation[LeaseRecord | None]:
        taken = yield from _acquire(store)
        _remove_with_side_files(db)  # committed after this, in the unlinked file
        return taken

    _refused(lambda: store.run(acquire_while_deleted()), GONE)


def test_the_lock_api_refuses_a_replaced_store(store: SqliteStore, db: Path) -> None:
    fleet = Fleet(store, namespace=NS)
    with fleet.lock("report", lock_at_most="10s", keepalive=False):
        pass
    _remove_with_side_files(db)
    _refused(lambda: fleet.try_lock("report", lock_at_most="10s"), GONE)


async def test_a_scheduler_whose_file_is_deleted_says_so_once_stops_claiming_and_raises(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []  # the slots run (SQLite's clock is this host's)

    tick = job_spec(
        "tick",
        where="test",
        call=lambda ctx: ran.append(ctx.slot_us),
        every="100ms",
        lock_at_most="1s",
    )
    options = SchedulerOptions(namespace=NS, shutdown_grace_s=2.0, kill_grace_s=0.2)
    scheduler = AsyncScheduler(ThreadedAsyncStore(_open(db)), [tick], options)
    with caplog.at_level(logging.DEBUG, logger="fleetcron"):
        task = asyncio.create_task(scheduler.run())
        try:
            async with asyncio.timeout(20):
                while len(ran) < 2:
                    await asyncio.sleep(0.02)
            _remove_with_side_files(db)
            deleted_us = time.time_ns() // 1000
            async with asyncio.timeout(10):
                with pytest.raises(StoreReplaced, match=SAID):
                    await task
        finally:
            scheduler.stop()
            if not task.done():
                await asyncio.wait([task], timeout=10)
            await scheduler.store.close()

    actions = [getattr(r, "action", None) for r in caplog.records]
    replaced = [r for r in caplog.records if getattr(r, "action", None) == "store_replaced"]
    assert len(replaced) == 1, actions
    assert replaced[0].levelno == logging.ERROR
    assert str(db) in replaced[0].getMessage()
    assert "store_unavailable" not in actions  # not an outage, retried for ever
    # A slot due after the file went could only be claimed after: none was.
    assert max(ran) <= deleted_us, (ran, deleted_us)
    assert not db.exists()
