"""Serving the dashboard on the running event loop with uvicorn's ``Server``.

The listening socket is bound first (:func:`bind`), before anything else starts, so a port
in use or a bad address is a :class:`~fleetcron.errors.ConfigurationError` (exit 2) rather
than uvicorn's own exit. uvicorn's signal handlers are left out: the command that embeds
the server owns SIGTERM and SIGINT and calls :meth:`WebServer.stop`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from fleetcron.errors import ConfigurationError

__all__ = ["WebServer", "address_url", "bind", "is_loopback"]

DEFAULT_LISTEN = "127.0.0.1:8080"
_GRACE_S = 5  # a request in flight at shutdown gets this long


def bind(where: str, *, option: str = "--listen") -> socket.socket:
    """A socket listening at ``HOST:PORT`` (``[::1]:8080``; ``:8080`` is every interface,
    port 0 any free port), or a :class:`ConfigurationError` naming ``option``."""
    host, sep, port_text = where.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise ConfigurationError(f"{option} must be HOST:PORT (e.g. 127.0.0.1:8080), not {where!r}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigurationError(f"{option} {where}: no such address ({reason})") from None
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise ConfigurationError(
            f"{option} {where}: cannot listen there: {exc.strerror or exc}"
        ) from None
    listener.setblocking(False)
    return listener


def address_url(listener: socket.socket) -> str:
    """``http://HOST:PORT/`` of a bound socket (the port it got, for port 0)."""
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def is_loopback(listener: socket.socket) -> bool:
    """Whether only this host can reach the socket."""
    return ipaddress.ip_address(listener.getsockname()[0]).is_loopback


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the embedding command handles the signals


class WebServer:
    """``app`` served on ``listener``: ``await serve()`` until :meth:`stop` (the socket
    is closed when it returns)."""

    def __init__(self, app: Any, listener: socket.socket) -> None:
        self.listener = listener
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=_GRACE_S,
        )
        self._server = _Server(config)

    @property
    def url(self) -> str:
        return address_url(self.listener)

    async def serve(self) -> None:
        await self._server.serve(sockets=[self.listener])

    def stop(self) -> None:
        """Stop accepting; requests in flight get a few seconds."""
        self._server.should_exit = True
