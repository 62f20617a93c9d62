"""Exit statuses of ``fleetcron exec`` and how the command's process group is stopped."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from e2e.helpers import (
    CROSS_PROCESS_BACKENDS,
    Cli,
    alive,
    assert_clean_error,
    read_when_written,
    wait_for,
)
from fleetcron.cli.exitcodes import (
    EXIT_CANNOT_EXECUTE,
    EXIT_LEASE_LOST,
    EXIT_NOT_FOUND,
    EXIT_STORE_UNAVAILABLE,
    EXIT_TIMEOUT,
)
from fleetcron.stores import open_store, parse_store_url


def test_exit_status_is_the_commands_own(sqlite_cli: Cli) -> None:
    result = sqlite_cli.run("exec", "job", "--", "sh", "-c", "exit 3")
    assert result.returncode == 3
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV])
def test_a_command_killed_by_signal_n_gives_128_plus_n(
    sqlite_cli: Cli, sig: signal.Signals
) -> None:
    result = sqlite_cli.run("exec", "job", "--", "sh", "-c", f"kill -{sig.name[3:]} $$")
    assert result.returncode == 128 + sig.value, result.stderr


@pytest.mark.parametrize("command", ["no-such-command-e2e", "/nonexistent/bin/job"])
def test_a_missing_command_gives_127_and_frees_the_lease(
    sqlite_cli: Cli, tmp_path: Path, command: str
) -> None:
    result = sqlite_cli.run("exec", "job", "--", command, "arg")
    assert_clean_error(result, EXIT_NOT_FOUND, "not found", command)
    marker = tmp_path / "marker"
    again = sqlite_cli.run("exec", "job", "--", "touch", str(marker))
    assert again.returncode == 0, again.stderr
    assert marker.exists(), "the lease of the failed start was not released"


def test_a_command_that_cannot_be_executed_gives_126(sqlite_cli: Cli, tmp_path: Path) -> None:
    not_executable = tmp_path / "job.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    not_executable.chmod(0o644)
    no_format = tmp_path / "garbage"
    no_format.write_bytes(b"\x7fELF not really")
    no_format.chmod(0o755)
    for command in (str(not_executable), str(no_format), "/etc/passwd/child", str(tmp_path)):
        result = sqlite_cli.run("exec", "job", "--", command)
        assert_clean_error(result, EXIT_CANNOT_EXECUTE, "cannot be executed", command)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:pg-s3cret@127.0.0.1:1/x",
        "redis://:redis-s3cret@127.0.0.1:1/0",
        "mysql://root:my-s3cret@127.0.0.1:1/test",
    ],
)
def test_an_unreachable_store_gives_75_and_the_command_never_starts(
    namespace: str, tmp_path: Path, url: str
) -> None:
    cli = Cli(url, namespace, tmp_path)
    marker = tmp_path / "marker"
    result = cli.run("exec", "job", "--", "touch", str(marker), timeout=30)
    assert_clean_error(result, EXIT_STORE_UNAVAILABLE, "store unavailable", "127.0.0.1:1")
    assert "s3cret" not in result.stderr, "the store password was printed"
    assert not marker.exists()


# The command reports its own pid (= its process group, it leads a session) and its
# child's; it must not outlive the lease.
SH_WITH_CHILD = 'sleep 100 & echo "$$ $!" > "$1"; sleep 100; wait'
STUBBORN_WITH_CHILD = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild too
child = subprocess.Popen(["sleep", "100"])
with open(sys.argv[1], "w") as out:
    out.write(f"{os.getpid()} {child.pid}\\n")
time.sleep(100)
"""


