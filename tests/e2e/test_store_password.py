"""The store's password, end to end: a job can read it from its parent's command line when
``--backend`` carries it, so that is warned about and a file can carry the URL instead;
whatever the job prints or fails with is stored and echoed with the password masked.

PostgreSQL here trusts local connections, so it accepts whatever password the URL holds.
"""

from __future__ import annotations

import json
import signal
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import Cli, assert_clean_error, wait_for
from fleetcron.cli.exitcodes import EXIT_USAGE
from fleetcron.models import RunRecord
from fleetcron.stores import open_store, parse_store_url
from services import require_service

PASSWORD = "S3cretPassw0rd"
MASK = "***"
# What the black-box test ran: the parent's argv, then the password itself (read from a
# file: the job's own arguments are in its parent's argv too, and must not hold it).
SHOW_PARENT = (
    'tr "\\0" " " < /proc/$PPID/cmdline; echo; echo "file=${FLEETCRON_BACKEND_FILE-unset}"; '
    'cat "$1"'
)
WARNING = "holds a password and is on the command line"


@pytest.fixture
def secret_url() -> tuple[str, str]:
    """A PostgreSQL URL with a password in it, and the password."""
    parts = urllib.parse.urlsplit(require_service("postgres"))
    if parts.password:  # a service that checks passwords: use its own
        return parts.geturl(), urllib.parse.unquote(parts.password)
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), PASSWORD


def _job_command(tmp_path: Path, password: str) -> list[str]:
    printed = tmp_path / "printed"
    printed.write_text(f"{password}\n")
    return ["sh", "-c", SHOW_PARENT, "sh", str(printed)]


def _runs(url: str, namespace: str, job: str) -> list[RunRecord]:
    """The ledger's rows, read through the store (``runs --json`` shows no output)."""
    store = open_store(parse_store_url(url))
    try:
        return list(store.run(store.ops.run_list(namespace, job, 100)))
    finally:
        store.close()


def _runs_json(cli: Cli, job: str, *scope: str) -> list[dict[str, Any]]:
    result = cli.run(*scope, "runs", job, "--json", flags=not scope)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


# -- fleetcron exec --schedule ------------------------------------------------------------
def test_exec_with_the_password_on_the_command_line_warns_and_stores_none_of_it(
    secret_url: tuple[str, str], namespace: str, tmp_path: Path
) -> None:
    url, password = secret_url
    cli = Cli(url, namespace, tmp_path)
    command = _job_command(tmp_path, password)
    result = cli.run("exec", "leaky", "--schedule", "* * * * *", "--", *command, timeout=60)
    assert result.returncode == 0, result.stderr

    # The hazard the warning is about: the command's parent is this `fleetcron exec`,
    # and its argv, which any process on the host can read, holds the password.
    parent_argv = result.stdout.splitlines()[0]
    assert " exec leaky --schedule " in parent_argv
    assert f"--backend {url} " in parent_argv
    assert result.stdout.splitlines()[1:] == ["file=unset", password]
    (warning,) = result.stderr.splitlines()
    assert WARNING in warning
    assert "$FLEETCRON_BACKEND" in warning
    assert "--backend-file" in warning
    assert password not in result.stderr

    (row,) = _runs(url, namespace, "leaky")
    assert row.state == "succeeded"
    assert password not in f"{row.error} {row.output}"
    shown = _runs_json(cli, "leaky")
    assert [item["state"] for item in shown] == ["succeeded"]
    assert password not in json.dumps(shown)


