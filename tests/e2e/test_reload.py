"""``fleetcron run`` re-reads its jobs file on SIGHUP; a bad file is refused and the jobs
in place keep running."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from e2e.helpers import Cli, wait_for

pytestmark = pytest.mark.slow

FIRST = '[jobs.old]\nevery = "1s"\ncommand = ["true"]\n'
SECOND = '[jobs.new]\nevery = "1s"\ncommand = ["true"]\n'


def _succeeded(cli: Cli, job: str) -> int:
    rows = json.loads(cli.run("runs", job, "--json", "--limit", "200").stdout or "[]")
    return sum(1 for row in rows if row["state"] == "succeeded")


def test_sighup_reloads_the_jobs_file_and_refuses_a_broken_one(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(FIRST)
    daemon = sqlite_cli.spawn("run", str(jobs))
    assert wait_for(lambda: _succeeded(sqlite_cli, "old") >= 1, timeout=60)

    jobs.write_text("[jobs.old\nthis is not TOML")
    daemon.proc.send_signal(signal.SIGHUP)
    err = tmp_path / f"spawned-{1}.err"
    assert wait_for(lambda: "reload refused" in err.read_text(), timeout=30)
    before = _succeeded(sqlite_cli, "old")
    assert wait_for(lambda: _succeeded(sqlite_cli, "old") > before, timeout=60)

    jobs.write_text(SECOND)
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "jobs reloaded: 1 added, 0 changed, 1 removed" in err.read_text(),
                    timeout=30)  # fmt: skip
    assert wait_for(lambda: _succeeded(sqlite_cli, "new") >= 1, timeout=60)
    stopped_at = len(json.loads(sqlite_cli.run("runs", "old", "--json", "--limit", "200").stdout))
    assert wait_for(lambda: _succeeded(sqlite_cli, "new") >= 3, timeout=60)
    after = len(json.loads(sqlite_cli.run("runs", "old", "--json", "--limit", "200").stdout))
    assert after == stopped_at, "the removed job was still scheduled"

    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60).returncode == 0
