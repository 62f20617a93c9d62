"""Queue workers under faults, on every backend: three worker processes drain a queue into
the application's database; one is SIGKILLed mid-batch, one is SIGSTOPped mid-item past
its claim and resumed. Every item is processed, none is lost, each item's effect is
written once, and the resumed worker's stale write is refused by the fence."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, wait_for
from fleetcron import Fleet, fencing

WORKER = Path(__file__).with_name("queueworker_proc.py")
ITEMS = 24


def _lines(log: Path) -> list[tuple[int, str, int, int]]:
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:  # a line being written is skipped until it is whole
            found.append((int(parts[0]), parts[1], int(parts[2]), int(parts[3])))
    return found


def _effects(app_db: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(app_db, timeout=30) as conn:
        return list(conn.execute("SELECT item, pid FROM effects"))


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)


@CROSS_PROCESS_BACKENDS
def test_killed_and_frozen_workers_lose_nothing_and_write_nothing_stale(
    backend_url: str, namespace: str, tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    app_db, log = tmp_path / "app.db", tmp_path / "events.log"
    with sqlite3.connect(app_db, isolation_level=None) as conn:
        conn.execute("CREATE TABLE effects (item integer, pid integer, fence integer)")
        fencing.create_tables(conn)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCRON_")}
    with Fleet(backend_url, namespace=namespace) as fleet:
        queue = fleet.queue("work", retry_backoff=0)
        ids = queue.put_many(range(ITEMS))
        for _ in range(3):
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), backend_url, namespace, str(app_db), str(log)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            workers.append(proc)
        for proc in workers:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        killed, frozen = workers[0], workers[1]

        # SIGKILL one mid-batch: its claims expire and its items go to the others.
        wait_for(
            lambda: any(pid == killed.pid and e == "start" for pid, e, _, _ in _lines(log)),
            timeout=30,
            what="the first worker to start an item",
        )
        killed.kill()
        killed.wait(10)

        # SIGSTOP another while it works on an item, before it writes.
        def frozen_starts() -> tuple[int, int] | None:
            lines = _lines(log)
            done = {
                (item, fence) for pid, e, item, fence in lines if pid == frozen.pid and e != "start"
            }
            started = [(i, f) for pid, e, i, f in lines if pid == frozen.pid and e == "start"]
            pending = [pair for pair in started if pair not in done]
            return pending[-1] if pending else None

        item, fence = wait_for(frozen_starts, timeout=30, what="the second worker mid-item")
        frozen.send_signal(signal.SIGSTOP)
        wait_for(
            lambda: any(i == item and pid != frozen.pid for i, pid in _effects(app_db)),
            timeout=60,
            what=f"item {item} to be written by another worker after its claim expired",
        )
        frozen.send_signal(signal.SIGCONT)

        wait_for(
            lambda: (frozen.pid, "stale", item, fence) in _lines(log),
            timeout=30,
            what="the resumed worker's write to be refused as stale",
        )
        wait_for(
            lambda: queue.stats().done == ITEMS,
            timeout=90,
            what="every item done",
        )
        stats = queue.stats()

    effects = Counter(item for item, _pid in _effects(app_db))
    assert sorted(effects) == sorted(i for i in ids if i is not None)
    assert set(effects.values()) == {1}, "each item's effect written once"
    assert (stats.done, stats.dead, stats.depth) == (ITEMS, 0, 0), "none lost"
    assert not any(pid == frozen.pid and i == item and e == "wrote" for pid, e, i, _ in _lines(log))
