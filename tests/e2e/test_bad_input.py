"""Bad input: one line on stderr naming the problem, a non-zero exit, no traceback, and
nothing touched — no SQLite file created, no lease row, the command never started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.test_schema import fresh_database
from e2e.helpers import CROSS_PROCESS_BACKENDS, FLEETCRON, Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_STORE_REFUSED, EXIT_USAGE
from services import require_service

LONG_NAME = "n" * 201

EXEC_CASES = [
    (["--lock-at-most", "10x"], "'10x' is not a duration"),
    (["--lock-at-most", "0s"], "--lock-at-most must be positive"),
    (["--lock-at-most", "-5s"], "--lock-at-most must be positive, got '-5s'"),
    (["--lock-at-most=-5s"], "--lock-at-most must be positive, got '-5s'"),
    (["--lock-at-most", "50ms"], "at least 100ms"),
    (["--timeout", "0s"], "--timeout must be positive"),
    (["--timeout", "-1s"], "--timeout must be positive"),
    (["--lock-at-least", "-1s"], "--lock-at-least must not be negative"),
    (["--lock-at-least", "5m", "--lock-at-most", "1m"], "is longer than --lock-at-most"),
    (["--wait", "-1s"], "--wait must not be negative"),
    (["--wait", "soon"], "'soon' is not a duration"),
    (["--kill-grace", "-1s"], "--kill-grace must not be negative"),
    (["--kill-grace", "2m", "--lock-at-most", "1m"], "must be shorter than --lock-at-most"),
    (["--lock-at-most", "99999999999999d"], "longer than 100 years"),
    (["--lock-at-most", "1" + "0" * 400 + "s"], "longer than 100 years"),
    (["--skipped-exit-code", "300"], "between 0 and 255"),
    (["--skipped-exit-code", "abc"], "invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--lock-mode", "flock"], "invalid choice: 'flock' (choose from 'lease', 'advisory')"),
    (["--lock-mode", "advisory"], "lock mode 'advisory' needs a PostgreSQL store"),
    (
        ["--lock-mode", "advisory", "--schedule", "* * * * *"],
        "--lock-mode advisory cannot be used with --schedule",
    ),
]


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "marker"
    yield path
    assert not path.exists(), "the command ran despite the bad input"


def _exec(name: str, *options: str, marker: Path) -> list[str]:
    return ["exec", name, *options, "--", "touch", str(marker)]


@pytest.mark.parametrize(("options", "message"), EXEC_CASES, ids=[m for _, m in EXEC_CASES])
def test_bad_exec_option_is_refused_before_the_store_is_touched(
    sqlite_cli: Cli, tmp_path: Path, marker: Path, options: list[str], message: str
) -> None:
    result = sqlite_cli.run(*_exec("job", *options, marker=marker))
    assert_clean_error(result, EXIT_USAGE, message)
    assert not (tmp_path / "fleetcron.db").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["exec", "", "--", "true"], "lock name is empty"),
        (["exec", LONG_NAME, "--", "true"], "the maximum is 200"),
        (["exec", "tab\there", "--", "true"], "control character"),
        (["exec", "job", "--"], "exec needs a command after '--'"),
        (["exec", "job"], "exec needs a command after '--'"),
        (["exec", "job", "true"], "unrecognized arguments: true"),
        (["locks", "--", "extra"], "unexpected arguments after '--'"),
        (["prune", "--older-than", "-1d"], "--older-than must not be negative"),
        (["trigger", "bad\udcffname"], "job name 'bad\\udcffname' is not valid UTF-8"),
        (["pause", "tab\there"], "control character"),
        (["runs", "--limit", "-1"], "--limit must be 1 to 2147483647, got -1"),
        (
            ["runs", "--limit", "9223372036854775808"],
            "--limit must be 1 to 2147483647, got 9223372036854775808",
        ),
        (
            ["backfill", "job", "--from", "2025-01-01", "--to", "2025-01-02", "--limit", "2" * 30],
            f"--limit must be between 1 and 100000 (one backfill is written in one transaction; "
            f"split a longer range into several), got {'2' * 30}",
        ),
        (
            ["next", "* * * * *", "--after", "9999-12-31T23:50", "--timezone", "America/New_York"],
            "past the calendar's range",
        ),
        ([], "no command given"),
    ],
)
def test_bad_arguments_are_refused_before_the_store_is_touched(
    sqlite_cli: Cli, tmp_path: Path, argv: list[str], message: str
) -> None:
    result = sqlite_cli.run(*argv)
    assert_clean_error(result, EXIT_USAGE, message)
    assert not (tmp_path / "fleetcron.db").exists()


def _store_state(url: str) -> object:
    """What a refused command must leave as it was: the SQLite file's bytes (``None``: no
    file), or the fleetcron tables of the PostgreSQL database."""
    if url.startswith("sqlite://"):
        path = Path(url.removeprefix("sqlite:///"))
        return path.read_bytes() if path.exists() else None
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'fleetcron%' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("backend_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("store", ["absent", "present"])
@pytest.mark.parametrize("limit", ["9223372036854775808", "2147483648"])
def test_a_runs_limit_no_store_can_take_is_refused_before_the_store_is_opened(
    backend_url: str, namespace: str, tmp_path: Path, store: str, limit: str
) -> None:
    with fresh_database(backend_url, tmp_path) as url:
        cli = Cli(url, namespace, tmp_path)
        if store == "present":
            assert cli.run("migrate").returncode == 0
        before = _store_state(url)

        result = cli.run("runs", "--limit", limit)

        assert_clean_error(result, EXIT_USAGE, f"--limit must be 1 to 2147483647, got {limit}")
        assert _store_state(url) == before, "the store was opened"


def test_the_largest_runs_limit_is_read(sqlite_cli: Cli) -> None:
    assert sqlite_cli.run("migrate").returncode == 0
    result = sqlite_cli.run("runs", "--limit", "2147483647")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no runs in namespace")


def test_a_nul_in_a_jobs_commands_arguments_is_refused_at_load(
    sqlite_cli: Cli, tmp_path: Path, marker: Path
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[jobs.touch]\nevery = "1s"\ncommand = ["touch", "{marker}\\u0000"]\n')

    result = sqlite_cli.run("run", str(jobs), timeout=30)

    assert_clean_error(
        result,
        EXIT_USAGE,
        f"{jobs}: job 'touch': key 'command': command[1] holds a NUL character at position "
        f"{len(str(marker))}",
    )
    assert not (tmp_path / "fleetcron.db").exists()


def test_an_explicitly_empty_namespace_is_an_error(tmp_path: Path, marker: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'fleetcron.db'}", "", tmp_path)
    assert_clean_error(cli.run(*_exec("job", marker=marker)), EXIT_USAGE, "namespace is empty")
    assert not (tmp_path / "fleetcron.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:hunter2@[::1/x", "is invalid"),
        ("postgresql://u:hunter2@127.0.0.1:99999/x", "port must be a number from 1 to 65535"),
        ("ftp://u:hunter2@host/x", "scheme 'ftp' is not supported"),
        ("not-a-url", "has no scheme"),
        ("redis://", "names no host"),
        ("sqlite://", "names no database file"),
        ("sqlite:////tmp/a%00b.db", "the path contains a NUL byte"),
        ("", "backend URL is empty"),
        ("postgresql://app:hunter2/x@127.0.0.1:5999/test", "percent-encoded"),
        ("postgresql://app:hunter2#x@127.0.0.1:5999/test", "percent-encoded"),
        ("postgresql://app:hunter2@Xy9z@127.0.0.1:5999/test", "percent-encoded"),
        ("mysql://root:hunter2?x@127.0.0.1:3306/test", "percent-encoded"),
        ("redis://:hunter2/x@127.0.0.1:6379/0", "percent-encoded"),
        ("mysql://root:hunter2@127.0.0.1:3306/test?foo=bar", "unknown parameter(s) foo"),
        ("redis://:hunter2@127.0.0.1:6379/abc", "the Redis database must be a number"),
        ("redis://:hunter2@127.0.0.1:6379/0?socket_timeout=abc", "unknown parameter(s)"),
        ("rediss://:hunter2@127.0.0.1:6379/0?ssl_cert_reqs=bogus", "ssl_cert_reqs must be"),
        ("postgresql://u:hunter2@127.0.0.1:5432/test?foo=bar", "invalid URI query parameter"),
        ("postgresql://u:hunter2@127.0.0.1:5432/test?timeout=abc", "timeout must be a positive"),
        ("sqlite:////tmp/fleetcron-never.db?mode=ro", "unknown parameter(s) mode"),
        ("sqlite:///:memory:", "use memory://"),
    ],
)
def test_a_bad_backend_url_is_refused(
    namespace: str, tmp_path: Path, marker: Path, url: str, message: str
) -> None:
    result = Cli(url, namespace, tmp_path).run(*_exec("job", marker=marker))
    assert_clean_error(result, EXIT_USAGE, message)
    assert "hunter2" not in result.stderr, "the password was printed"


def test_an_unknown_log_level_is_refused(sqlite_cli: Cli, tmp_path: Path, marker: Path) -> None:
    result = sqlite_cli.run(*_exec("job", marker=marker), env={"FLEETCRON_LOG_LEVEL": "LOUD"})
    assert_clean_error(result, EXIT_USAGE, "FLEETCRON_LOG_LEVEL='LOUD' is not a level")
    assert not (tmp_path / "fleetcron.db").exists()


def test_leader_ttl_outside_leader_mode_is_refused(sqlite_cli: Cli, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.tick]\nevery = "1m"\ncommand = ["true"]\n')
    result = sqlite_cli.run("run", str(jobs), "--leader-ttl", "30s")
    assert_clean_error(result, EXIT_USAGE, "--leader-ttl applies to leader mode only")
    assert not (tmp_path / "fleetcron.db").exists()


def test_a_sqlite_path_in_a_missing_directory_is_refused(
    namespace: str, tmp_path: Path, marker: Path
) -> None:
    missing = tmp_path / "no" / "such"
    cli = Cli(f"sqlite:///{missing / 'fc.db'}", namespace, tmp_path)
    assert_clean_error(cli.run(*_exec("job", marker=marker)), EXIT_USAGE, str(missing))
    assert not missing.exists()


@CROSS_PROCESS_BACKENDS
def test_bad_input_leaves_no_lease_row_in_the_store(cli: Cli, marker: Path) -> None:
    for options in (["--lock-at-most", "10x"], ["--lock-at-least", "2m", "--lock-at-most", "1m"]):
        result = cli.run(*_exec("job", *options, marker=marker))
        assert_clean_error(result, EXIT_USAGE)
    result = cli.run(*_exec(LONG_NAME, marker=marker))
    assert_clean_error(result, EXIT_USAGE, "the maximum is 200")
    if cli.backend.startswith("sqlite://"):
        assert not Path(cli.backend.removeprefix("sqlite:///")).exists()  # not even a store
    else:
        assert cli.locks() == []


def _as_nobody() -> list[str]:
    if os.geteuid() != 0:
        return []  # permission bits already apply to us
    for tool, argv in (
        ("setpriv", ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]),
        ("runuser", ["runuser", "-u", "nobody", "--"]),
    ):
        if shutil.which(tool):
            return argv
    pytest.skip("neither setpriv nor runuser is available to drop root")


def test_a_sqlite_path_in_a_read_only_directory_is_refused(namespace: str) -> None:
    prefix = _as_nobody()
    # Not tmp_path: its parent is private to root, and the check must see *this* directory.
    base = Path(tempfile.mkdtemp(prefix="fleetcron-e2e-ro-"))
    try:
        base.chmod(0o755)
        read_only = base / "ro"
        read_only.mkdir(mode=0o555)
        read_only.chmod(0o555)
        cli = Cli(f"sqlite:///{read_only / 'fc.db'}", namespace, base)
        cli.env["HOME"] = str(base)
        marker = base / "marker"
        result = cli.run(*_exec("job", marker=marker), prefix=prefix)
        assert_clean_error(result, EXIT_USAGE, str(read_only), "not writable")
        assert not marker.exists()
        assert list(read_only.iterdir()) == []
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base)


FAKE_NFS = """
import sys
from pathlib import Path
from fleetcron.cli.main import main
from fleetcron.stores.sql import sqlite

