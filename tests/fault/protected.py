"""The protected resource of the fault suite: a fence-checking table in SQLite.

A write under a lease carries the lease's fence; the resource accepts it iff the fence is
``>=`` the highest fence it has accepted for that name (equal is allowed so that one holder
can write repeatedly), in one ``BEGIN IMMEDIATE`` transaction: read the high-water mark,
compare, update. Every write is logged in the worker's history (``write_invoke``, then
``write_ok`` / ``write_rejected`` with ``data.highest`` / ``write_error``) and kept in the
table ``accepted`` for a post-mortem.

The resource lives in a SQLite file of its own (not the store under test), so the store's
faults never touch it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from fault.history import HistoryWriter

__all__ = ["ProtectedResource"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS highest (
    name TEXT PRIMARY KEY,
    fence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS accepted (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    fence INTEGER NOT NULL,
    worker TEXT NOT NULL,
    slot_us INTEGER
);
"""


class ProtectedResource:
    """A fence-checking resource in the SQLite file ``path`` (created if missing).

    One connection per instance, shared by its threads under a lock; any number of
    processes may open the same file.
    """

    busy_timeout_s = 60.0

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def accepts(self, fence: int, highest: int | None) -> bool:
        """The fence check: a write with ``fence`` is accepted when the highest accepted
        fence so far is ``highest`` (``None``: none yet)."""
        return highest is None or fence >= highest

    def write(
        self, writer: HistoryWriter, name: str, fence: int, slot_us: int | None = None
    ) -> bool:
        """Write under ``fence`` for ``name``; log it in ``writer``'s history; return whether
        it was accepted. A SQLite error is logged as ``write_error`` and raised."""
        writer.log("write_invoke", name, fence=fence, slot_us=slot_us)
        try:
            with self._lock:
                accepted, highest = self._write(writer.worker, name, fence, slot_us)
        except sqlite3.Error as exc:
            writer.log("write_error", name, fence=fence, slot_us=slot_us, error=repr(exc))
            raise
        if accepted:
            writer.log("write_ok", name, fence=fence, slot_us=slot_us)
        else:
            writer.log("write_rejected", name, fence=fence, slot_us=slot_us, highest=highest)
        return accepted

    def _write(
        self, worker: str, name: str, fence: int, slot_us: int | None
    ) -> tuple[bool, int | None]:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT fence FROM highest WHERE name = ?", (name,)).fetchone()
            highest = None if row is None else int(row[0])
            accepted = self.accepts(fence, highest)
            if accepted:
                db.execute(
                    "INSERT INTO highest (name, fence) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET fence = max(fence, excluded.fence)",
                    (name, fence),
                )
                db.execute(
                    "INSERT INTO accepted (name, fence, worker, slot_us) VALUES (?, ?, ?, ?)",
                    (name, fence, worker, slot_us),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return accepted, highest

    def highest(self, name: str) -> int | None:
        """The highest fence accepted for ``name`` (``None``: no write yet)."""
        with self._lock:
            row = self._db.execute("SELECT fence FROM highest WHERE name = ?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def accepted(self, name: str) -> list[tuple[str, int]]:
        """The accepted writes for ``name``, in the order accepted: ``(worker, fence)``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT worker, fence FROM accepted WHERE name = ? ORDER BY seq", (name,)
            ).fetchall()
        return [(str(worker), int(fence)) for worker, fence in rows]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
