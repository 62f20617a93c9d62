from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import resolve_backend
from fleetcron.stores.url import default_sqlite_path, parse_store_url, redact, sqlite_url


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", "memory"),
        ("sqlite:////var/lib/app/fc.db", "sqlite"),
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


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:////var/lib/app/fc.db", "/var/lib/app/fc.db"),  # four slashes: absolute
        ("sqlite://///var/lib/app/fc.db", "/var/lib/app/fc.db"),
        ("sqlite:///var/lib/app/fc.db", "var/lib/app/fc.db"),  # three: the working directory's
        ("sqlite:///fc.db", "fc.db"),
        ("sqlite:///./data/fc.db?timeout=5", "data/fc.db"),
        ("sqlite:///../fc.db", "../fc.db"),
        ("sqlite:///my%20data/fc%3F.db", "my data/fc?.db"),
    ],
)
def test_sqlite_urls_read_as_sqlalchemy_reads_them(url: str, path: str) -> None:
    assert parse_store_url(url).path == Path(path)


@pytest.mark.parametrize(
    "path", ["/var/lib/app/fc.db", "fc.db", "data/fc.db", "/tmp/a b/fc?#%.db", "../x.db"]
)
def test_sqlite_url_spells_a_path_so_that_it_reads_back(path: str) -> None:
    url = sqlite_url(Path(path))
    assert url.startswith("sqlite:////" if path.startswith("/") else "sqlite:///")
    assert parse_store_url(url).path == Path(path)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "empty"),
        ("localhost:5432", "no scheme"),
        ("ftp://host/x", "not supported"),
        ("postgresql://", "names no host"),
        ("redis://host:notaport/0", "the port must be a number from 1 to 65535"),
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
    tuned = connect_args(parse_store_url("mysql://root@db/app?timeout=5&connect_timeout=2"))
    assert (tuned["connect_timeout"], tuned["read_timeout"], tuned["write_timeout"]) == (2, 5, 5)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db/app",
        "mysql://root@db/app",
        "redis://127.0.0.1:6379/0",
        "sqlite:////tmp/x.db",
    ],
)
def test_every_backend_has_the_same_default_timeouts(url: str) -> None:
    parsed = parse_store_url(url)
    assert (parsed.timeout_s, parsed.connect_timeout_s) == (30.0, 10.0)


@pytest.mark.parametrize(
    ("url", "timeout", "connect", "driver"),
    [
        (
            "postgresql://app@db/app?sslmode=disable&timeout=2&connect_timeout=3",
            2.0,
            3.0,
            "postgresql://app@db/app?sslmode=disable",
        ),
        ("mysql://root@db/app?timeout=500ms", 0.5, 10.0, "mysql://root@db/app"),
        ("redis://127.0.0.1/0?connect_timeout=1.5s", 30.0, 1.5, "redis://127.0.0.1/0"),
        ("sqlite:////tmp/x.db?timeout=5", 5.0, 10.0, "sqlite:////tmp/x.db"),
    ],
)
def test_timeouts_are_read_from_any_backend_url_and_kept_from_the_driver(
    url: str, timeout: float, connect: float, driver: str
) -> None:
    parsed = parse_store_url(url)
    assert (parsed.timeout_s, parsed.connect_timeout_s, parsed.driver_url) == (
        timeout,
        connect,
        driver,
    )


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("foo=bar", "unknown parameter(s) foo"),
        ("connect_timeout=abc", "connect_timeout must be a positive number of seconds"),
        ("timeout=0", "timeout must be a positive number of seconds"),
        ("read_timeout=5", "unknown parameter(s) read_timeout"),
    ],
)
def test_bad_mysql_url_parameters_are_refused(query: str, problem: str) -> None:
    from fleetcron.stores.sql.mysql import connect_args

    with pytest.raises(ConfigurationError) as raised:
        connect_args(parse_store_url(f"mysql://root:s3cret@db/app?{query}"))
    assert problem in raised.value.message
    assert "s3cret" not in raised.value.message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:s3cret@h/abc", "the Redis database must be a number"),
        ("redis://:s3cret@h/0?foo=bar", "unknown parameter(s) foo"),
        ("redis://:s3cret@h/0?socket_timeout=abc", "unknown parameter(s) socket_timeout"),
        ("redis://:s3cret@h/0?ssl_cert_reqs=none", "TLS parameters need rediss://"),
        ("rediss://:s3cret@h/0?ssl_cert_reqs=bogus", "ssl_cert_reqs must be one of"),
        ("rediss://:s3cret@h/0?ssl_ca_certs=/nonexistent.pem", "not a readable file"),
        ("rediss://:s3cret@h/0?ssl_check_hostname=maybe", "must be true or false"),
        ("redis://:s3cret@h/1?db=2", "names the database twice"),
        ("redis://:s3cret@h/1?password=other", "gives the password twice"),
        ("unix://:s3cret@/run/redis.sock?password=other", "gives the password twice"),
        ("redis://:s3cret@h/0?timeout=abc", "timeout must be a positive number"),
    ],
)
def test_bad_redis_url_parameters_are_refused(url: str, problem: str) -> None:
    from fleetcron.stores.redis.connect import client_args

    with pytest.raises(ConfigurationError) as raised:
        client_args(parse_store_url(url))
    assert problem in raised.value.message
    assert "s3cret" not in raised.value.message


