"""PgBouncer of a test's own, in transaction pooling mode in front of the test PostgreSQL
(Debian's ``pgbouncer``, installed by scripts/test): the ``pgbouncer`` fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from ports import spare_port
from services import require_service

__all__ = ["PgBouncer", "pgbouncer"]


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


class PgBouncer:
    """A running PgBouncer of the caller's own: :attr:`url` (for psycopg),
    :attr:`store_url` (for fleetcron) and :meth:`stop`."""

    def __init__(self, directory: Path, target_url: str, pool_mode: str = "transaction") -> None:
        """Start PgBouncer on a spare port in ``pool_mode`` in front of ``target_url``,
        its files in ``directory``; return once it answers. Run in the foreground (no pid
        file: the caller owns the process), as ``nobody`` when the tests run as root, which
        PgBouncer refuses to run as."""
        binary = _pgbouncer_binary()
        target = psycopg.conninfo.conninfo_to_dict(target_url)
        user = target.get("user", "postgres")
        port = spare_port()
        (directory / "users.txt").write_text(f'"{user}" ""\n')
        config = directory / "pgbouncer.ini"
        config.write_text(
            f"""\
[databases]
* = host={target.get("host", "127.0.0.1")} port={target.get("port", 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = {pool_mode}
"""
        )
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        log_path = directory / "pgbouncer.log"
        with log_path.open("w") as log:
            self._process = subprocess.Popen(
                [binary, *as_user, str(config)], stdout=log, stderr=log
            )
        self.url = f"postgresql://{user}@127.0.0.1:{port}/{target['dbname']}"
        # PgBouncer 1.18 (Debian's) cannot carry a prepared statement to the next server
        # connection in transaction pooling: the backend URL turns them off, as the docs say.
        self.store_url = (
            f"{self.url}?prepared_statements=off" if pool_mode == "transaction" else self.url
        )

        def answers() -> bool:
            if self._process.poll() is not None:
                pytest.fail(f"pgbouncer exited: {log_path.read_text()}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
            except psycopg.OperationalError:
                return False
            return True

        try:
            _wait(answers, 20)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop it and wait for it to exit."""
        self._process.terminate()
        self._process.wait(timeout=10)


@pytest.fixture
def pgbouncer(tmp_path: Path) -> Iterator[PgBouncer]:
    """PgBouncer on a spare port, transaction pooling, in front of the test PostgreSQL."""
    bouncer = PgBouncer(tmp_path, require_service("postgres"))
    try:
        yield bouncer
    finally:
        bouncer.stop()
