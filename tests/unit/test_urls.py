from __future__ import annotations

from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import resolve_backend
from fleetcron.stores.url import default_sqlite_path, parse_store_url, redact


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", "memory"),
        ("sqlite:///var/lib/app/fc.db", "sqlite"),
        ("postgresql://app:pw@db:5432/app", "postgres"),
        ("postgres://db/app", "postgres"),
        ("mysql://root@127.0.0.1/test", "mysql"),
        ("mariadb://root@127.0.0.1/test", "mysql"),
        ("redis://127.0.0.1:6379/0", "redis"),
        ("rediss://user:pw@cache:6380/1", "redis"),
    ],
)
def test_each_scheme_names_its_backend(url: str, kind: str) -> None:
    assert parse_store_url(url).kind == kind


def test_sqlite_urls_carry_an_absolute_path() -> None:
    assert parse_store_url("sqlite:///var/lib/app/fc.db").path == Path("/var/lib/app/fc.db")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "empty"),
        ("localhost:5432", "no scheme"),
        ("ftp://host/x", "not supported"),
        ("postgresql://", "names no host"),
        ("redis://host:notaport/0", "invalid"),
        ("sqlite://", "names no database file"),
    ],
)
def test_invalid_urls_are_a_clear_error(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        parse_store_url(url)


SECRET_URLS = [
    "postgresql://app:ab/cd@127.0.0.1:5999/test",
    "postgresql://app:ab#cd@127.0.0.1:5999/test",
    "postgresql://app:ab?cd@127.0.0.1:5999/test",
    "postgresql://app:S3cr3t@Xy9z@127.0.0.1:5999/test",
    "mysql://root:ab/cd@127.0.0.1:3306/test",
    "redis://:ab#cd@127.0.0.1:6379/0",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_password_a_parser_would_misread_is_redacted_and_refused(url: str) -> None:
    secret = url.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    assert secret not in redact(url)
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(url)
    assert secret not in raised.value.message
    assert "percent-encoded" in raised.value.message


def test_a_percent_encoded_password_is_accepted() -> None:
    url = "postgresql://app:ab%2Fcd@127.0.0.1:5999/test"
    assert parse_store_url(url).redacted == "postgresql://app:***@127.0.0.1:5999/test"


def test_passwords_never_appear_in_redacted_urls() -> None:
    assert redact("postgresql://app:s3cret@db/app") == "postgresql://app:***@db/app"
    assert "s3cret" not in redact("redis://:s3cret@cache:6379/0?password=s3cret")
    assert "s3cret" not in parse_store_url("mysql://u:s3cret@db/x").redacted


def test_backend_precedence_is_explicit_then_environment_then_file_then_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("FLEETCRON_BACKEND", raising=False)
    assert resolve_backend().path == tmp_path / "fleetcron" / "fleetcron.db"
    assert default_sqlite_path() == tmp_path / "fleetcron" / "fleetcron.db"
    assert resolve_backend(configured="redis://file/0").kind == "redis"
    monkeypatch.setenv("FLEETCRON_BACKEND", "mysql://env/db")
    assert resolve_backend(configured="redis://file/0").kind == "mysql"
    assert resolve_backend("memory://", configured="redis://file/0").kind == "memory"


def test_mysql_urls_carry_connect_read_and_write_timeouts() -> None:
    from fleetcron.stores.sql.mysql import connect_args

    args = connect_args(parse_store_url("mysql://root@db/app"))
    assert (args["connect_timeout"], args["read_timeout"], args["write_timeout"]) == (10, 30, 30)
    tuned = connect_args(parse_store_url("mysql://root@db/app?read_timeout=5&connect_timeout=2"))
    assert (tuned["connect_timeout"], tuned["read_timeout"]) == (2, 5)


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("foo=bar", "unknown parameter(s) foo"),
        ("connect_timeout=abc", "connect_timeout must be a positive number of seconds"),
        ("read_timeout=0", "read_timeout must be a positive number of seconds"),
    ],
)
def test_bad_mysql_url_parameters_are_refused(query: str, problem: str) -> None:
    from fleetcron.stores.sql.mysql import connect_args

    with pytest.raises(ConfigurationError) as raised:
        connect_args(parse_store_url(f"mysql://root:s3cret@db/app?{query}"))
    assert problem in raised.value.message
    assert "s3cret" not in raised.value.message