def test_a_redis_password_without_a_user_name_is_the_default_users() -> None:
    from fleetcron.stores.redis.connect import client_args

    for url in ("redis://:pw@127.0.0.1/0", "redis://127.0.0.1/0?password=pw"):
        assert client_args(parse_store_url(url))[1]["username"] == "default"
    assert "username" not in client_args(parse_store_url("redis://127.0.0.1/0"))[1]
    address, args = client_args(parse_store_url("redis://app:pw@127.0.0.1/0"))
    assert (address, "username" in args) == ("redis://app:pw@127.0.0.1", False)


def test_redis_urls_become_checked_client_arguments() -> None:
    from fleetcron.stores.redis.connect import client_args

    address, args = client_args(parse_store_url("redis://:pw@127.0.0.1:6380/3?timeout=2"))
    assert address == "redis://:pw@127.0.0.1:6380"
    assert (args["db"], args["socket_timeout"], args["socket_connect_timeout"]) == (3, 2.0, 10.0)
    address, args = client_args(parse_store_url("unix:///run/redis.sock?db=2"))
    assert (address, args["db"]) == ("unix:///run/redis.sock", 2)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://app:s3cret@db/app?foo=bar", 'invalid URI query parameter: "foo"'),
        ("postgresql://app:s3cret@db/app?sslmode=bogus", "sslmode must be one of"),
    ],
)
def test_bad_postgres_url_parameters_are_refused_before_connecting(url: str, problem: str) -> None:
    from fleetcron.stores.sql.postgres import check_conninfo

    with pytest.raises(ConfigurationError) as raised:
        check_conninfo(parse_store_url(url))
    assert problem in raised.value.message
    assert "s3cret" not in raised.value.message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:///:memory:", "use memory://"),
        ("sqlite://:memory:", "use memory://"),
        ("sqlite:////tmp/x.db?mode=ro", "unknown parameter(s) mode"),
        ("sqlite:////tmp/x.db?connect_timeout=1", "connect_timeout has no meaning for SQLite"),
        ("memory://somewhere", "memory:// takes nothing"),
    ],
)
def test_sqlite_and_memory_urls_that_would_be_ignored_are_refused(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(url)
    assert problem in raised.value.message


@pytest.mark.parametrize("query", ["timeout=1e12", "connect_timeout=1e12", "timeout=400d"])
def test_a_timeout_beyond_a_year_is_refused_not_crashing_the_driver(query: str) -> None:
    with pytest.raises(ConfigurationError, match="at most a year"):
        parse_store_url(f"mysql://root@db/app?{query}")


@pytest.mark.parametrize(
    ("url", "prepared", "driver"),
    [
        ("postgresql://app@db/app", True, "postgresql://app@db/app"),
        ("postgresql://app@db/app?prepared_statements=on", True, "postgresql://app@db/app"),
        (
            "postgresql://app@db/app?sslmode=disable&prepared_statements=off&timeout=2",
            False,
            "postgresql://app@db/app?sslmode=disable",
        ),
        ("postgres://db/app?prepared_statements=False", False, "postgres://db/app"),
        ("postgres://db/app?prepared_statements=0", False, "postgres://db/app"),
    ],
)
def test_postgres_prepared_statements_are_read_from_the_url_and_kept_from_the_driver(
    url: str, prepared: bool, driver: str
) -> None:
    parsed = parse_store_url(url)
    assert (parsed.prepared_statements, parsed.driver_url) == (prepared, driver)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://db/app?prepared_statements=maybe", "must be on or off, not 'maybe'"),
        ("postgresql://db/app?prepared_statements=", "must be on or off, not ''"),
        ("mysql://root@db/app?prepared_statements=off", "is a PostgreSQL parameter"),
        ("redis://127.0.0.1/0?prepared_statements=off", "is a PostgreSQL parameter"),
        ("sqlite:////tmp/x.db?prepared_statements=off", "unknown parameter(s) prepared_statements"),
    ],
)
def test_a_prepared_statements_parameter_that_would_not_work_is_refused(
    url: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        parse_store_url(url)
    assert "backend URL" in str(caught.value)


PORT_SCHEMES = ["postgresql", "postgres", "mysql", "mariadb", "redis", "rediss"]


@pytest.mark.parametrize("scheme", PORT_SCHEMES)
@pytest.mark.parametrize("port", ["0", "00", "65536", "99999", "-1", "+80", "０", "٣٣٠٦", "8o"])
def test_a_port_outside_1_to_65535_is_refused_on_every_scheme(scheme: str, port: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(f"{scheme}://user:s3cret@db:{port}/0")
    assert raised.value.message == (
        f"backend URL '{scheme}://user:***@db:{port}/0': the port must be a number from 1 "
        f"to 65535, not {port!r}"
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis://[::1]:0/0",
        "postgresql://h1:5432,h2:0/app",
        "postgresql://h1:0,h2:5432/app",
        "mysql://root@h1:3306,h2:3306/app",  # a list of hosts is PostgreSQL's only
    ],
)
def test_a_bad_port_is_refused_wherever_it_stands_in_the_authority(url: str) -> None:
    with pytest.raises(ConfigurationError, match="the port must be a number from 1 to 65535"):
        parse_store_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@db:1/app",
        "mysql://root@db:65535/app",
        "redis://[::1]:6379/0",
        "postgresql://app@h1:5432,h2:5433/app",
        "postgresql://app@h1:5432,h2/app",
    ],
)
def test_ports_from_1_to_65535_are_taken(url: str) -> None:
    parse_store_url(url)


