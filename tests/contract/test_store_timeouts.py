"""One read timeout on every server backend: a store that stops answering after the
connection was made is given up on within the backend URL's ``timeout``, as
:class:`StoreUnavailable` naming it, and the next operation reconnects."""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from collections.abc import Callable, Iterator

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.stores import open_async_store, open_store, parse_store_url
from services import require_service
from tcp_proxy import TcpProxy

SERVERS = ("postgres", "mysql", "redis")
LIMIT_S = 60  # far above the 1 s timeout: only a hang reaches it


@pytest.fixture(params=SERVERS)
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[str, TcpProxy]]:
    """``(url through the proxy with timeout=1, proxy)`` for each server backend."""
    url = urllib.parse.urlsplit(require_service(request.param))
    proxy = TcpProxy((url.hostname or "127.0.0.1", url.port or 0))
    netloc = url.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    netloc_text = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    query = "&".join(q for q in (url.query, "timeout=1") if q)
    proxied_url = urllib.parse.urlunsplit((url.scheme, netloc_text, url.path, query, ""))
    try:
        yield proxied_url, proxy
    finally:
        proxy.close()


def _in_thread(work: Callable[[], object]) -> BaseException | None:
    raised: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    assert not thread.is_alive(), f"the store operation hung for over {LIMIT_S} s"
    return raised[0] if raised else None


def test_a_sync_store_gives_up_on_a_silent_server_within_its_timeout(
    proxied: tuple[str, TcpProxy], namespace: str
) -> None:
    url, proxy = proxied
    store = open_store(parse_store_url(url))
    try:
        store.run(store.ops.store_now())
        proxy.freeze()
        error = _in_thread(lambda: store.run(store.ops.store_now()))
        assert isinstance(error, StoreUnavailable), repr(error)
        proxy.thaw()
        assert store.run(store.ops.store_now()) > 0  # reconnected
    finally:
        proxy.thaw()
        store.close()


def test_an_async_store_gives_up_on_a_silent_server_within_its_timeout(
    proxied: tuple[str, TcpProxy], namespace: str
) -> None:
    url, proxy = proxied

    async def scenario() -> None:
        store = await open_async_store(parse_store_url(url))
        try:
            await store.run(store.ops.store_now())
            proxy.freeze()
            with pytest.raises(StoreUnavailable):
                await asyncio.wait_for(store.run(store.ops.store_now()), LIMIT_S)
            proxy.thaw()
            assert await store.run(store.ops.store_now()) > 0
        finally:
            proxy.thaw()
            await store.close()

    asyncio.run(scenario())
