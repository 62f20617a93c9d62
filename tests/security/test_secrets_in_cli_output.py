"""The store's password and the holders' secret tokens never reach what the CLI shows.

With a backend URL holding a password — PostgreSQL (trust: any password is accepted) and
a Redis server of the test's own that requires it — and a held lease, the leader lease and
a running run whose holders carry known tokens:

- ``status``, ``locks``, ``runs`` and ``doctor``, as tables and ``--json``, and their
  ``--log-format json -v`` logs, hold neither the password (in any encoding) nor a token;
- ``trigger``, ``pause`` and ``resume`` log without either; ``fleetcron exec --schedule``
  (the real command, in a process of its own) logs without either, and the command it
  runs gets no ``FLEETCRON_BACKEND``, ``FLEETCRON_WEB_TOKEN``, ``PGPASSWORD``… and no
  variable whose value holds the password or the URL;
- a store that refuses (a wrong password, an unknown database) or cannot be reached gives
  an error that names it with the password masked — in the CLI's message, its JSON logs,
  ``doctor --json``, and the Python exception with its whole chain of causes.

The read-only commands run in this process (``fleetcron.cli.main.main``: the code of the
command, without the second of a new interpreter each); ``exec`` runs as a process.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from e2e.helpers import Cli
from fleetcron import Fleet, FleetcronError
from fleetcron.stores import open_store, parse_store_url
from security.secret_support import (
    DUMP_ENV,
    Ran,
    RunCli,
    SecretRedis,
    assert_clean_environment,
    assert_no_secret,
    holder_tokens,
    plant,
    secret_variables,
    with_password,
)
from services import require_service

JSON_LOGS = ("--log-format", "json", "-v")
READS = [
    ("status",),
    (*JSON_LOGS, "status", "--json"),
    (*JSON_LOGS, "locks"),
    ("locks", "--json"),
    ("runs",),
    (*JSON_LOGS, "runs", "--json"),
    ("doctor",),
    (*JSON_LOGS, "doctor", "--json"),
]


def _secret_url(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "postgres":
        url: str = request.getfixturevalue("postgres_secret_url")
        return url
    secret: SecretRedis = request.getfixturevalue("redis_secret")
    return secret.url


def _json_lines(stderr: str) -> None:
    """Each log line is one JSON object; the last may be the CLI's one-line error."""
    for line in stderr.splitlines():
        if not line.startswith("fleetcron: "):
            json.loads(line)


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_no_output_log_or_child_environment_holds_the_password_or_a_holder_token(
    request: pytest.FixtureRequest,
    kind: str,
    namespace: str,
    tmp_path: Path,
    run_cli: RunCli,
    make_cli: Callable[[str, str], Cli],
) -> None:
    url = _secret_url(request, kind)
    store = open_store(parse_store_url(url))
    try:
        planted = plant(store, namespace)
        scope = ("--namespace", namespace)
        ran = [run_cli(url, *scope, *argv) for argv in READS]
        ran += [
            run_cli(url, *scope, *JSON_LOGS, a, planted.job) for a in ("trigger", "pause", "resume")
        ]

        env_file = tmp_path / "child-env.json"
        executed = make_cli(url, namespace).run(
            *scope, *JSON_LOGS, "exec", "ledgered", "--schedule", "* * * * *", "--",
            sys.executable, "-c", DUMP_ENV, str(env_file),
            flags=False, env={"FLEETCRON_BACKEND": url, **secret_variables(url)},
        )  # fmt: skip
        ran.append(Ran(("exec",), executed.returncode, executed.stdout, executed.stderr))

        for result in ran:
            assert result.status in (0, 1), result  # 1: doctor's warning (no replica up)
            assert "Traceback" not in result.stderr, result
            if "json" in result.argv:
                _json_lines(result.stderr)
        tokens = set(planted.tokens) | holder_tokens(store, namespace)
        assert len(tokens) >= 4  # the planted ones, and the exec's own
        assert_no_secret([text for result in ran for text in result.texts()], *tokens)

        shown = "\n".join(result.stdout for result in ran)
        assert "host-a:17" in shown  # the holders are shown, without their token
        assert "host-c:19" in shown
        assert ":***@127.0.0.1" in shown  # doctor names the store, its password masked
        assert_clean_environment(json.loads(env_file.read_text()), url)
    finally:
        store.close()


# -- stores that refuse or cannot be reached ---------------------------------------------------
def _refusing(request: pytest.FixtureRequest, case: str) -> str:
    if case == "mysql-refuses-the-password":
        return with_password(require_service("mysql"))  # root has none: access denied
    if case == "redis-wrong-password":
        secret: SecretRedis = request.getfixturevalue("redis_secret")
        return secret.wrong_url
    if case == "postgres-unknown-database":
        return with_password(require_service("postgres").rsplit("/", 1)[0] + "/fc_no_such_db")
    if case == "postgres-unreachable":
        return with_password("postgresql://postgres@127.0.0.1:1/test")
    if case == "mysql-unreachable":
        return with_password("mysql://root@127.0.0.1:1/test")
    assert case == "redis-unreachable"
    return with_password("redis://127.0.0.1:1/0")


CASES = [
    "mysql-refuses-the-password",
    "redis-wrong-password",
    "postgres-unknown-database",
    "postgres-unreachable",
    "mysql-unreachable",
    "redis-unreachable",
]


@pytest.mark.parametrize("case", CASES)
def test_a_refused_or_unreachable_store_is_named_with_its_password_masked(
    request: pytest.FixtureRequest, case: str, namespace: str, tmp_path: Path, run_cli: RunCli
) -> None:
    url = _refusing(request, case)
    marker = tmp_path / "ran"
    ran = [
        run_cli(url, "--namespace", namespace, *argv)
        for argv in [
            (*JSON_LOGS, "exec", "job", "--", "touch", str(marker)),
            (*JSON_LOGS, "status", "--json"),
            ("locks",),
            (*JSON_LOGS, "doctor", "--json"),
        ]
    ]

    for result in ran:
        assert result.status != 0, result
        assert "Traceback" not in result.stderr, result
        assert "127.0.0.1" in result.stdout + result.stderr, result  # the store is named
        _json_lines(result.stderr)
    assert not marker.exists()
    assert_no_secret([text for result in ran for text in result.texts()])

    with pytest.raises(FleetcronError) as caught:  # the library's exception, and its causes
        Fleet(url, namespace=namespace).close()
    error = caught.value
    assert "***" in str(error)
    assert_no_secret(
        [
            ("the traceback", "".join(traceback.format_exception(error))),
            ("repr", repr(error)),
            ("args", str(error.args)),
        ]
    )
