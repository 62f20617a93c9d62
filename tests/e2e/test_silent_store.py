"""A store that accepts the connection and never answers: the client gives up within its
timeouts and exits 75 (unavailable), never hangs, and the command does not start."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_STORE_UNAVAILABLE


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize(
    "template",
    [
        "mysql://root@127.0.0.1:{port}/test?connect_timeout=1&timeout=1",
        "postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2&timeout=1",
        "redis://127.0.0.1:{port}/0?connect_timeout=1&timeout=1",
    ],
)
def test_a_silent_server_is_given_up_on_within_the_url_timeouts(
    template: str, silent_port: int, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    url = template.format(port=silent_port)

    result = Cli(url, namespace, tmp_path).run(
        "exec", "job", "--", "touch", str(marker), timeout=60
    )

    assert result.returncode == EXIT_STORE_UNAVAILABLE, result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists(), "the command started without a store"


@pytest.mark.parametrize(
    ("template", "limit"),
    [
        ("mysql://root@127.0.0.1:{port}/test?connect_timeout=1&timeout=30", "no answer within 1 s"),
        ("redis://127.0.0.1:{port}/0?connect_timeout=1&timeout=30", "no answer within 1 s"),
        ("redis://:pw@127.0.0.1:{port}/0?connect_timeout=1&timeout=30", "no answer within 1 s"),
        # libpq's connect_timeout is whole seconds, at least 2; its own words name it.
        ("postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2&timeout=30", "timeout"),
    ],
)
def test_a_silent_server_is_given_up_on_after_connect_timeout_not_timeout(
    template: str, limit: str, silent_port: int, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    url = template.format(port=silent_port)
    started = time.monotonic()

    result = Cli(url, namespace, tmp_path).run(
        "exec", "job", "--", "touch", str(marker), timeout=60
    )

    elapsed = time.monotonic() - started  # the URLs' timeout is 30 s
    assert elapsed < 10, f"gave up after {elapsed:.1f} s, not after connect_timeout"
    shown = url.replace(":pw@", ":***@")
    assert_clean_error(result, EXIT_STORE_UNAVAILABLE, f"cannot connect to {shown}", limit)
    assert not marker.exists(), "the command started without a store"
