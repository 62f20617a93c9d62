"""Local endpoints for ping tests: one that records every request, one that never answers."""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

__all__ = ["PingServer", "Received", "SilentServer"]

T = TypeVar("T")


@dataclass(frozen=True)
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    body: bytes
    user_agent: str

    @property
    def rid(self) -> str | None:
        return self.query.get("rid")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        split = urllib.parse.urlsplit(self.path)
        received = Received(
            method=self.command,
            path=split.path,
            query=dict(urllib.parse.parse_qsl(split.query)),
            body=body,
            user_agent=self.headers.get("User-Agent", ""),
        )
        status = self.server.owner._record(received)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"OK")

    do_GET = do_POST = do_HEAD = _handle

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: PingServer


class PingServer:
    """An HTTP server on 127.0.0.1 in a thread, recording every request.

    ``answer(received)`` gives the status of each answer (default 200); it may block, to
    play a slow endpoint. ``base`` is the server's root URL.
    """

    def __init__(self, answer: Callable[[Received], int] | None = None) -> None:
        self._answer = answer or (lambda _: 200)
        self._received: list[Received] = []
        self._changed = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _record(self, received: Received) -> int:
        with self._changed:
            self._received.append(received)
            self._changed.notify_all()
        return self._answer(received)

    @property
    def received(self) -> list[Received]:
        with self._changed:
            return list(self._received)

    def wait_for(
        self, condition: Callable[[list[Received]], T], *, timeout: float = 10.0, what: str = ""
    ) -> T:
        """Wait until ``condition(requests so far)`` is truthy; its value."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = condition(list(self._received))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout}s waiting for {what or condition}; "
                        f"received {self._received}"
                    )
                self._changed.wait(left)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class SilentServer:
    """A TCP port on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._socket.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._held.append(connection)

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._socket.close()
        with self._lock:
            for connection in self._held:
                connection.close()