@pytest.mark.parametrize(
    "command",
    [["sh", "-c", SH_WITH_CHILD, "sh"], [sys.executable, "-c", STUBBORN_WITH_CHILD]],
    ids=["sh-with-grandchild", "ignores-sigterm"],
)
def test_without_keepalive_the_group_is_killed_when_the_lease_ends(
    sqlite_cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    pids_file = tmp_path / "pids"
    proc = sqlite_cli.spawn(
        "exec", "job", "--no-keepalive", "--lock-at-most", "2s", "--", *command, str(pids_file)
    )
    leader, grandchild = map(int, read_when_written(pids_file).split())
    started = time.monotonic()  # the lease was taken a little earlier
    sqlite_cli.track_group(leader)

    result = proc.wait(timeout=15)
    wait_for(
        lambda: not alive(leader) and not alive(grandchild),
        timeout=0.5,
        what="the command and its grandchild to be gone",
    )
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_LEASE_LOST, result.stderr
    # Its ceiling, not a loss: nothing renews the lease, by request.
    said = r"fleetcron: job: stopped: the run reached --lock-at-most \(2s\) without keepalive "
    said += r"\(exit 1(37|43)\)"
    assert any(re.fullmatch(said, line) for line in result.stderr.splitlines()), result.stderr
    assert "lost" not in result.stderr
    assert "Traceback" not in result.stderr
    assert 1.0 < elapsed < 2.5, f"group gone after {elapsed:.2f}s for a 2s lease"


def test_a_scheduled_run_without_keepalive_is_recorded_stopped_at_its_ceiling(
    sqlite_cli: Cli,
) -> None:
    result = sqlite_cli.run(
        "exec", "ceiling", "--schedule", "* * * * *", "--no-keepalive", "--lock-at-most", "1s",
        "--", "sleep", "30",
    )  # fmt: skip

    assert result.returncode == EXIT_LEASE_LOST, result.stderr
    assert "reached --lock-at-most (1s) without keepalive" in result.stderr
    rows = json.loads(sqlite_cli.run("runs", "ceiling", "--json").stdout)
    assert [(row["state"], row["error"]) for row in rows] == [
        ("lost", "stopped: the run reached --lock-at-most (1s) without keepalive")
    ]


def test_timeout_kills_the_group_and_gives_124(sqlite_cli: Cli, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    proc = sqlite_cli.spawn(
        "exec", "job", "--timeout", "1s", "--", "sh", "-c", SH_WITH_CHILD, "sh", str(pids_file)
    )
    leader, grandchild = map(int, read_when_written(pids_file).split())
    started = time.monotonic()
    sqlite_cli.track_group(leader)

    result = proc.wait(timeout=15)
    wait_for(lambda: not alive(leader) and not alive(grandchild), timeout=0.5)
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_TIMEOUT, result.stderr
    assert "timed out" in result.stderr
    assert elapsed < 2.0, f"group gone after {elapsed:.2f}s for a 1s timeout"
    marker = tmp_path / "marker"
    assert sqlite_cli.run("exec", "job", "--", "touch", str(marker)).returncode == 0
    assert marker.exists(), "the lease was not released after the timeout"


def _store_now_us(cli: Cli) -> int:
    store = open_store(parse_store_url(cli.backend))
    try:
        return store.run(store.ops.store_now())
    finally:
        store.close()


def _lease_expiry_us(cli: Cli, name: str) -> int:
    store = open_store(parse_store_url(cli.backend))
    try:
        record = store.run(store.ops.lease_get(cli.namespace, name))
    finally:
        store.close()
    assert record is not None
    return record.expires_us


@CROSS_PROCESS_BACKENDS
@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "no-keepalive"])
@pytest.mark.parametrize("ledger", [False, True], ids=["lock", "schedule"])
def test_exec_paused_past_its_lease_exits_76_even_when_the_command_succeeded(
    cli: Cli, tmp_path: Path, ledger: bool, keepalive: bool
) -> None:
    # Without keepalive nothing else in the process can notice the expiry first: the exit
    # status alone must say that the lease was lost.
    started, go, done = tmp_path / "started", tmp_path / "go", tmp_path / "done"
    script = (
        f'echo started > "{started}"; while [ ! -e "{go}" ]; do sleep 0.02; done; '
        f'echo ok > "{done}"'
    )
    options = ["--schedule", "* * * * *"] if ledger else []
    options += [] if keepalive else ["--no-keepalive"]
    exec_ = cli.spawn("exec", "paused", *options, "--lock-at-most", "1s", "--", "sh", "-c", script)
    read_when_written(started, timeout=30)
    exec_.proc.send_signal(signal.SIGSTOP)  # fleetcron exec, not the command's own group
    try:
        go.touch()
        read_when_written(done, timeout=30)  # the command succeeded while exec was paused
        # Nothing renews while exec is paused (a renewal already sent may still land, so
        # the expiry is read again each time): wait for it by the store's clock.
        expiry = _run_expiry_us if ledger else _lease_expiry_us
        wait_for(
            lambda: _store_now_us(cli) > expiry(cli, "paused"),
            timeout=30,
            what="the lease to expire in the store",
        )
    finally:
        exec_.proc.send_signal(signal.SIGCONT)
    result = exec_.wait(timeout=30)

    assert result.returncode == EXIT_LEASE_LOST, result.stderr
    assert "Traceback" not in result.stderr


def _run_expiry_us(cli: Cli, job: str) -> int:
    store = open_store(parse_store_url(cli.backend))
    try:
        rows = store.run(store.ops.run_list(cli.namespace, job, 1))
    finally:
        store.close()
    assert rows
    assert rows[0].expires_us is not None
    return rows[0].expires_us
