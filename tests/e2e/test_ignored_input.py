"""Input that once was taken and quietly meant something else is refused: one line on
stderr naming what is wrong and where (the URL redacted), exit 2, and nothing touched —
no SQLite file, no command started. A Redis password the server does not check is taken,
and said so."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from e2e.helpers import Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_USAGE
from services import require_service


@pytest.mark.parametrize("every", ["١٠s", "１０s"])
def test_a_jobs_file_duration_in_digits_other_than_ascii_is_refused(
    sqlite_cli: Cli, tmp_path: Path, every: str
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[jobs.tick]\nevery = "{every}"\ncommand = ["true"]\n', encoding="utf-8")

    result = sqlite_cli.run("run", str(jobs), timeout=20)

    assert_clean_error(
        result, EXIT_USAGE, "job 'tick'", "'every'", repr(every), "write the digits as ASCII 0-9"
    )
    assert not (tmp_path / "fleetcron.db").exists()


def test_an_exec_duration_in_digits_other_than_ascii_is_refused(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"

    result = sqlite_cli.run("exec", "job", "--lock-at-most", "١٠m", "--", "touch", str(marker))

    assert_clean_error(result, EXIT_USAGE, "--lock-at-most", "write the digits as ASCII 0-9")
    assert not marker.exists()
    assert not (tmp_path / "fleetcron.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root:hunter2@127.0.0.1:0/test", "the port must be a number from 1 to 65535"),
        ("redis://:hunter2@127.0.0.1:0/0", "the port must be a number from 1 to 65535, not '0'"),
        ("postgresql://u:hunter2@127.0.0.1:0/test", "the port must be a number from 1 to"),
        ("mysql://root:hunter2@127.0.0.1:3306/test?timeout=5&timeout=6", "given more than once"),
        ("redis://:hunter2@127.0.0.1:6379?db=0&db=1", "parameter(s) db given more than once"),
        ("postgresql://u:hunter2@127.0.0.1/test?sslmode=disable&sslmode=require", "sslmode"),
        ("redis://:hunter2@127.0.0.1:6379/0?timeout=١٠", "written in ASCII digits 0-9"),
    ],
)
def test_a_backend_url_part_that_would_be_ignored_is_refused(
    namespace: str, tmp_path: Path, url: str, message: str
) -> None:
    marker = tmp_path / "ran"

    result = Cli(url, namespace, tmp_path).run("exec", "job", "--", "touch", str(marker))

    assert_clean_error(result, EXIT_USAGE, "backend URL", message)
    assert "hunter2" not in result.stderr, "the password was printed"
    assert not marker.exists()


def test_a_sqlite_url_with_two_slashes_is_refused_with_both_spellings(
    namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"

    result = Cli("sqlite://fleetcron.db", namespace, tmp_path).run(
        "exec", "job", "--", "touch", str(marker)
    )

    assert_clean_error(
        result,
        EXIT_USAGE,
        "backend URL 'sqlite://fleetcron.db': a SQLite URL has no host",
        "write 'sqlite:///fleetcron.db' for fleetcron.db relative to the working directory, "
        f"or 'sqlite:///{tmp_path / 'fleetcron.db'}' for {tmp_path / 'fleetcron.db'}",
    )
    assert not marker.exists()
    assert not (tmp_path / "fleetcron.db").exists()


def test_three_slashes_name_a_file_of_the_working_directory_and_four_an_absolute_path(
    namespace: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)

    relative = Cli("sqlite:///data/fleetcron.db", namespace, work).run("migrate")
    assert relative.returncode == 0, relative.stderr
    assert (work / "data" / "fleetcron.db").is_file()

    absolute = Cli(f"sqlite:///{tmp_path / 'abs.db'}", namespace, work).run("migrate")
    assert absolute.returncode == 0, absolute.stderr
    assert (tmp_path / "abs.db").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["data"]


def test_a_three_slash_path_whose_directory_exists_only_from_the_root_is_named(
    namespace: str, tmp_path: Path
) -> None:
    # sqlite:///tmp/…/fc.db run from `work`: tmp/… is not there, /tmp/… is.
    work = tmp_path / "work"
    work.mkdir()
    written = f"{str(tmp_path).lstrip('/')}/fc.db"
    marker = tmp_path / "ran"
    cli = Cli(f"sqlite:///{written}", namespace, work)

    for argv in (("exec", "job", "--", "touch", str(marker)), ("status",), ("migrate",)):
        assert_clean_error(
            cli.run(*argv),
            EXIT_USAGE,
            f"backend URL 'sqlite:///{written}' names {written} relative to the working "
            f"directory {work}, whose directory {Path(written).parent} does not exist; for "
            f"the absolute path {tmp_path / 'fc.db'} write 'sqlite:///{tmp_path / 'fc.db'}'",
        )
    assert not marker.exists()
    assert not (tmp_path / "fc.db").exists()
    assert list(work.iterdir()) == []


def test_a_redis_password_the_server_does_not_check_is_warned_about(
    namespace: str, tmp_path: Path
) -> None:
    parts = urllib.parse.urlsplit(require_service("redis"))
    if parts.password:
        pytest.skip("the test Redis asks for a password")
    url = f"redis://:hunter2@{parts.hostname}:{parts.port or 6379}/0"
    marker = tmp_path / "ran"
    cli = Cli(url, namespace, tmp_path)

    result = cli.run(
        "--namespace",
        namespace,
        "exec",
        "job",
        "--",
        "touch",
        str(marker),
        flags=False,
        env={"FLEETCRON_BACKEND": url},  # not on the command line: no warning about that
    )

    assert result.returncode == 0, result.stderr
    assert marker.exists()
    (warning,) = [line for line in result.stderr.splitlines() if "password" in line]
    assert "lets a client in without a password" in warning
    assert f"redis://:***@{parts.hostname}" in warning
    assert "hunter2" not in result.stderr
