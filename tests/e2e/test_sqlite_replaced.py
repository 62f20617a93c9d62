"""``fleetcron run`` on a SQLite file deleted, then replaced, under running replicas.

A replica holds the file it opened, so a file deleted (``rm fleetcron.db*``) or replaced
(``mv other.db fleetcron.db``) lives on for it while a replica started afterwards opens
the one at the path: each would run every slot once. The replicas that held the old file
must say so and stop instead, with exit status 78, so that only the new one runs.

Each run appends ``<slot> <replica pid>`` to a shared file, so the file says which slots
ran and where, in whichever database they were claimed.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import Cli, Spawned, wait_for
from fleetcron.stores import open_store, parse_store_url

pytestmark = pytest.mark.slow

JOB = "tick"
EXIT_STORE_REFUSED = 78
SAID = "was deleted or replaced since this process opened it"
ANOTHER = "another file is at that path now"


def _reports(path: Path) -> list[tuple[int, int]]:
    """``(slot in epoch seconds, replica pid)`` of every run started so far."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    ran = []
    for line in text.split("\n")[:-1]:  # complete lines only
        slot, pid = line.split()
        ran.append((round(datetime.fromisoformat(slot).timestamp()), int(pid)))
    return ran


def _ran_by(path: Path, replica: Spawned) -> list[int]:
    return [slot for slot, pid in _reports(path) if pid == replica.pid]


def _logged(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def _stopped_on_its_own(replica: Spawned, db: Path, *what: str) -> None:
    """The replica said once that its file went (one of ``what``), then exited 78."""
    result = replica.wait(timeout=30)
    assert result.returncode == EXIT_STORE_REFUSED, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr
    said = [e for e in _logged(result.stderr) if e.get("action") == "store_replaced"]
    assert len(said) == 1, result.stderr[-3000:]
    assert said[0]["level"] == "error"
    message = said[0]["message"]
    assert any(f"SQLite database {db} {SAID} ({w})" in message for w in what), message
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fleetcron: store refused: SQLite database {db} {SAID}"), last


def test_replicas_whose_file_is_deleted_or_replaced_stop_and_no_slot_runs_twice(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    cli = sqlite_cli
    db = tmp_path / "fleetcron.db"
    out = tmp_path / "ran"
    jobs = tmp_path / "jobs.toml"
    command = ["sh", "-c", 'echo "$FLEETCRON_SLOT $PPID" >> "$1"', "sh", str(out)]
    jobs.write_text(
        f'[jobs.{JOB}]\nevery = "1s"\ncommand = {json.dumps(command)}\nlock_at_most = "2s"\n'
    )

    def replica() -> Spawned:
        return cli.spawn(
            "run", str(jobs), "--shutdown-grace", "5s", env={"FLEETCRON_LOG_FORMAT": "json"}
        )

    first = [replica(), replica()]
    wait_for(lambda: all(_ran_by(out, r) for r in first), timeout=30, what="both replicas to run")

    # rm fleetcron.db*, and a third replica: it makes a new database at the path.
    for path in tmp_path.glob("fleetcron.db*"):
        path.unlink()
    third = replica()
    # Two runs: a replica still claiming in the deleted file has run the first one's slot
    # too by the time the second comes, a second later.
    wait_for(lambda: len(_ran_by(out, third)) >= 2, timeout=30, what="the third to run twice")
    twice = [slot for slot, n in Counter(slot for slot, _ in _reports(out)).items() if n > 1]
    assert not twice, f"slots run in the deleted file and in the new one: {twice}"
    for old in first:
        # Noticed at its next transaction: before or after the third made its file.
        _stopped_on_its_own(old, db, "no file is at that path now", ANOTHER)

    # mv other.db fleetcron.db, the old database's -wal and -shm removed first (they are
    # found by name: left there, they would be read as the new file's), and a fourth.
    other = tmp_path / "other.db"
    open_store(parse_store_url(f"sqlite:///{other}")).close()
    for side in ("-wal", "-shm"):
        db.with_name(db.name + side).unlink(missing_ok=True)
    os.replace(other, db)
    fourth = replica()
    wait_for(lambda: _ran_by(out, fourth), timeout=30, what="the fourth replica to run")
    _stopped_on_its_own(third, db, ANOTHER)
    fourth.proc.send_signal(signal.SIGTERM)
    assert fourth.wait(timeout=30).returncode == 0

    ran = _reports(out)
    twice = [slot for slot, n in Counter(slot for slot, _ in ran).items() if n > 1]
    assert not twice, f"slots that ran more than once: {twice}\n{ran}"
    # One group after the other: no replica went on claiming once the next had started.
    by_first = [slot for r in first for slot in _ran_by(out, r)]
    by_third, by_fourth = _ran_by(out, third), _ran_by(out, fourth)
    assert max(by_first) < min(by_third), (by_first, by_third)
    assert max(by_third) < min(by_fourth), (by_third, by_fourth)
    # The database at the path holds the fourth replica's runs, and nothing of the others.
    store = open_store(parse_store_url(cli.backend))
    try:
        rows = store.run(store.ops.run_list(cli.namespace, JOB, 1000))
    finally:
        store.close()
    assert sorted(r.slot_us // 1_000_000 for r in rows) == sorted(by_fourth), rows
