"""The reaper stops a run's command on time when the process supervising it cannot: a
``fleetcron run`` replica or a ``fleetcron exec`` that is frozen (SIGSTOP) past the lease,
or killed (SIGKILL).

The command ignores SIGTERM and writes a heartbeat (this host's clock, µs) every 50 ms;
its last heartbeat must come before its lease's expiry in the store — read back from the
store while the supervisor is still frozen or dead, so no renewal can have moved it. On
SQLite the store's clock is this host's clock: heartbeats and expiry are on one clock.
Every wait is for a condition, with a generous bound; the supervisor stays frozen until
the command is gone, so the reaper alone can have stopped it.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from e2e.helpers import Cli, Spawned, alive, wait_for
from fleetcron.models import RunRecord
from fleetcron.reaper import Reaper
from fleetcron.reaper_process import proc_stat
from fleetcron.stores import open_store, parse_store_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Reaper.supported(), reason="the reaper needs Linux's /proc"),
]

# Ignores SIGTERM (so does the `sleep` it starts); writes its pid to "$1.pid" first.
STUBBORN = 'trap "" TERM; echo $$ > "$1.pid"; while :; do date +%s%6N >> "$1"; sleep 0.05; done'


def last_heartbeat_us(path: Path) -> int:
    lines = [line for line in path.read_text().split("\n")[:-1] if line.strip()]
    assert lines, f"{path} has no heartbeat"
    return int(lines[-1])


def started_pid(beats: Path) -> int:
    """The command's pid, once it has beaten at least once."""
    wait_for(
        lambda: beats.exists() and beats.read_text().endswith("\n"),
        timeout=30,
        what="the command to start",
    )
    return int(Path(f"{beats}.pid").read_text())


def reaper_of(supervisor: int) -> int:
    """The pid of the reaper serving ``supervisor``."""
    wanted = f"reaper_process.run_main()\0{supervisor}\0".encode()  # see reaper_argv()

    def find() -> int | None:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if wanted in cmdline:
                    return int(entry)
        return None

    found: int = wait_for(find, timeout=30, what=f"the reaper of {supervisor}")
    return found


def running_run(cli: Cli, job: str) -> RunRecord:
    store = open_store(parse_store_url(cli.backend))
    try:
        rows = store.run(store.ops.run_list(cli.namespace, job, 10))
    finally:
        store.close()
    (row,) = [row for row in rows if row.state == "running"]
    return row


def lease_expiry_us(cli: Cli, name: str) -> int:
    store = open_store(parse_store_url(cli.backend))
    try:
        record = store.run(store.ops.lease_get(cli.namespace, name))
    finally:
        store.close()
    assert record is not None
    return record.expires_us


def replica(cli: Cli, tmp_path: Path, lock_at_most: str) -> tuple[Spawned, Path]:
    """A replica (in a session of its own) running one stubborn job; its beats file."""
    beats = tmp_path / "beats"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        textwrap.dedent(
            f"""
            [jobs.stubborn]
            every = "1s"
            catchup = "skip"
            lock_at_most = "{lock_at_most}"
            command = ["sh", "-c", '{STUBBORN}', "sh", "{beats}"]
            """
        )
    )
    # setsid: the replica leads a process group of its own, so a group stop is testable.
    return cli.spawn("run", str(jobs), "--shutdown-grace", "1s", prefix=("setsid",)), beats


@pytest.mark.parametrize("stop", ["pid", "group"])
def test_a_replica_frozen_past_its_lease_has_its_command_killed_by_the_deadline(
    sqlite_cli: Cli, tmp_path: Path, stop: str
) -> None:
    daemon, beats = replica(sqlite_cli, tmp_path, "3s")
    command = started_pid(beats)
    if stop == "group":  # the replica's whole group (Ctrl-Z in a terminal does this)
        os.killpg(daemon.pid, signal.SIGSTOP)
    else:
        os.kill(daemon.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not alive(command), timeout=30, what="the command to be killed")
        expiry = running_run(sqlite_cli, "stubborn").expires_us  # frozen: never renewed again
        assert expiry is not None
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    last = last_heartbeat_us(beats)
    assert last < expiry, f"the command was alive {(last - expiry) / 1e6:.3f}s past its lease"
    daemon.proc.send_signal(signal.SIGTERM)
    result = daemon.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    assert "reaper: SIGKILL to process group" in result.stderr, result.stderr


