"""Fixtures of the security suite: an open store of every backend, ``fleetcron`` runners
and background processes that are cleaned up, and stores whose URL carries a password.

PostgreSQL here trusts local connections, so it accepts whatever password a URL holds;
Redis gets a server of the test's own with ``requirepass`` set, so its password is really
checked; the MariaDB root has no password, so a URL with one is refused — which is what the
tests of error messages use it for.
"""

from __future__ import annotations

import logging
import os
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from e2e.helpers import Cli
from fleetcron.cli.main import main
from fleetcron.stores import SyncStore, open_store, parse_store_url
from redis_server import RedisServer
from security.secret_support import PASSWORD, Ran, RunCli, SecretRedis, Spawn, with_password
from services import require_service


@pytest.fixture
def store(backend_url: str) -> Iterator[SyncStore]:
    """A connected sync store of the backend under test."""
    opened = open_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def make_cli(tmp_path: Path) -> Iterator[Callable[[str, str], Cli]]:
    """``make_cli(backend, namespace)``: a ``Cli`` whose processes are killed at teardown."""
    made: list[Cli] = []

    def make(backend: str, namespace: str) -> Cli:
        cli = Cli(backend, namespace, tmp_path)
        made.append(cli)
        return cli

    yield make
    for cli in made:
        cli.cleanup()


@pytest.fixture
def postgres_secret_url() -> str:
    """The PostgreSQL service's URL with the password in it (trust: accepted)."""
    url = require_service("postgres")
    if urllib.parse.urlsplit(url).password:
        pytest.skip("the PostgreSQL service checks passwords: these tests bring their own")
    return with_password(url)


@pytest.fixture
def redis_secret(tmp_path: Path) -> Iterator[SecretRedis]:
    """A Redis server of the test's own whose ``requirepass`` is the password."""
    require_service("redis")  # the machine runs Redis, so redis-server is installed
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory, ["--save", "", "--appendonly", "no"])
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        client.config_set("requirepass", PASSWORD)
        client.close()
        wrong = with_password(server.url, PASSWORD.replace("Wd9", "Xx1"))
        yield SecretRedis(server=server, url=with_password(server.url), wrong_url=wrong)
    finally:
        server.close()


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    """This process's environment without any ``FLEETCRON_*`` variable, with a state
    directory of the test's own (never the user's default store)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCRON_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg-state")
    return env


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(argv, env=…, name=…)``: a background process in ``tmp_path`` whose output
    goes to ``<name>.out`` and ``<name>.err`` there; killed at teardown if still running."""
    started: list[subprocess.Popen[str]] = []

    def start(argv: list[str], *, env: dict[str, str], name: str) -> subprocess.Popen[str]:
        out_path, err_path = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with out_path.open("w") as out, err_path.open("w") as err:
            proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=out, stderr=err, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def run_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunCli]:
    """``run_cli(url, *argv, env=None)``: the CLI's ``main`` run in this process (the very
    code of ``fleetcron ARGV``, without a new interpreter) with ``FLEETCRON_BACKEND=url``;
    the exit status and what it printed. Its logging set-up is undone afterwards."""
    logger = logging.getLogger("fleetcron")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    for name in [name for name in os.environ if name.startswith("FLEETCRON_")]:
        monkeypatch.delenv(name)

    def run(url: str, *argv: str, env: dict[str, str] | None = None) -> Ran:
        capsys.readouterr()
        with monkeypatch.context() as patch:
            patch.setenv("FLEETCRON_BACKEND", url)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            try:
                status = main(list(argv))
            except SystemExit as exc:  # argparse refusing the arguments
                status = exc.code if isinstance(exc.code, int) else 2
        out, err = capsys.readouterr()
        return Ran(argv=argv, status=status, stdout=out, stderr=err)

    yield run
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]
