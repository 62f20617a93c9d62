"""A spare TCP port of 127.0.0.1, for a server a test starts."""

from __future__ import annotations

import socket

__all__ = ["spare_port"]

# The machine's own services: a test never binds or talks to these as "spare".
_SERVICE_PORTS = frozenset({5432, 3306, 6379, 5672, 15672, 1883, 4222, 6432})


def spare_port() -> int:
    """A port of 127.0.0.1 free right now (another process may take it before the test
    binds it; the window is short and the kernel hands out ports in turn)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _SERVICE_PORTS:
            return port
