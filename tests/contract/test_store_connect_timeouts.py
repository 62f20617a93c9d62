"""One connect timeout on every server backend: a server that accepts the connection and
never answers — paused, or hung with its listen backlog still open — is given up on within
the backend URL's ``connect_timeout``, greeting, TLS handshake and authentication included,
not after its ``timeout``; so is one that answers a byte at a time and never finishes. The
error is :class:`StoreUnavailable` naming the limit."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.stores import open_async_store, open_store, parse_store_url
from services import require_service

HANG_LIMIT_S = 60  # only a hang reaches it: the old behaviour gave up after `timeout`
WELL_UNDER_TIMEOUT_S = 10  # the URLs' timeout is 30 s, their connect_timeout 1 s (2 on libpq)

# (service, URL template): {port} is the silent TCP listener, {path} the silent unix socket.
SILENT_URLS = [
    ("mysql", "mysql://root@127.0.0.1:{port}/test?connect_timeout=1&timeout=30"),
    ("mysql", "mysql://root@localhost/test?unix_socket={path}&connect_timeout=1&timeout=30"),
    ("redis", "redis://127.0.0.1:{port}/0?connect_timeout=1&timeout=30"),
    ("redis", "redis://:s3cret@127.0.0.1:{port}/0?connect_timeout=1&timeout=30"),  # AUTH
    ("redis", "rediss://127.0.0.1:{port}/0?connect_timeout=1&timeout=30&ssl_cert_reqs=none"),
    ("redis", "unix://{path}?connect_timeout=1&timeout=30"),
    # libpq's connect_timeout is whole seconds, at least 2: here to keep the others honest.
    ("postgres", "postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2&timeout=30"),
]
NAMES_THE_LIMIT = "(the backend URL's connect_timeout)"


class SilentServer:
    """A TCP port and a unix socket that accept every connection, keep it open and never
    send a byte."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "silent.sock")
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(self.path)
        self.port: int = tcp.getsockname()[1]
        self._listeners = [tcp, unix]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._accept, args=(listener,), daemon=True)
            for listener in self._listeners
        ]
        for listener, thread in zip(self._listeners, self._threads, strict=True):
            listener.listen(16)
            listener.settimeout(0.2)
            thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            self._held.append(conn)  # kept open, never answered

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for sock in [*self._held, *self._listeners]:
            sock.close()


@pytest.fixture
def silent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SilentServer]:
    # A short directory: a unix socket's path has room for about 100 bytes.
    server = SilentServer(tmp_path_factory.mktemp("s", numbered=True))
    try:
        yield server
    finally:
        server.close()


def _url(service: str, template: str, silent: SilentServer) -> str:
    require_service(service)  # the driver and the service's test set-up are there
    return template.format(port=silent.port, path=silent.path)


def _timed(work: Callable[[], object]) -> tuple[BaseException | None, float]:
    """``work``'s exception and how long it took, run in a thread that must end."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:
            raised.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_LIMIT_S)
    assert not thread.is_alive(), f"the connect hung for over {HANG_LIMIT_S} s"
    return (raised[0] if raised else None), time.monotonic() - started


def _check(service: str, error: BaseException | None, elapsed: float) -> None:
    assert isinstance(error, StoreUnavailable), repr(error)
    assert elapsed < WELL_UNDER_TIMEOUT_S, f"gave up after {elapsed:.1f} s, not connect_timeout"
    if service != "postgres":  # libpq's own words: "connection timeout expired"
        assert NAMES_THE_LIMIT in error.message, error.message
        assert "no answer within 1 s" in error.message, error.message
    assert "s3cret" not in error.message


@pytest.mark.parametrize(("service", "template"), SILENT_URLS)
def test_a_sync_store_gives_up_on_a_silent_server_within_its_connect_timeout(
    silent: SilentServer, service: str, template: str
) -> None:
    url = parse_store_url(_url(service, template, silent))

    error, elapsed = _timed(lambda: open_store(url).close())

    _check(service, error, elapsed)


@pytest.mark.parametrize(("service", "template"), SILENT_URLS)
def test_an_async_store_gives_up_on_a_silent_server_within_its_connect_timeout(
    silent: SilentServer, service: str, template: str
) -> None:
    url = parse_store_url(_url(service, template, silent))

    async def connect() -> None:
        store = await asyncio.wait_for(open_async_store(url), HANG_LIMIT_S)
        await store.close()

    error, elapsed = _timed(lambda: asyncio.run(connect()))

    _check(service, error, elapsed)


def test_a_mysql_reply_slower_than_the_timeout_while_connecting_names_the_timeout(
    silent: SilentServer,
) -> None:
    require_service("mysql")
    url = parse_store_url(f"mysql://root@127.0.0.1:{silent.port}/test?connect_timeout=30&timeout=1")

    error, elapsed = _timed(lambda: open_store(url).close())

    assert isinstance(error, StoreUnavailable), repr(error)
    assert elapsed < WELL_UNDER_TIMEOUT_S
    assert error.message.endswith("no reply within 1 s (the backend URL's timeout)")


class TricklingServer:
    """A TCP port that accepts every connection and sends ``first``, then ``rest`` every
    0.2 s for ever: each read gets a byte well within any timeout, and no reply ends."""

    def __init__(self, first: bytes, rest: bytes) -> None:
        self._first, self._rest = first, rest
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(self._first)
                while not self._stop.wait(0.2):
                    conn.sendall(self._rest)
            except OSError:
                return  # the client gave up

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()


# (service, first bytes, the bytes that follow, URL template)
TRICKLES = [
    # A MySQL packet header (8 MiB, sequence 0), then its payload a byte at a time.
    ("mysql", b"\xff\xff\x7f\x00", b"\x0a", "mysql://root@127.0.0.1:{port}/test?connect_timeout=1"),
    # A Redis reply (to HELLO or AUTH) whose line never ends.
    ("redis", b"+", b"x", "redis://127.0.0.1:{port}/0?connect_timeout=1&timeout=30"),
    ("redis", b"+", b"x", "redis://:s3cret@127.0.0.1:{port}/0?connect_timeout=1&timeout=30"),
]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("service", "first", "rest", "template"), TRICKLES)
def test_a_server_that_answers_a_byte_at_a_time_is_given_up_on_at_connect_timeout(
    service: str, first: bytes, rest: bytes, template: str, asynchronous: bool
) -> None:
    require_service(service)
    server = TricklingServer(first, rest)
    try:
        url = parse_store_url(template.format(port=server.port))

        async def connect() -> None:
            store = await asyncio.wait_for(open_async_store(url), HANG_LIMIT_S)
            await store.close()

        if asynchronous:
            error, elapsed = _timed(lambda: asyncio.run(connect()))
        else:
            error, elapsed = _timed(lambda: open_store(url).close())
    finally:
        server.close()

    _check(service, error, elapsed)