# Pretend the test directory is an NFS mount: check_sqlite_path reads mountinfo.
sqlite.check_sqlite_path.__kwdefaults__["mountinfo"] = Path(sys.argv[1])
sys.exit(main(sys.argv[2:]))
"""


def test_a_sqlite_path_on_a_network_filesystem_is_refused(
    namespace: str, tmp_path: Path, marker: Path
) -> None:
    share = tmp_path / "share"
    share.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"98 22 0:53 / {share} rw,relatime shared:7 - nfs4 fileserver:/export rw,vers=4.2\n"
    )
    cli = Cli(f"sqlite:///{share / 'fc.db'}", namespace, tmp_path)
    argv = cli.argv(*_exec("job", marker=marker))[len(FLEETCRON) :]
    result = subprocess.run(
        [sys.executable, "-c", FAKE_NFS, str(mountinfo), *argv],
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_clean_error(result, EXIT_USAGE, "network filesystem (nfs4)", str(share / "fc.db"))
    assert list(share.iterdir()) == []


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_jobs_file_that_is_not_a_regular_file_is_refused_at_once(
    sqlite_cli: Cli, tmp_path: Path, kind: str
) -> None:
    jobs = tmp_path / "jobs.toml"
    if kind == "device":
        jobs.symlink_to("/dev/zero")  # read whole, it would take every byte of memory
    else:
        os.mkfifo(jobs)  # read, it would wait for a writer forever

    result = sqlite_cli.run("run", str(jobs), timeout=30)

    assert_clean_error(result, EXIT_USAGE, str(jobs), "not a regular file")


# -- permanent refusals get their exit status, never "try again later" (75) -----------------


@pytest.mark.parametrize("where", ["directory", "/dev/null", "/dev/zero"])
@pytest.mark.parametrize("command", ["exec", "status"])
def test_a_sqlite_path_that_is_no_regular_file_is_a_usage_error(
    namespace: str, tmp_path: Path, marker: Path, where: str, command: str
) -> None:
    path = tmp_path / "store.db" if where == "directory" else Path(where)
    if where == "directory":
        path.mkdir()
    cli = Cli(f"sqlite:///{path}", namespace, tmp_path)
    args = _exec("job", marker=marker) if command == "exec" else ["status"]
    expected = "is a directory" if where == "directory" else "is not a regular file"
    assert_clean_error(cli.run(*args), EXIT_USAGE, str(path), expected)
    if where == "directory":
        assert list(path.iterdir()) == [], "nothing was made inside"
    else:
        assert path.is_char_device()


def test_a_redis_database_number_the_server_does_not_have_is_refused(
    namespace: str, tmp_path: Path, marker: Path
) -> None:
    base = require_service("redis").rsplit("/", 1)[0]
    cli = Cli(f"{base}/99999", namespace, tmp_path)
    for args in (_exec("job", marker=marker), ["status"]):
        assert_clean_error(cli.run(*args), EXIT_STORE_REFUSED, "DB index is out of range")


@pytest.mark.parametrize("schema", ["made", "missing"])
def test_a_read_only_postgresql_database_is_refused(
    namespace: str, tmp_path: Path, marker: Path, schema: str
) -> None:
    import psycopg

    with fresh_database(require_service("postgres"), tmp_path) as url:
        cli = Cli(url, namespace, tmp_path)
        if schema == "made":
            assert cli.run("migrate").returncode == 0
        database = url.rsplit("/", 1)[1].split("?")[0]
        with psycopg.connect(require_service("postgres"), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        assert_clean_error(
            cli.run(*_exec("job", marker=marker)), EXIT_STORE_REFUSED, "read-only transaction"
        )
        jobs = tmp_path / "jobs.toml"
        jobs.write_text(f'[jobs.a]\nevery = "1s"\ncommand = ["touch", "{marker}"]\n')
        result = cli.run("run", str(jobs))
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == EXIT_STORE_REFUSED, result.stderr
        assert "read-only transaction" in result.stderr.strip().splitlines()[-1]