@pytest.mark.parametrize("how", ["--backend-file", "FLEETCRON_BACKEND_FILE"])
def test_exec_with_the_url_in_a_file_keeps_the_password_off_the_command_line(
    secret_url: tuple[str, str], namespace: str, tmp_path: Path, how: str
) -> None:
    url, password = secret_url
    backend_file = tmp_path / "backend-url"
    backend_file.write_text(f"{url}\n")
    backend_file.chmod(0o600)
    cli = Cli(url, namespace, tmp_path)
    scope = ["--namespace", namespace]
    env = {}
    if how == "--backend-file":
        scope += ["--backend-file", str(backend_file)]
    else:
        env["FLEETCRON_BACKEND_FILE"] = str(backend_file)
    result = cli.run(
        *scope,
        "exec",
        "careful",
        "--schedule",
        "* * * * *",
        "--",
        *_job_command(tmp_path, password),
        flags=False,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warning: nothing secret on the command line

    parent_argv, file_variable, printed = result.stdout.splitlines()
    assert " exec careful --schedule " in parent_argv
    assert password not in parent_argv
    assert file_variable == "file=unset"  # the command does not learn where the file is
    assert printed == password  # (the job printed it itself: its own output, not stored)
    (row,) = _runs(url, namespace, "careful")
    assert row.state == "succeeded"
    assert password not in f"{row.error} {row.output}"


# -- fleetcron run ------------------------------------------------------------------------
@pytest.mark.slow
def test_the_daemon_stores_and_echoes_a_jobs_output_with_the_password_masked(
    secret_url: tuple[str, str], namespace: str, tmp_path: Path
) -> None:
    url, password = secret_url
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f'[jobs.leaky]\nevery = "1s"\ncommand = {json.dumps(_job_command(tmp_path, password))}\n'
    )
    cli = Cli(url, namespace, tmp_path)
    daemon = cli.spawn("run", str(jobs))

    def finished() -> list[RunRecord]:
        return [row for row in _runs(url, namespace, "leaky") if row.state == "succeeded"]

    rows = wait_for(finished, timeout=30, what="a run of the job to succeed")
    daemon.proc.send_signal(signal.SIGTERM)
    result = daemon.wait(timeout=30)
    assert result.returncode == 0, result.stderr

    output = rows[0].output
    assert output is not None
    # The command's parent is the daemon; its argv shows with the URL masked.
    parent_argv, file_variable, printed = output.splitlines()
    assert f" --backend {MASK} --namespace {namespace} run {jobs}" in parent_argv
    assert (file_variable, printed) == ("file=unset", MASK)
    assert all(
        password not in f"{row.output} {row.error}" for row in _runs(url, namespace, "leaky")
    )
    assert password not in json.dumps(_runs_json(cli, "leaky"))

    echoed = [line for line in result.stdout.splitlines() if line.startswith("[leaky] ")]
    assert f"[leaky] {MASK}" in echoed
    assert password not in result.stdout
    assert password not in result.stderr
    assert len([line for line in result.stderr.splitlines() if WARNING in line]) == 1


# -- bad backend files ----------------------------------------------------------------------
def _missing(tmp_path: Path) -> Path:
    return tmp_path / "no-such-file"


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").write_text("")
    return tmp_path / "empty"


def _too_large(tmp_path: Path) -> Path:
    (tmp_path / "large").write_text("sqlite:////tmp/x.db" + " " * 70_000)
    return tmp_path / "large"


def _bare_password(tmp_path: Path) -> Path:
    (tmp_path / "password").write_text(f"{PASSWORD}\n")
    return tmp_path / "password"


def _directory(tmp_path: Path) -> Path:
    (tmp_path / "directory").mkdir()
    return tmp_path / "directory"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_missing, "does not exist"),
        (_empty, "is empty"),
        (_too_large, "larger than 64 KiB"),
        (_bare_password, "the first line is not a backend URL"),
        (_directory, "is not a regular file"),
    ],
)
@pytest.mark.parametrize("how", ["--backend-file", "FLEETCRON_BACKEND_FILE"])
def test_a_bad_backend_file_exits_2_naming_it_and_touches_nothing(
    namespace: str, tmp_path: Path, make: Any, problem: str, how: str
) -> None:
    path = str(make(tmp_path))
    marker = tmp_path / "ran"
    cli = Cli("unused", namespace, tmp_path)
    scope = ["--backend-file", path] if how == "--backend-file" else []
    result = cli.run(
        *scope,
        "--namespace",
        namespace,
        "exec",
        "job",
        "--",
        "touch",
        str(marker),
        flags=False,
        env={"FLEETCRON_BACKEND_FILE": path} if how != "--backend-file" else None,
    )
    source = "--backend-file" if how == "--backend-file" else "$FLEETCRON_BACKEND_FILE"
    assert_clean_error(result, EXIT_USAGE, f"backend file {path!r} (from {source})", problem)
    assert PASSWORD not in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "xdg-state").exists(), "the default store was created"


def test_backend_beats_backend_file_which_beats_the_environment(
    namespace: str, tmp_path: Path
) -> None:
    def store(name: str) -> str:
        return f"sqlite:///{tmp_path / name}"

    backend_file = tmp_path / "backend-url"
    backend_file.write_text(store("from-file.db") + "\n")
    backend_file.chmod(0o600)
    cli = Cli("unused", namespace, tmp_path)
    env = {"FLEETCRON_BACKEND": store("from-env.db")}

    from_file = cli.run("--backend-file", str(backend_file), "migrate", flags=False, env=env)
    assert from_file.returncode == 0, from_file.stderr
    assert f"to {store('from-file.db')}" in from_file.stdout
    explicit = cli.run(
        "--backend",
        store("explicit.db"),
        "--backend-file",
        str(tmp_path / "never-read"),
        "migrate",
        flags=False,
        env=env,
    )
    assert explicit.returncode == 0, explicit.stderr
    assert f"to {store('explicit.db')}" in explicit.stdout
    assert not (tmp_path / "from-env.db").exists()
