"""PgBouncer of a test's own, in transaction pooling mode in front of the test PostgreSQL
(Debian's ``pgbouncer``, installed by scripts/test): the ``pgbouncer`` fixture."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from services import require_service

__all__ = ["pgbouncer"]


def _spare_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _wait(condition: Callable[[], bool], timeout: float) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            pytest.fail(f"pgbouncer did not answer within {timeout:g} s")
        time.sleep(0.05)  # polling for the server to accept connections, bounded above


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer",) if os.access(path, os.X_OK)), None
    )
    if found is None:
        message = "pgbouncer is not installed (scripts/test installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture
def pgbouncer(tmp_path: Path) -> Iterator[str]:
    """PgBouncer on a spare port, transaction pooling, in front of the test PostgreSQL; its
    URL. Run in the foreground by the test (no pid file: the test owns the process), as
    ``nobody`` when the tests run as root, which PgBouncer refuses to run as."""
    binary = _pgbouncer_binary()
    target = psycopg.conninfo.conninfo_to_dict(require_service("postgres"))
    port = _spare_port()
    (tmp_path / "users.txt").write_text(f'"{target.get("user", "postgres")}" ""\n')
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        f"""\
[databases]
* = host={target.get("host", "127.0.0.1")} port={target.get("port", 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {tmp_path / "users.txt"}
pool_mode = transaction
"""
    )
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    with (tmp_path / "pgbouncer.log").open("w") as log:
        process = subprocess.Popen([binary, *as_user, str(config)], stdout=log, stderr=log)
    url = f"postgresql://{target.get('user', 'postgres')}@127.0.0.1:{port}/{target['dbname']}"

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"pgbouncer exited: {(tmp_path / 'pgbouncer.log').read_text()}")
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    try:
        _wait(answers, 20)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
