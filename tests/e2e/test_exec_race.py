"""Many replicas start ``fleetcron exec`` for one name at the same moment: one runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, read_when_written, wait_for

REPLICAS = 8  # two hosts' worth of crontabs firing the same line

# Appends one line, then holds the lease for at least ~1s and until the test releases it,
# so a slow-starting replica cannot arrive after the winner has finished.
HOLD = (
    'echo "$FLEETCRON_FENCE $$" >> "$1"; sleep 1; i=0; '
    'while [ ! -e "$2" ] && [ "$i" -lt 600 ]; do sleep 0.05; i=$((i + 1)); done'
)
# Start barrier: every replica is up before any of them calls fleetcron.
BARRIER = 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.01; done; shift 2; exec "$@"'


@CROSS_PROCESS_BACKENDS
@pytest.mark.parametrize("skipped_exit_code", [None, 3])
def test_exactly_one_of_simultaneous_replicas_runs_the_command(
    cli: Cli, tmp_path: Path, skipped_exit_code: int | None
) -> None:
    ran, release, go = tmp_path / "ran", tmp_path / "release", tmp_path / "go"
    options = [] if skipped_exit_code is None else ["--skipped-exit-code", str(skipped_exit_code)]
    command = ["exec", "nightly-export", *options, "--", "sh", "-c", HOLD, "sh", str(ran)]
    replicas = [
        cli.spawn(
            *command,
            str(release),
            prefix=["sh", "-c", BARRIER, "sh", str(tmp_path / f"ready-{i}"), str(go)],
        )
        for i in range(REPLICAS)
    ]
    wait_for(
        lambda: all((tmp_path / f"ready-{i}").exists() for i in range(REPLICAS)),
        what="every replica at the start barrier",
    )
    go.touch()

    def losers_done() -> bool:
        return sum(p.poll() is not None for p in replicas) >= REPLICAS - 1

    wait_for(losers_done, timeout=60, what="all replicas but one to exit")
    running = [p for p in replicas if p.poll() is None]
    lines_while_held = ran.read_text().splitlines()
    release.touch()
    results = [p.wait() for p in replicas]

    assert len(running) == 1, [p.poll() for p in replicas]
    assert len(lines_while_held) == 1, lines_while_held
    assert ran.read_text().splitlines() == lines_while_held
    for proc, result in zip(replicas, results, strict=True):
        assert "Traceback" not in result.stderr, result.stderr
        expected = 0 if proc is running[0] else skipped_exit_code or 0
        assert result.returncode == expected, result.stderr


def _timed(log: Path, seconds: float) -> list[str]:
    script = (
        "import sys, time\n"
        "log = open(sys.argv[1], 'a')\n"
        "log.write(f'start {time.time()}\\n'); log.flush()\n"
        f"time.sleep({seconds})\n"
        "log.write(f'end {time.time()}\\n')\n"
    )
    return [sys.executable, "-c", script, str(log)]


def _interval(log: Path) -> tuple[float, float]:
    fields = dict(line.split() for line in log.read_text().splitlines())
    return float(fields["start"]), float(fields["end"])


@CROSS_PROCESS_BACKENDS
def test_wait_runs_after_the_holder_releases_without_overlap(cli: Cli, tmp_path: Path) -> None:
    first_log, second_log, skipped_log = (tmp_path / n for n in ("first", "second", "skipped"))
    first = cli.spawn("exec", "report", "--", *_timed(first_log, 1.0))
    read_when_written(first_log)  # the first holds the lease now

    launched = time.time()
    skipped = cli.run("exec", "report", "--", *_timed(skipped_log, 0))
    second = cli.run("exec", "report", "--wait", "5s", "--", *_timed(second_log, 0.1))
    first_result = first.wait()

    assert first_result.returncode == 0, first_result.stderr
    assert skipped.returncode == 0, skipped.stderr
    assert not skipped_log.exists(), "without --wait the second replica must skip"
    assert second.returncode == 0, second.stderr
    first_start, first_end = _interval(first_log)
    second_start, second_end = _interval(second_log)
    assert second_start >= first_end, "the waiting run overlapped the holder"
    assert second_start - launched > 0.3, "the waiting run did not wait"
    assert first_start < first_end <= second_start < second_end


@CROSS_PROCESS_BACKENDS
def test_wait_gives_up_after_its_duration_and_skips(cli: Cli, tmp_path: Path) -> None:
    holder_pid = tmp_path / "holder"
    marker = tmp_path / "marker"
    hold = 'echo $$ > "$1"; exec sleep 30'
    cli.spawn("exec", "busy", "--", "sh", "-c", hold, "sh", str(holder_pid))
    cli.track_group(int(read_when_written(holder_pid)))

    started = time.monotonic()
    result = cli.run(
        "exec", "busy", "--wait", "700ms", "--skipped-exit-code", "5", "--", "touch", str(marker)
    )
    assert result.returncode == 5, result.stderr
    assert time.monotonic() - started >= 0.7
    assert not marker.exists()


@pytest.mark.parametrize("flags", [(), ("--wait", "200ms")], ids=["try", "wait"])
def test_a_skipped_exec_says_so_in_one_line_at_v(
    sqlite_cli: Cli, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    holder_pid = tmp_path / "holder"
    hold = 'echo $$ > "$1"; exec sleep 30'
    sqlite_cli.spawn("exec", "busy", "--", "sh", "-c", hold, "sh", str(holder_pid))
    sqlite_cli.track_group(int(read_when_written(holder_pid)))

    result = sqlite_cli.run("-v", "exec", "busy", *flags, "--", "true")

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["fleetcron: lock busy is held elsewhere; skipped"]
