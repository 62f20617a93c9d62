"""What the command of ``fleetcron exec`` sees: its environment and its argv."""

from __future__ import annotations

import json
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import Cli
from services import require_service

DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
DUMP_ARGV = "import json, sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"


def _env_of_run(cli: Cli, name: str, out: Path, **kwargs: Any) -> dict[str, str]:
    result = cli.run("exec", name, "--", sys.executable, "-c", DUMP_ENV, str(out), **kwargs)
    assert result.returncode == 0, result.stderr
    env: dict[str, str] = json.loads(out.read_text())
    return env


def test_command_gets_job_fence_and_run_id(sqlite_cli: Cli, tmp_path: Path) -> None:
    first = _env_of_run(sqlite_cli, "invoice-export", tmp_path / "1.json")
    second = _env_of_run(sqlite_cli, "invoice-export", tmp_path / "2.json")

    for env in (first, second):
        assert env["FLEETCRON_JOB"] == "invoice-export"
        assert env["FLEETCRON_NAMESPACE"] == sqlite_cli.namespace
        assert int(env["FLEETCRON_FENCE"]) > 0
        uuid.UUID(env["FLEETCRON_RUN_ID"])
    assert int(second["FLEETCRON_FENCE"]) > int(first["FLEETCRON_FENCE"])
    assert second["FLEETCRON_RUN_ID"] != first["FLEETCRON_RUN_ID"]


def test_command_does_not_get_the_store_url_or_credential_variables(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    backend = sqlite_cli.backend
    env = _env_of_run(
        sqlite_cli,
        "job",
        tmp_path / "env.json",
        flags=False,  # backend and namespace from the environment this time
        env={
            "FLEETCRON_BACKEND": backend,
            "FLEETCRON_NAMESPACE": sqlite_cli.namespace,
            "APP_STORE_URL": backend,  # an unrelated name holding the store URL
            "LOG_CONTEXT": f"store={backend};level=debug",
            "PGPASSWORD": "pg-secret",
            "MYSQL_PWD": "mysql-secret",
            "REDISCLI_AUTH": "redis-secret",
            "KEEP_ME": "kept",
        },
    )
    for removed in (
        "FLEETCRON_BACKEND",
        "APP_STORE_URL",
        "LOG_CONTEXT",
        "PGPASSWORD",
        "MYSQL_PWD",
        "REDISCLI_AUTH",
    ):
        assert removed not in env, removed
    assert env["KEEP_ME"] == "kept"
    assert env["FLEETCRON_NAMESPACE"] == sqlite_cli.namespace
    assert not any(backend in value for value in env.values())


def _with_password(url: str, password: str, *, in_query: bool) -> str:
    parts = urllib.parse.urlsplit(url)
    if in_query:
        query = urllib.parse.urlencode([("password", password)])
        return urllib.parse.urlunsplit(parts._replace(query=query))
    user = parts.username or ""
    netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize("in_query", [False, True], ids=["userinfo", "query"])
def test_no_variable_holding_the_store_password_reaches_the_command(
    namespace: str, tmp_path: Path, in_query: bool
) -> None:
    # PostgreSQL here trusts local connections, so it ignores the password we add.
    password = "e2e-Pw/7f3a"
    url = _with_password(require_service("postgres"), password, in_query=in_query)
    cli = Cli(url, namespace, tmp_path)
    env = _env_of_run(
        cli,
        "job",
        tmp_path / "env.json",
        env={"AUTH_HEADER": f"Basic {password}", "UNRELATED": "hello"},
    )
    assert "AUTH_HEADER" not in env
    assert env["UNRELATED"] == "hello"
    assert not any(password in value for value in env.values())


def test_command_runs_as_argv_never_through_a_shell(sqlite_cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    arguments = ["$HOME;echo x", "*", "a b", "'quoted'", "$(touch pwned)", "`id`", "", "--"]
    result = sqlite_cli.run(
        "exec", "argv", "--", sys.executable, "-c", DUMP_ARGV, str(out), *arguments
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == arguments
    assert not (tmp_path / "pwned").exists()
