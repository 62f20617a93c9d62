"""SQLite: an ``exec`` killed on this host is taken over as soon as its command is gone,
not after ``--lock-at-most``; never while the command still runs, never from a holder
that is only stopped (docs/design/leases.md, "Same-host takeover")."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from e2e.helpers import Cli, read_when_written, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the takeover needs /proc")

# The holder's command: says its process group and fence, then runs until stopped.
HOLD = 'echo "$$ $FLEETCRON_FENCE" > "$1"; exec sleep 300'
# The same, deaf to SIGTERM (ignored signals stay ignored across exec): only the reaper's
# SIGKILL, a --kill-grace after the holder died, ends it.
HOLD_STUBBORN = 'trap "" TERM; echo "$$ $FLEETCRON_FENCE" > "$1"; exec sleep 300'
# The next holder's command: when it started (CLOCK_MONOTONIC, the test's clock too),
# whether a process of the old command's group was still running then, and its fence.
CHECK = """
import os, sys, time
started = time.monotonic()
old, out = int(sys.argv[1]), sys.argv[2]
running = []
for entry in os.listdir("/proc"):
    try:
        with open(f"/proc/{entry}/stat") as file:
            fields = file.read().rpartition(")")[2].split()
    except (OSError, ValueError):
        continue
    if int(fields[2]) == old and fields[0] != "Z":
        running.append(entry)
with open(out, "w") as file:
    file.write(f"{started} {len(running)} {os.environ['FLEETCRON_FENCE']}\\n")
"""


def hold(cli: Cli, tmp_path: Path, script: str, *options: str) -> tuple[int, int, int]:
    """Start an exec holding ``sweep`` for 10 minutes with ``script`` as its command; its
    pid, its command's process group and its fence, once the lease shows as held."""
    said = tmp_path / "holder"
    holder = cli.spawn(
        "exec", "sweep", "--lock-at-most", "10m", *options, "--",
        "sh", "-c", script, "sh", str(said),
    )  # fmt: skip
    pgid, fence = map(int, read_when_written(said).split())
    cli.track_group(pgid)
    row = wait_for(lambda: cli.held("sweep"), what="the lease to show as held")
    assert row["fence"] == fence
    return holder.pid, pgid, fence


def follow(cli: Cli, tmp_path: Path, old_group: int, *options: str) -> tuple[float, int, int]:
    """Run the next exec of ``sweep`` (its CHECK command); when its command started, how
    many processes of ``old_group`` were still running then, and its fence."""
    out = tmp_path / "next"
    result = cli.run(
        "exec", "sweep", "--lock-at-most", "10m", *options, "--",
        sys.executable, "-c", CHECK, str(old_group), str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert out.exists(), f"the next exec did not run its command: {result.stderr}"
    started, running, fence = out.read_text().split()
    assert "is gone from this host; released on its behalf" in result.stderr, result.stderr
    return float(started), int(running), int(fence)


def test_an_exec_killed_on_this_host_is_taken_over_within_a_second_not_after_its_lease(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    pid, pgid, fence = hold(sqlite_cli, tmp_path, HOLD)

    os.kill(pid, signal.SIGKILL)  # left a zombie: nobody reaps it before the next exec
    killed_at = time.monotonic()
    # --wait: the next exec starts at once, and may come before the reaper has stopped the
    # old command; it must then wait for it, not skip, to be measured.
    started, running, next_fence = follow(sqlite_cli, tmp_path, pgid, "--wait", "30s")

    assert running == 0, "the next exec started while the old command still ran"
    assert next_fence > fence
    taken_after = started - killed_at
    print(f"\nnext exec's command started {taken_after:.3f} s after the SIGKILL")  # noqa: T201
    assert taken_after < 5.0, "the takeover took longer than a loaded machine explains"


def test_the_next_exec_waits_for_a_command_that_outlives_its_killed_holder(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    pid, pgid, fence = hold(sqlite_cli, tmp_path, HOLD_STUBBORN, "--kill-grace", "2s")

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    started, running, next_fence = follow(sqlite_cli, tmp_path, pgid, "--wait", "30s")

    # The reaper's SIGTERM did nothing; its SIGKILL came 2 s later. Not a moment before
    # the command was gone did the lease move.
    assert running == 0, "the next exec started while the old command still ran"
    assert started - killed_at >= 1.5, started - killed_at
    assert next_fence > fence


def test_a_stopped_exec_is_not_taken_over(sqlite_cli: Cli, tmp_path: Path) -> None:
    pid, _pgid, fence = hold(sqlite_cli, tmp_path, HOLD)

    os.kill(pid, signal.SIGSTOP)  # alive: it may resume and renew
    wait_for(lambda: _state(pid) == "T", what="the holder to stop")
    marker = tmp_path / "marker"
    skipped = sqlite_cli.run(
        "exec", "sweep", "--", "sh", "-c", 'echo ran > "$1"', "sh", str(marker)
    )

    assert skipped.returncode == 0, skipped.stderr
    assert not marker.exists(), "ran beside a stopped holder"
    row = sqlite_cli.held("sweep")
    assert row is not None
    assert row["fence"] == fence
    os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