def test_port_0_no_longer_becomes_the_mysql_default() -> None:
    with pytest.raises(ConfigurationError, match="not '0'"):
        parse_store_url("mysql://root@127.0.0.1:0/test")


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("mysql://root@db/app?timeout=5&timeout=6", "timeout"),
        ("postgresql://app@db/app?connect_timeout=2&connect_timeout=3", "connect_timeout"),
        ("postgresql://app@db/app?sslmode=disable&sslmode=require", "sslmode"),
        ("postgres://db/app?prepared_statements=on&prepared_statements=0", "prepared_statements"),
        ("redis://127.0.0.1?db=1&db=2", "db"),
        ("rediss://h/0?ssl_cert_reqs=none&timeout=1&ssl_cert_reqs=required", "ssl_cert_reqs"),
        ("mysql://root@db/app?unix_socket=/a&unix_socket=/b", "unix_socket"),
        ("sqlite:////tmp/x.db?timeout=5&timeout=6", "timeout"),
        ("mysql://root@db/app?time%6Fut=5&timeout=6", "timeout"),  # one name, spelt twice
        ("mysql://root@db/app?timeout=5&timeout=5", "timeout"),  # even the same value
        ("redis://h/0?db=1&timeout=1&db=2&timeout=2", "db, timeout"),
    ],
)
def test_a_parameter_given_twice_is_refused_not_taken_once(url: str, names: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(url)
    assert f"parameter(s) {names} given more than once; give each once" in raised.value.message


def test_a_repeated_password_parameter_is_refused_without_showing_either_value() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url("redis://:s3cret@h/0?password=first1&password=second2")
    assert "parameter(s) password given more than once" in raised.value.message
    for secret in ("s3cret", "first1", "second2"):
        assert secret not in raised.value.message


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite://relative.db", "relative.db"),
        ("sqlite://data/fleetcron.db", "data/fleetcron.db"),
        ("sqlite://./fleetcron.db", "./fleetcron.db"),
        ("sqlite://localhost/var/fleetcron.db", "localhost/var/fleetcron.db"),
        ("sqlite://relative.db?timeout=5", "relative.db"),
    ],
)
def test_a_sqlite_url_with_two_slashes_is_refused_showing_both_spellings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, path: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(url)
    message = raised.value.message
    assert message.startswith(
        f"backend URL {url!r}: a SQLite URL has no host; its path follows a third slash"
    )
    assert f"write 'sqlite:///{Path(path)}' for {path} relative to the working directory" in message
    assert message.endswith(f"or {f'sqlite:///{tmp_path / path}'!r} for {tmp_path / path}")


def test_a_sqlite_url_under_the_home_directory_is_spelt_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url("sqlite://~/fc.db")
    assert raised.value.message.endswith(f"write {f'sqlite:///{tmp_path}/fc.db'!r}")


def test_the_default_store_is_spelt_with_four_slashes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("FLEETCRON_BACKEND", "FLEETCRON_BACKEND_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    default = resolve_backend()
    assert default.raw == f"sqlite:///{tmp_path}/fleetcron/fleetcron.db"
    assert default.raw.startswith("sqlite:////")
    assert parse_store_url(default.raw).path == default.path == default_sqlite_path()


@pytest.mark.parametrize("value", ["١٠", "１０", "٣s", "1.٥"])
def test_a_url_timeout_in_digits_other_than_ascii_is_refused_saying_so(value: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_store_url(f"redis://127.0.0.1/0?timeout={value}")
    assert raised.value.message.endswith(f"written in ASCII digits 0-9, not {value!r}")


def test_a_relative_sqlite_url_is_shown_with_the_file_it_names_from_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = parse_store_url("sqlite:///data/fc.db")
    assert relative.shown == f"sqlite:///data/fc.db ({tmp_path / 'data' / 'fc.db'})"
    absolute = parse_store_url(f"sqlite:///{tmp_path / 'fc.db'}")
    assert absolute.shown == absolute.redacted == f"sqlite:///{tmp_path / 'fc.db'}"
