"""A Redis password the server does not check: the store connects and says so, a warning
with ``action=store_warning`` and the URL redacted, whatever the protocol redis-py speaks
(``HELLO 3 AUTH`` is let in by such a server, ``AUTH`` refused); a password the server
checks is taken without a word, and a wrong one is refused."""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from fleetcron.errors import StoreRefused
from fleetcron.stores import open_async_store, open_store, parse_store_url
from redis_server import RedisServer
from services import require_service

PASSWORD = "s3cretPassw0rd"
UNCHECKED = "lets a client in without a password, so the password in the backend URL is not"


def _with_password(url: str, password: str = PASSWORD, user: str = "") -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 6379}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def open_redis() -> str:
    """The machine's Redis, which asks no password."""
    url = require_service("redis")
    if urllib.parse.urlsplit(url).password:
        pytest.skip("the test Redis asks for a password")
    return url


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis of the test's own that asks for ``PASSWORD`` (set once it answers)."""
    server = RedisServer(tmp_path, ["--save", "", "--appendonly", "no"])
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", PASSWORD)
        yield server.url
    finally:
        server.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if UNCHECKED in r.getMessage()]


def _open_and_close(url: str, asynchronous: bool) -> None:
    parsed = parse_store_url(url)
    if not asynchronous:
        open_store(parsed).close()
        return

    async def scenario() -> None:
        store = await open_async_store(parsed)
        await store.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("where", ["userinfo", "query", "default user"])
def test_a_password_the_server_does_not_check_is_taken_with_a_warning(
    open_redis: str, caplog: pytest.LogCaptureFixture, where: str, asynchronous: bool
) -> None:
    if where == "query":
        url = f"{open_redis}?password={PASSWORD}"
    else:
        url = _with_password(open_redis, user="default" if where == "default user" else "")
    caplog.set_level(logging.INFO, logger="fleetcron")

    _open_and_close(url, asynchronous)

    (warning,) = _warnings(caplog)
    assert warning.levelno == logging.WARNING
    assert getattr(warning, "action", None) == "store_warning"
    assert parse_store_url(url).redacted in warning.getMessage()
    assert "requirepass" in warning.getMessage()
    assert all(PASSWORD not in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_no_password_no_warning(
    open_redis: str, caplog: pytest.LogCaptureFixture, asynchronous: bool
) -> None:
    caplog.set_level(logging.INFO, logger="fleetcron")

    _open_and_close(open_redis, asynchronous)

    assert _warnings(caplog) == []


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_password_the_server_checks_is_taken_without_a_word(
    guarded_redis: str, caplog: pytest.LogCaptureFixture, asynchronous: bool
) -> None:
    caplog.set_level(logging.INFO, logger="fleetcron")

    _open_and_close(_with_password(guarded_redis), asynchronous)

    assert _warnings(caplog) == []


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("password", ["wrong", ""])
def test_a_wrong_or_missing_password_is_refused(
    guarded_redis: str, password: str, asynchronous: bool
) -> None:
    url = _with_password(guarded_redis, password) if password else guarded_redis

    with pytest.raises(StoreRefused) as refused:
        _open_and_close(url, asynchronous)

    assert "wrong" not in refused.value.message


def test_over_resp2_the_password_the_server_does_not_check_is_let_in_too(
    open_redis: str,
) -> None:
    url = _with_password(open_redis)
    # What redis-py does by itself over RESP2 (its default before 8.0): AUTH is refused.
    with pytest.raises(redis.exceptions.AuthenticationError, match="password"):
        redis.Redis.from_url(url, protocol=2).ping()
    from fleetcron.stores.redis.connect import sync_client

    client = sync_client(parse_store_url(url))
    client.connection_pool.connection_kwargs["protocol"] = 2
    try:
        assert client.ping()
        assert client.connection_pool.get_connection().protocol == 2
    finally:
        client.close()


def test_over_resp2_the_async_client_lets_it_in_too(open_redis: str) -> None:
    from fleetcron.stores.redis.connect import async_client

    url = _with_password(open_redis)

    async def scenario() -> None:
        client = async_client(parse_store_url(url))
        client.connection_pool.connection_kwargs["protocol"] = 2
        try:
            assert await client.ping()
        finally:
            await client.aclose()

    asyncio.run(scenario())
