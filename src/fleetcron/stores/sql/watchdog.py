"""The read timeout psycopg lacks: cut a connection whose server stops answering.

libpq bounds the connect (``connect_timeout``) but not a reply: a server that is paused, or
a network path that swallows packets while the kernel still acknowledges them, leaves the
client waiting for ever (TCP keepalives are answered by the server's kernel). Before each
round trip the store arms a deadline; one daemon thread for the whole process shuts the
socket down when a deadline passes, and the driver, blocked on the socket, wakes on
end-of-file and raises its "connection lost" error, which the store reports as the timeout.
Arming and disarming are a dictionary operation under a lock: the thread is only woken
when a new deadline comes before the one it sleeps towards.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time

__all__ = ["Deadline", "deadline"]


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (deadline, fd)
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> int:
        at = time.monotonic() + seconds
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = (at, fd)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="fleetcron-watchdog", daemon=True
                )
                self._thread.start()
            elif at < self._wake_at:
                self._cond.notify()
        return token

    def disarm(self, token: int) -> bool:
        """Forget ``token``; whether its deadline had passed (the socket was cut)."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for token, (at, fd) in list(self._armed.items()):
                    if at <= now:
                        # Under the lock: the owner cannot disarm and close the socket (so
                        # the descriptor cannot be reused) while it is being cut.
                        del self._armed[token]
                        self._fired.add(token)
                        _cut(fd)
                self._wake_at = min((at for at, _ in self._armed.values()), default=now + 60)
                self._cond.wait(max(0.0, self._wake_at - now))


def _cut(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


_WATCHDOG = _Watchdog()


class Deadline:
    """What :func:`deadline` yields: ``expired`` tells, after the block, whether the
    socket was cut because the deadline passed."""

    __slots__ = ("_fd", "_seconds", "_token", "expired")

    def __init__(self, fd: int, seconds: float) -> None:
        self._fd = fd
        self._seconds = seconds
        self._token = -1
        self.expired = False

    def __enter__(self) -> Deadline:
        self._token = _WATCHDOG.arm(self._fd, self._seconds)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.expired = _WATCHDOG.disarm(self._token)


def deadline(fd: int, seconds: float) -> Deadline:
    """Cut the socket ``fd`` if the block has not ended ``seconds`` from now (a context
    manager; a class, not a generator: it is entered on every round trip)."""
    return Deadline(fd, seconds)
