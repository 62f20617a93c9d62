"""``fleetcron doctor`` by subprocess on every cross-process backend: a healthy deployment
exits 0, a definition that skips slots exits 1 with its ``fail`` line, an unreachable store
75, bad usage 2; Redis's settings and PgBouncer's transaction pooling are reported."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, wait_for
from pgbouncer_server import PgBouncer
from redis_server import RedisServer

HEALTHY = """\
[jobs.tick]
every = "1s"
command = ["true"]
lock_at_most = "30s"
lock_at_least = "500ms"
"""
SKIPS_SLOTS = """\
[jobs.report]
every = "1m"
command = ["true"]
lock_at_least = "1m"
"""
PERSISTENCE_WARNING = (
    'warn  redis (persistence): keeps nothing across a restart (appendonly no, save "")'
)


def lines(result: subprocess.CompletedProcess[str], level: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(f"{level} ")]


def jobs_file(cli: Cli, text: str) -> str:
    path = cli.workdir / "jobs.toml"
    path.write_text(text)
    return str(path)


@CROSS_PROCESS_BACKENDS
def test_doctor_exits_0_for_a_healthy_deployment_with_a_replica_up(cli: Cli) -> None:
    jobs = jobs_file(cli, HEALTHY)
    cli.spawn("run", jobs)

    def replica_up() -> subprocess.CompletedProcess[str] | None:
        result = cli.run("doctor", jobs)
        return result if "ok    replicas: 1 up" in result.stdout else None

    result = wait_for(replica_up, timeout=20, what="doctor to see the replica")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not lines(result, "fail"), result.stdout
    assert "ok    schema: " in result.stdout
    assert "ok    clock: this host's clock" in result.stdout
    assert f"ok    namespace: '{cli.namespace}'" in result.stdout
    assert "ok    job tick (lock_at_least): 500ms, shorter than the shortest interval 1s" in (
        result.stdout
    )
    kind = {"postgresql": "postgres"}.get(scheme := cli.backend.partition(":")[0], scheme)
    assert f"ok    store: {kind} at " in result.stdout
    if kind == "redis":
        # The machine's Redis keeps nothing (scripts/services starts it that way).
        assert PERSISTENCE_WARNING in result.stdout
    else:
        assert lines(result, "warn") == [], result.stdout
    if kind == "postgres":
        assert "ok    postgres (pooler): none" in result.stdout


@CROSS_PROCESS_BACKENDS
def test_doctor_exits_1_with_a_fail_line_for_a_lock_at_least_that_skips_every_other_slot(
    cli: Cli,
) -> None:
    assert cli.run("migrate").returncode == 0  # the doctor never creates a store
    result = cli.run("doctor", jobs_file(cli, SKIPS_SLOTS))

    assert result.returncode == 1, result.stdout + result.stderr
    assert lines(result, "fail") == [
        "fail  job report (lock_at_least): 1m is not shorter than the shortest interval of "
        "the schedule, 1m"
    ]
    assert "Traceback" not in result.stderr
    # `fleetcron run` refuses the same file before it starts (exit 2).
    assert cli.run("run", jobs_file(cli, SKIPS_SLOTS)).returncode == 2


def test_doctor_json_has_every_finding_and_the_verdict(sqlite_cli: Cli) -> None:
    assert sqlite_cli.run("migrate").returncode == 0
    result = sqlite_cli.run("doctor", jobs_file(sqlite_cli, SKIPS_SLOTS), "--json")

    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["healthy"] is False
    assert document["namespace"] == sqlite_cli.namespace
    assert document["backend"] == "sqlite"
    assert document["counts"]["fail"] == 1
    (failure,) = [f for f in document["findings"] if f["level"] == "fail"]
    assert set(failure) == {"level", "check", "message", "advice"}
    assert failure["check"] == "job report (lock_at_least)"


def test_doctor_reports_a_store_without_schema_as_a_warning_and_does_not_create_it(
    sqlite_cli: Cli,
) -> None:
    database = sqlite3.connect(sqlite_cli.workdir / "fleetcron.db")  # a database, no schema
    database.execute("CREATE TABLE other (x)")
    database.close()
    result = sqlite_cli.run("doctor")

    assert result.returncode == 0, result.stderr
    assert lines(result, "warn") == [
        "warn  schema: not created yet; the jobs, ledger and replicas were not read"
    ]
    again = sqlite_cli.run("doctor")
    assert "not created yet" in again.stdout  # the doctor did not migrate


def test_doctor_fails_on_a_missing_sqlite_store_without_creating_it_and_checks_the_jobs(
    sqlite_cli: Cli,
) -> None:
    database = sqlite_cli.workdir / "fleetcron.db"
    result = sqlite_cli.run("doctor", jobs_file(sqlite_cli, SKIPS_SLOTS))

    assert result.returncode == 1, result.stdout + result.stderr
    assert lines(result, "fail") == [
        f"fail  store: sqlite at sqlite:///{database}: no fleetcron store at {database}: the "
        "file does not exist (start a replica or run `fleetcron migrate` to create it)",
        "fail  job report (lock_at_least): 1m is not shorter than the shortest interval of "
        "the schedule, 1m",
    ]
    assert result.stderr == ""
    assert not database.exists()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_doctor_exits_75_when_the_store_is_unreachable(namespace: str, tmp_path: Path) -> None:
    cli = Cli(f"postgresql://postgres@127.0.0.1:{_closed_port()}/test", namespace, tmp_path)
    result = cli.run("doctor")

    assert result.returncode == 75, result.stdout + result.stderr
    assert result.stderr.startswith("fleetcron: store unavailable:")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (("doctor", "missing.toml"), "jobs file not found"),
        (("doctor", "a.toml", "b.toml"), "unrecognized arguments"),
    ],
)
def test_doctor_exits_2_for_bad_usage(
    sqlite_cli: Cli, arguments: tuple[str, ...], fragment: str
) -> None:
    result = sqlite_cli.run(*arguments)

    assert result.returncode == 2, result.stdout + result.stderr
    assert fragment in result.stderr
    assert result.stdout == ""


# -- Redis settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            "ok    redis (persistence): appendonly yes, appendfsync always: keeps everything",
        ),
        (
            ["--save", "", "--appendonly", "no", "--rename-command", "CONFIG", ""],
            "warn  redis (persistence): cannot tell: CONFIG GET appendonly/save was refused",
        ),
        (
            ["--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"],
            "warn  redis (eviction): maxmemory-policy allkeys-lru",
        ),
    ],
    ids=["aof", "config-disabled", "allkeys"],
)
def test_doctor_reports_the_redis_servers_persistence_and_eviction(
    tmp_path: Path, namespace: str, options: list[str], expected: str
) -> None:
    server = RedisServer(tmp_path, options)
    try:
        result = Cli(server.url, namespace, tmp_path).run("doctor")
    finally:
        server.close()

    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout
    assert "ok    redis (replication): primary, no replicas" in result.stdout


# -- PostgreSQL behind PgBouncer -------------------------------------------------------------


@pytest.mark.parametrize(
    ("prepared", "level"), [(False, "ok"), (True, "warn")], ids=["prepared-off", "prepared-on"]
)
def test_doctor_reports_transaction_pooling_behind_pgbouncer(
    pgbouncer: PgBouncer, namespace: str, tmp_path: Path, prepared: bool, level: str
) -> None:
    """Behind PgBouncer 1.18 in transaction pooling, the default (prepared statements on) is
    a warning whose advice names the URL parameter that turns them off; with it, ok."""
    url = pgbouncer.url if prepared else pgbouncer.store_url
    result = Cli(url, namespace, tmp_path).run("doctor")

    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "postgres (pooler)" in line]
    assert line.split()[0] == level, result.stdout
    assert "transaction pooling" in line
    assert "fleetcron works behind it" in result.stdout
    assert ("add prepared_statements=off" in result.stdout) is prepared