@pytest.mark.parametrize("supervisor", ["run", "exec"])
def test_a_killed_supervisor_has_its_command_stopped_at_once_and_its_reaper_exits(
    sqlite_cli: Cli, tmp_path: Path, supervisor: str
) -> None:
    # A 12 s lease: a grace of 2 s (a sixth of it), and a deadline far beyond it.
    if supervisor == "run":
        spawned, beats = replica(sqlite_cli, tmp_path, "12s")
    else:
        beats = tmp_path / "beats"
        spawned = sqlite_cli.spawn(
            "exec", "stubborn", "--lock-at-most", "12s", "--", "sh", "-c", STUBBORN, "sh",
            str(beats),
        )  # fmt: skip
    command = started_pid(beats)
    reaper = reaper_of(spawned.pid)

    killed_us = time.time_ns() // 1_000
    os.kill(spawned.pid, signal.SIGKILL)
    spawned.proc.wait()
    wait_for(lambda: not alive(command), timeout=30, what="the command to be killed")
    wait_for(lambda: not alive(reaper), timeout=30, what="the reaper to exit")

    if supervisor == "run":
        expiry = running_run(sqlite_cli, "stubborn").expires_us
    else:
        expiry = lease_expiry_us(sqlite_cli, "stubborn")
    assert expiry is not None
    last = last_heartbeat_us(beats)
    # SIGTERM at once, SIGKILL after the grace: long before the deadline (slack for a
    # loaded machine, far below the ~10 s that are left of the lease).
    assert last < killed_us + 2_000_000 + 3_000_000, (last - killed_us) / 1e6
    assert last < expiry


def test_an_exec_frozen_past_its_lease_has_its_command_killed_by_the_deadline(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    beats = tmp_path / "beats"
    exec_ = sqlite_cli.spawn(
        "exec", "stubborn", "--lock-at-most", "3s", "--", "sh", "-c", STUBBORN, "sh", str(beats)
    )
    command = started_pid(beats)
    os.kill(exec_.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not alive(command), timeout=30, what="the command to be killed")
        expiry = lease_expiry_us(sqlite_cli, "stubborn")  # frozen: never renewed again
    finally:
        os.kill(exec_.pid, signal.SIGCONT)
    last = last_heartbeat_us(beats)
    assert last < expiry, f"the command was alive {(last - expiry) / 1e6:.3f}s past its lease"
    result = exec_.wait(timeout=30)
    assert result.returncode == 76, result.stderr  # the lease was lost
    assert "reaper: SIGKILL to process group" in result.stderr, result.stderr


@pytest.mark.parametrize("supervisor", ["exec", "run"])
def test_the_reaper_exits_with_its_supervisor_and_is_reaped(
    sqlite_cli: Cli, tmp_path: Path, supervisor: str
) -> None:
    go, ppid = tmp_path / "go", tmp_path / "ppid"
    script = f'echo $PPID > "{ppid}"; while [ ! -e "{go}" ]; do sleep 0.02; done'
    if supervisor == "exec":
        spawned = sqlite_cli.spawn("exec", "quick", "--", "sh", "-c", script)
    else:
        jobs = tmp_path / "jobs.toml"
        jobs.write_text(
            f'[jobs.quick]\nevery = "1s"\ncommand = ["sh", "-c", {_toml(script)}]\n'
            'overlap = "skip"\n'
        )
        spawned = sqlite_cli.spawn("run", str(jobs), "--shutdown-grace", "10s")
    wait_for(lambda: ppid.exists() and ppid.read_text().endswith("\n"), timeout=30, what="run")
    assert int(ppid.read_text()) == spawned.pid  # the supervisor started the command
    reaper = reaper_of(spawned.pid)
    assert os.getsid(reaper) == reaper  # a session of its own

    if supervisor == "run":
        spawned.proc.send_signal(signal.SIGTERM)  # drains: the run ends when go appears
    go.touch()
    result = spawned.wait(timeout=30)

    assert result.returncode == 0, result.stderr
    assert proc_stat(reaper) is None, "the reaper outlived its supervisor or was not reaped"
    assert "reaper:" not in result.stderr  # it had nothing to stop


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_an_exec_whose_lease_is_renewed_runs_its_command_past_the_first_deadline(
    sqlite_cli: Cli,
) -> None:
    # A 2 s lease: its first SIGTERM point is 1.5 s after the acquire. Renewed every 0.7 s,
    # and the reaper told each new deadline before the old point, nothing stops the command.
    result = sqlite_cli.run("exec", "renewed", "--lock-at-most", "2s", "--", "sleep", "5")

    assert result.returncode == 0, result.stderr
    assert "reaper:" not in result.stderr, result.stderr
