"""Nothing of a run is alive once the store can hand its lease to another replica.

A command that ignores SIGTERM writes a heartbeat (its host's clock, µs) every 50 ms. Its
last heartbeat must come before the lease's expiry in the store's clock — the time the
store granted the lease plus ``lock_at_most``, read back from the store. Every store here
runs on this host, so the heartbeats and the store's clock are one clock.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, wait_for
from fleetcron.models import RunRecord
from fleetcron.stores import open_store, parse_store_url

pytestmark = pytest.mark.slow

LEASE_US = 3_000_000
# Ignores SIGTERM (and so does the `sleep` it starts: an ignored signal stays ignored
# across exec); only SIGKILL of the process group ends it.
STUBBORN = 'trap "" TERM; while :; do date +%s%6N >> "$1"; sleep 0.05; done'


def last_heartbeat_us(path: Path) -> int:
    lines = [line for line in path.read_text().split("\n")[:-1] if line.strip()]
    assert lines, f"{path} has no heartbeat"
    return int(lines[-1])


def final_runs(cli: Cli, job: str) -> list[RunRecord]:
    store = open_store(parse_store_url(cli.backend))
    try:
        rows = store.run(store.ops.run_list(cli.namespace, job, 100))
    finally:
        store.close()
    return [row for row in rows if row.state in ("cancelled", "failed", "lost", "succeeded")]


@CROSS_PROCESS_BACKENDS
def test_a_daemon_run_that_ignores_sigterm_is_killed_before_its_lease_expires(
    cli: Cli, tmp_path: Path
) -> None:
    beats = tmp_path / "beat"
    jobs = tmp_path / "jobs.toml"
    # Each run beats into a file of its own, named by its fence.
    per_run = STUBBORN.replace('"$1"', '"$1.$FLEETCRON_FENCE"')
    jobs.write_text(
        textwrap.dedent(
            f"""
            [jobs.stubborn]
            every = "2s"
            catchup = "skip"
            lock_at_most = "3s"
            keepalive = false
            command = ["sh", "-c", '{per_run}', "sh", "{beats}"]
            """
        )
    )
    daemon = cli.spawn("run", str(jobs), "--shutdown-grace", "1s")

    runs = wait_for(
        lambda: final_runs(cli, "stubborn"), timeout=30, what="a run of the stubborn job to end"
    )
    daemon.proc.send_signal(signal.SIGTERM)
    result = daemon.wait(timeout=30)
    assert result.returncode == 0, result.stderr

    for run in runs:
        assert run.started_us is not None
        expiry = run.started_us + LEASE_US  # never renewed: keepalive = false
        beat_file = Path(f"{beats}.{run.fence}")
        last = last_heartbeat_us(beat_file)
        assert last < expiry, (
            f"the command of fence {run.fence} was alive {(last - expiry) / 1e6:.3f}s after "
            "its lease expired in the store"
        )
        assert run.state == "cancelled", run
        assert run.error == "lock_at_most elapsed", run


@CROSS_PROCESS_BACKENDS
def test_an_exec_command_that_ignores_sigterm_is_killed_before_its_lease_expires(
    cli: Cli, tmp_path: Path
) -> None:
    beats = tmp_path / "beat"
    result = cli.run(
        "exec",
        "stubborn",
        "--lock-at-most",
        "3s",
        "--no-keepalive",
        "--",
        "sh",
        "-c",
        STUBBORN,
        "sh",
        str(beats),
        timeout=30,
    )
    assert result.returncode == 76, result.stderr  # the lease ended: the command was stopped
    store = open_store(parse_store_url(cli.backend))
    try:
        record = store.run(store.ops.lease_get(cli.namespace, "stubborn"))
    finally:
        store.close()
    assert record is not None
    expiry = record.acquired_us + LEASE_US  # never renewed, never released in time
    last = last_heartbeat_us(beats)
    assert last < expiry, f"the command was alive {(last - expiry) / 1e6:.3f}s past its lease"


def test_the_heartbeat_clock_is_microseconds() -> None:
    """The checks above compare `date +%s%6N` with the store's µs: the same unit."""
    before = time.time_ns() // 1000
    out = subprocess.run(["date", "+%s%6N"], capture_output=True, text=True, check=True).stdout
    after = time.time_ns() // 1000
    assert before <= int(out) <= after + 1, (before, out, after)
