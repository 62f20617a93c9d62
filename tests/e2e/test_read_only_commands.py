"""Commands that only read a store, on a mistyped store or namespace: one ``fleetcron:``
line and a non-zero exit — never an answer read from an empty store made for the occasion.

``status --check`` with no job to judge fails (exit 2, as for a job the store does not
know); ``status``, ``runs``, ``locks``, ``web`` and the commands that change only rows that
must be there (``pause``, ``trigger``, ``prune``…) create no SQLite file or directory, no
table and no Redis key: a store that is not there is exit 78, naming it.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import redis

from contract.test_schema import fresh_database
from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error, wait_for
from fleetcron.cli.exitcodes import EXIT_STORE_REFUSED, EXIT_USAGE
from redis_server import RedisServer

# Each command that reads the store (or changes only rows that must already be there).
READERS = [
    ("status",),
    ("status", "--check"),
    ("status", "--json"),
    ("runs",),
    ("runs", "beat", "--json"),
    ("locks",),
    ("locks", "--json"),
    ("web", "--listen", "127.0.0.1:0"),
    ("pause", "beat"),
    ("trigger", "beat"),
    ("backfill", "beat", "--from", "2026-01-01T00:00", "--to", "2026-01-01T01:00"),
    ("prune", "--dry-run"),
    ("prune", "--runs"),
    ("cancel", "beat"),
]
IDS = [" ".join(argv[:2]) for argv in READERS]
# Against a database: one of each way in (the status read, the ledger, the leases, the
# dashboard's async store, a change of a job's row, a prune).
DATABASE_READERS = [READERS[i] for i in (1, 3, 6, 7, 8, 11)]


def _run(cli: Cli, *argv: str) -> subprocess.CompletedProcess[str]:
    # A dashboard that started serving would never end: bounded, so the test fails instead.
    return cli.run(*argv, timeout=20)


@CROSS_PROCESS_BACKENDS
def test_status_check_fails_on_a_namespace_with_no_job_to_judge(cli: Cli) -> None:
    assert cli.run("exec", "beat", "--schedule", "* * * * *", "--", "true").returncode == 0
    assert cli.run("status", "--check").returncode == 0
    typo = Cli(cli.backend, cli.namespace[:-1], cli.workdir)  # one character short

    for argv, fragment in [
        (("status", "--check"), f"no jobs in namespace {typo.namespace!r} for --check to judge"),
        (("status",), f"namespace {typo.namespace!r} holds nothing"),
        (("status", "--json"), f"namespace {typo.namespace!r} holds nothing"),
        (("status", "--check", "beat"), f"no job named beat in namespace {typo.namespace!r}"),
    ]:
        result = typo.run(*argv)
        assert_clean_error(result, EXIT_USAGE, fragment, f"did you mean {cli.namespace!r}")
        assert result.stdout == ""


@pytest.mark.parametrize("argv", READERS, ids=IDS)
def test_a_command_that_only_reads_creates_no_sqlite_store(
    namespace: str, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    typo = tmp_path / "prd.db"
    result = _run(Cli(f"sqlite:///{typo}", namespace, tmp_path), *argv)

    assert_clean_error(
        result,
        EXIT_STORE_REFUSED,
        f"no fleetcron store at {typo}: the file does not exist",
        "fleetcron migrate",
    )
    assert list(tmp_path.iterdir()) == []


def test_status_check_on_a_sqlite_path_in_a_missing_directory_creates_nothing(
    namespace: str, tmp_path: Path
) -> None:
    typo = tmp_path / "stat" / "fleetcron.db"
    result = Cli(f"sqlite:///{typo}", namespace, tmp_path).run("status", "--check")

    assert_clean_error(
        result, EXIT_STORE_REFUSED, f"no fleetcron store at {typo}: its directory {typo.parent}"
    )
    assert list(tmp_path.iterdir()) == []


def _tables(url: str, kind: str) -> list[str]:
    """The fleetcron tables of the database at ``url``."""
    if kind == "postgres":
        import psycopg

        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'fleetcron%'"
            ).fetchall()
        return [str(row[0]) for row in rows]
    import pymysql

    from fleetcron.stores import parse_store_url
    from fleetcron.stores.sql.mysql import connect_args

    args = connect_args(parse_store_url(url))
    args.pop("init_command", None)
    my = pymysql.connect(**args)
    try:
        with my.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name LIKE 'fleetcron%'"
            )
            return [str(row[0]) for row in cur.fetchall()]
    finally:
        my.close()


@pytest.mark.parametrize("backend_url", ["postgres", "mysql"], indirect=True)
def test_commands_that_only_read_create_no_table_in_an_empty_database(
    backend_url: str, namespace: str, tmp_path: Path
) -> None:
    kind = "postgres" if backend_url.startswith("postgres") else "mysql"
    with fresh_database(backend_url, tmp_path) as url:
        cli = Cli(url, namespace, tmp_path)
        for argv in DATABASE_READERS:
            result = _run(cli, *argv)
            assert_clean_error(
                result, EXIT_STORE_REFUSED, "no fleetcron store in ", "has no fleetcron tables"
            )
        doctor = cli.run("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "warn  schema: not created yet" in doctor.stdout

        assert _tables(url, kind) == []


def test_commands_that_only_read_write_nothing_to_redis(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, ["--save", "", "--appendonly", "yes"])  # no warning
    try:
        cli = Cli(server.url, f"t-{uuid.uuid4().hex[:12]}", tmp_path)
        for argv in [("runs",), ("locks", "--json"), ("prune", "--dry-run"), ("doctor",)]:
            result = cli.run(*argv)
            assert result.returncode == 0, (argv, result.stderr)
        web = cli.spawn("web", "--listen", "127.0.0.1:0")
        log = tmp_path / "spawned-1.err"
        wait_for(lambda: "dashboard of namespace" in log.read_text(), timeout=20, what="web")
        web.proc.send_signal(signal.SIGTERM)
        assert web.wait(timeout=20).returncode == 0
        checked = cli.run("status", "--check")

        with redis.Redis.from_url(server.url) as client:
            assert client.keys() == []
        assert_clean_error(checked, EXIT_USAGE, "no jobs in namespace")
    finally:
        server.close()
