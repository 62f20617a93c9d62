"""Signals sent to ``fleetcron exec`` reach the command; refused credentials are not 'retry'."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from e2e.helpers import Cli, read_when_written, wait_for
from fleetcron.cli.exitcodes import EXIT_STORE_REFUSED
from services import STORES, require_service

TRAP_TERM = """
import os, signal, sys, time
marker = sys.argv[1]
def on_term(signum, frame):
    with open(marker + ".term", "w") as f:
        f.write("got SIGTERM\\n")
    sys.exit(42)
signal.signal(signal.SIGTERM, on_term)
with open(marker, "w") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(60)
"""


def test_sigterm_to_exec_is_forwarded_to_the_command_and_its_status_is_returned(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    marker = tmp_path / "child"
    exec_ = sqlite_cli.spawn("exec", "graceful", "--", sys.executable, "-c", TRAP_TERM, str(marker))
    child_pid = int(read_when_written(marker))
    sqlite_cli.track_group(os.getpgid(child_pid))

    os.kill(exec_.pid, signal.SIGTERM)
    result = exec_.wait(timeout=20)

    assert (tmp_path / "child.term").read_text() == "got SIGTERM\n"
    assert result.returncode == 42, result.stderr
    # The lease was released on the way out: the next run takes it at once.
    assert wait_for(lambda: sqlite_cli.held("graceful") is None, timeout=5)
    assert sqlite_cli.run("exec", "graceful", "--", "true").returncode == 0


def _refusing_url(kind: str, tmp_path: Path) -> str:
    """A URL the backend refuses: an unknown user, no such database, not a database."""
    if kind == "sqlite":
        garbage = tmp_path / "not-a-database.db"
        garbage.write_bytes(b"this is not a database " * 200)
        return f"sqlite:///{garbage}"
    url = require_service(kind)
    if kind == "postgres":
        return url.replace("postgres@", "fleetcron_no_such_user:wrong@")
    if kind == "mysql":
        return url.replace("root@", "fleetcron_no_such_user:wrong@")
    return url.replace("redis://", "redis://fleetcron_no_such_user:wrong@")


@pytest.mark.parametrize("kind", STORES)
def test_a_store_that_refuses_the_client_exits_78_on_every_backend(
    kind: str, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(_refusing_url(kind, tmp_path), namespace, tmp_path)
    try:
        result = cli.run("exec", "job", "--", "touch", str(tmp_path / "ran"))
    finally:
        cli.cleanup()

    assert result.returncode == EXIT_STORE_REFUSED, result.stderr
    assert result.stderr.startswith("fleetcron: store refused: cannot connect"), result.stderr
    assert "wrong" not in result.stderr  # the password is never printed
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()
