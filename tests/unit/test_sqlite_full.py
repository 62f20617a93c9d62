"""A full SQLite disk is an outage, said once as "disk full", never a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.sqlite import SqliteStore


def _cap_at_current_size(store: SqliteStore) -> None:
    """Make the database as full as a full disk would (SQLITE_FULL on the next growth)."""
    conn = store._connection()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_database_is_unavailable_and_says_the_disk_is_full(tmp_path: Path) -> None:
    store = open_store(parse_store_url(f"sqlite:///{tmp_path / 'fc.db'}"))
    assert isinstance(store, SqliteStore)
    try:
        _cap_at_current_size(store)
        with pytest.raises(StoreUnavailable) as raised:
            for n in range(10_000):
                store.run(
                    store.ops.lease_acquire("ns", f"name-{n:05d}-" + "x" * 200, "h", 10**9, 0)
                )
        assert f"the disk holding {tmp_path / 'fc.db'} is full" in raised.value.message
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        # Nothing half-done: the transaction was rolled back, the store still reads.
        assert store.run(store.ops.store_now()) > 0
    finally:
        store.close()
