"""``fleetcron status``: the dead man's switch read from the store by a plain monitor.

A job that succeeds is ok while a replica runs it and becomes overdue once no replica
does — seen by ``status --check`` from outside, without the jobs file. A job that keeps
failing is failing. Waits are on the store's ledger and clock, never fixed sleeps.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, wait_for
from fleetcron.cli.exitcodes import EXIT_STORE_UNAVAILABLE, EXIT_UNHEALTHY, EXIT_USAGE

pytestmark = pytest.mark.slow

JOBS = """
[jobs.good]
every = "1s"
grace = "1s"
command = ["true"]

[jobs.bad]
every = "1s"
command = ["false"]
"""


def _status(cli: Cli, *jobs: str) -> dict[str, Any]:
    result = cli.run("status", "--json", *jobs)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _state(cli: Cli, job: str) -> str:
    return str(_status(cli, job)["jobs"][0]["state"])


@CROSS_PROCESS_BACKENDS
def test_status_check_sees_failing_and_overdue_jobs_from_the_store_alone(
    cli: Cli, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOBS)
    daemon = cli.spawn("run", str(jobs))

    def ran(job: str, state: str) -> bool:
        rows = json.loads(cli.run("runs", job, "--json").stdout or "[]")
        return any(row["state"] == state for row in rows)

    assert wait_for(lambda: ran("good", "succeeded") and ran("bad", "failed"), timeout=60)
    assert cli.run("status", "--check", "good").returncode == 0
    failing = cli.run("status", "--check")
    assert failing.returncode == EXIT_UNHEALTHY, failing.stdout + failing.stderr
    assert "bad: failing: the latest outcome is a failure" in failing.stdout
    assert _state(cli, "good") in ("ok", "running")

    # No replica runs any more: the store's clock passes the next slot's grace.
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60).returncode == 0
    assert wait_for(lambda: _state(cli, "good") == "overdue", timeout=60)
    overdue = cli.run("status", "--check", "good")
    assert overdue.returncode == EXIT_UNHEALTHY
    assert "good: overdue: no success since the slot of" in overdue.stdout
    report = _status(cli, "good")["jobs"][0]
    assert report["overdue"] is True
    assert report["expected_slot"] > report["last_success"]


def test_status_names_an_unknown_job_and_an_unreachable_store(sqlite_cli: Cli) -> None:
    assert sqlite_cli.run("migrate").returncode == 0  # status never creates a store
    unknown = sqlite_cli.run("status", "--check", "nosuch")
    assert unknown.returncode == EXIT_USAGE
    assert "no job named nosuch" in unknown.stderr
    down = Cli("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2", "ns", sqlite_cli.workdir)
    gone = down.run("status", "--check")
    assert gone.returncode == EXIT_STORE_UNAVAILABLE, gone.stderr
    assert "Traceback" not in gone.stderr
