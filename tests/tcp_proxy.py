"""A TCP proxy for tests: passes bytes both ways until frozen, then holds them.

Frozen, it keeps every connection open and reads nothing, so to the client the server
looks alive but silent — what a paused server or a path swallowing packets looks like.
"""

from __future__ import annotations

import selectors
import socket
import threading

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forward 127.0.0.1:``port`` to ``target``; :meth:`freeze` stops the traffic."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def freeze(self) -> None:
        """Hold every byte from now on, in both directions."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Let the traffic through again."""
        self._flowing.set()

    def close(self) -> None:
        self._stop.set()
        self._flowing.set()
        for thread in self._threads:
            thread.join(5)
        for sock in self._sockets:
            sock.close()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            thread = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            for end in peer:
                selector.register(end, selectors.EVENT_READ, end)
            while not self._stop.is_set():
                if not self._flowing.wait(0.2):
                    continue
                for key, _ in selector.select(0.2):
                    sock: socket.socket = key.data
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        for end in peer:
                            end.close()
                        return
                    peer[sock].sendall(data)
