"""A cancel request stops a running attempt within about a second, whatever its lease.

Real processes on every backend shared across processes: the attempt is a command run by
``fleetcron exec --schedule`` with ``--lock-at-most 10m`` (its renewals come every 200 s),
or by a ``fleetcron run`` replica, and the request is ``fleetcron cancel``.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, read_when_written, wait_for

BOUND_S = 5.0
"""How long the stop may take after the request: about a second, bounded for a loaded
machine."""


def _cancelled(cli: Cli, job: str) -> dict[str, object] | None:
    runs = json.loads(cli.run("runs", job, "--json").stdout)
    done = [r for r in runs if r["state"] == "cancelled"]
    return done[0] if done else None


@CROSS_PROCESS_BACKENDS
def test_fleetcron_cancel_stops_an_exec_run_within_about_a_second(cli: Cli, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = cli.spawn(
        "exec",
        "report",
        "--schedule",
        "0 0 1 1 *",
        "--lock-at-most",
        "10m",
        "--",
        "sh",
        "-c",
        'echo up > "$0"; exec sleep 120',
        str(started),
    )
    read_when_written(started, timeout=30)
    asked = cli.run("cancel", "report", "--by", "alice@ops")
    assert asked.returncode == 0, asked.stderr
    at = time.monotonic()
    result = holder.wait(timeout=60)
    took = time.monotonic() - at

    assert took < BOUND_S, took
    assert result.returncode != 0
    (run,) = json.loads(cli.run("runs", "report", "--json").stdout)
    assert (run["state"], run["error"]) == ("cancelled", "cancelled by alice@ops"), run


@CROSS_PROCESS_BACKENDS
def test_fleetcron_cancel_stops_a_replicas_run_within_about_a_second(
    cli: Cli, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    jobs = tmp_path / "jobs.toml"
    command = ["sh", "-c", 'echo up > "$0"; exec sleep 120', str(started)]
    jobs.write_text(
        f'[jobs.report]\nevery = "1h"\nlock_at_most = "10m"\ncommand = {json.dumps(command)}\n'
    )
    replica = cli.spawn("run", str(jobs), "--shutdown-grace", "1s")
    try:
        # Refused (exit 2) until the replica has registered the job.
        wait_for(lambda: cli.run("trigger", "report").returncode == 0 or None, timeout=30)
        read_when_written(started, timeout=30)
        asked = cli.run("cancel", "report", "--by", "alice@ops")
        assert asked.returncode == 0, asked.stderr
        at = time.monotonic()
        run = wait_for(lambda: _cancelled(cli, "report"), timeout=60, interval=0.05)
        took = time.monotonic() - at
    finally:
        replica.proc.send_signal(signal.SIGTERM)
        replica.wait(timeout=60)

    assert took < BOUND_S, took
    assert run["error"] == "cancelled by alice@ops", run
