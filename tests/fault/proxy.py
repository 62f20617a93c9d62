"""A TCP proxy between workers and a store whose behaviour is switched while it runs.

:class:`FaultProxy` listens on ``127.0.0.1:<spare port>`` and forwards every connection to
``target``. One mode holds at a time and applies to every connection, open or new, from the
moment the call returns:

- :meth:`~FaultProxy.pass_` — forward at once (``pass`` is a keyword).
- :meth:`~FaultProxy.delay` — each chunk read is forwarded ``seconds ± jitter`` later; chunks
  are never reordered (it is a byte stream).
- :meth:`~FaultProxy.blackhole` — forward nothing and keep every socket open, like a
  partition; bytes are held (up to 4 MiB per direction and connection, then the proxy stops
  reading) and delivered when the mode changes, as TCP retransmission would after a heal. A
  new connection is accepted (the kernel completes the handshake) but not connected to the
  target until the mode lets bytes towards the server pass.
- :meth:`~FaultProxy.bandwidth` — forward at most ``bytes_per_s`` per direction and connection.
- :meth:`~FaultProxy.half_close` — shut down the server→client direction of every connection
  (the client reads EOF; what the server sends is dropped); client→server still flows. A
  connection that was half-closed stays so after the mode changes.
- :meth:`~FaultProxy.refuse` — the store is gone, as when its server is stopped: every open
  connection is reset and each new one is reset as soon as it is accepted, until the mode
  changes.

:meth:`~FaultProxy.reset` is an action, not a mode: it sends a RST (``SO_LINGER`` 0, close)
on both sides of every open connection and leaves the mode as it was, so new connections
are accepted. Delay, blackhole and bandwidth take ``direction="to_server"|"to_client"`` to
hit one direction only (e.g. hold the *answer* to an acquire).

The proxy runs an asyncio loop in one daemon thread; every method blocks until the loop
applied it. :meth:`~FaultProxy.close` (also run at exit) closes everything and joins it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import random
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = ["Direction", "FaultProxy"]

Direction = Literal["both", "to_server", "to_client"]

_T = TypeVar("_T")
_CHUNK = 65536
_HELD_MAX = 4 * 1024 * 1024  # per pipe: held/delayed bytes before the proxy stops reading
_LINGER_ZERO = struct.pack("ii", 1, 0)


@dataclass(frozen=True, slots=True)
class _Mode:
    name: Literal["pass", "delay", "blackhole", "bandwidth", "half_close", "refuse"]
    directions: frozenset[str] = frozenset({"to_server", "to_client"})
    delay_s: float = 0.0
    jitter_s: float = 0.0
    bytes_per_s: float = 0.0

    def hits(self, direction: str, name: str) -> bool:
        return self.name == name and direction in self.directions


def _directions(direction: Direction) -> frozenset[str]:
    if direction == "both":
        return frozenset({"to_server", "to_client"})
    if direction in ("to_server", "to_client"):
        return frozenset({direction})
    raise ValueError(f"direction must be both, to_server or to_client, not {direction!r}")


class _Pipe:
    """One direction of one connection: chunks read, waiting for their time to be written."""

    def __init__(self, direction: str) -> None:
        self.direction = direction
        self.queue: deque[tuple[float, bytes]] = deque()  # (due monotonic, data); b"" = EOF
        self.queued = 0
        self.last_due = 0.0
        self.next_send = 0.0  # bandwidth pacing
        self.reading = True  # False once the source sent EOF or failed
        self.kick = asyncio.Event()  # new data, space or a mode change
        self.space = asyncio.Event()


class _Connection:
    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.pipes = {name: _Pipe(name) for name in ("to_server", "to_client")}
        self.tasks: list[asyncio.Task[None]] = []
        self.half_closed = False
        self.closed = False
        self.kick = asyncio.Event()  # wakes the handler waiting to connect upstream

    def wake(self) -> None:
        self.kick.set()
        for pipe in self.pipes.values():
            pipe.kick.set()

    def writers(self) -> list[asyncio.StreamWriter]:
        return [self.client] if self.server is None else [self.client, self.server]

    def half_close(self) -> None:
        if self.half_closed or self.closed:
            return
        self.half_closed = True
        pipe = self.pipes["to_client"]
        pipe.queue.clear()
        pipe.queued = 0
        pipe.space.set()
        with contextlib.suppress(OSError, RuntimeError):
            if self.client.can_write_eof():
                self.client.write_eof()
        self.wake()

    async def close(self, *, rst: bool) -> None:
        """Close both sides (``rst``: with a RST) and stop this connection's tasks."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for writer in self.writers():
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError, RuntimeError):
                if rst and sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                    writer.transport.abort()
                else:
                    writer.close()
        for writer in self.writers():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5)
        self.wake()


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target`` with a switchable fault mode (see module doc).

    ``seed`` makes the jitter reproducible."""

    def __init__(self, target: tuple[str, int], *, seed: int | None = None) -> None:
        self.target = target
        self._random = random.Random(seed)
        self._mode = _Mode("pass")
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._accepted = 0
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"FaultProxy->{target[1]}", daemon=True
        )
        self._thread.start()
        try:
            self._server = self._call(self._start())
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            raise
        sockname = self._server.sockets[0].getsockname()
        self.port: int = sockname[1]
        atexit.register(self.close)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- modes ------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """The name of the current mode (``pass``, ``delay``, ``blackhole``, …)."""
        return self._mode.name

    def pass_(self) -> None:
        """Forward everything at once again (held bytes are delivered now)."""
        self._set_mode(_Mode("pass"))

    def delay(self, seconds: float, jitter: float = 0.0, *, direction: Direction = "both") -> None:
        """Forward each chunk read from now on ``seconds`` ± ``jitter`` (uniform, >= 0) later."""
        if seconds < 0 or jitter < 0:
            raise ValueError("delay and jitter must be >= 0")
        self._set_mode(_Mode("delay", _directions(direction), seconds, jitter))

    def blackhole(self, *, direction: Direction = "both") -> None:
        """Forward nothing, keep the sockets open; held bytes go through when the mode changes."""
        self._set_mode(_Mode("blackhole", _directions(direction)))

    def bandwidth(self, bytes_per_s: float, *, direction: Direction = "both") -> None:
        """Forward at most ``bytes_per_s`` per direction and connection."""
        if bytes_per_s <= 0:
            raise ValueError("bytes_per_s must be > 0 (use blackhole() to stop the traffic)")
        self._set_mode(_Mode("bandwidth", _directions(direction), bytes_per_s=bytes_per_s))

    def half_close(self) -> None:
        """Shut down server→client on every connection now and on each new one."""
        self._set_mode(_Mode("half_close", frozenset({"to_client"})))

    def refuse(self) -> None:
        """Reset every open connection now, and every new one as soon as it is accepted."""
        self._set_mode(_Mode("refuse", frozenset()))

    def reset(self) -> int:
        """RST both sides of every open connection now; the mode stays. Returns how many."""
        return self._call(self._reset())

    @property
    def connections(self) -> int:
        """How many client connections are open now."""
        return self._call(self._count())

    def pending(self, direction: Direction = "both") -> int:
        """Bytes read and not yet forwarded (held or delayed) in ``direction``, e.g. to wait
        until the answer to a call is held: ``pending("to_client") > 0``."""
        return self._call(self._pending(_directions(direction)))

    @property
    def accepted(self) -> int:
        """How many client connections were accepted since the start."""
        return self._accepted

    def close(self) -> None:
        """Stop listening, close every connection, stop and join the thread (idempotent)."""
        if self._closed:
            return
        atexit.unregister(self.close)
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=20)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(20)
        if not self._thread.is_alive():
            self._loop.close()

    # -- the loop side ----------------------------------------------------------------------
    def _call(self, coroutine: Coroutine[Any, Any, _T], timeout: float = 10) -> _T:
        if self._closed or threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("the proxy is closed (or called from its own thread)")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _set_mode(self, mode: _Mode) -> None:
        self._call(self._apply(mode))

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=128)

    async def _apply(self, mode: _Mode) -> None:
        self._mode = mode
        if mode.name == "refuse":
            await self._reset()
        for connection in list(self._connections):
            if mode.name == "half_close":
                connection.half_close()
            connection.wake()

    async def _pending(self, directions: frozenset[str]) -> int:
        return sum(
            pipe.queued
            for connection in self._connections
            for name, pipe in connection.pipes.items()
            if name in directions and not connection.closed
        )

    async def _count(self) -> int:
        return sum(1 for connection in self._connections if not connection.closed)

    async def _reset(self) -> int:
        victims = [c for c in self._connections if not c.closed]
        await asyncio.gather(*(c.close(rst=True) for c in victims))
        return len(victims)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(c.close(rst=False) for c in list(self._connections)))
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=10)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        self._connections.add(connection)
        self._accepted += 1
        try:
            await self._run(connection, reader)
        except asyncio.CancelledError:
            pass
        finally:
            await connection.close(rst=False)
            self._connections.discard(connection)
            if handler is not None:
                self._handlers.discard(handler)

    async def _run(self, connection: _Connection, client_reader: asyncio.StreamReader) -> None:
        if self._mode.name == "refuse":
            await connection.close(rst=True)
            return
        # In a blackhole towards the server even the connection attempt is held.
        while self._mode.hits("to_server", "blackhole") and not connection.closed:
            connection.kick.clear()
            await connection.kick.wait()
        if connection.closed:
            return
        try:
            server_reader, server_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), 10
            )
        except (OSError, TimeoutError):
            await connection.close(rst=True)  # what a refused connection looks like here
            return
        if connection.closed:
            server_writer.transport.abort()
            return
        connection.server = server_writer
        if self._mode.name == "half_close":
            connection.half_close()
        pumps = [
            self._read(connection, client_reader, connection.pipes["to_server"]),
            self._write(connection, server_writer, connection.pipes["to_server"]),
            self._read(connection, server_reader, connection.pipes["to_client"]),
            self._write(connection, connection.client, connection.pipes["to_client"]),
        ]
        connection.tasks = [asyncio.ensure_future(pump) for pump in pumps]
        done, _ = await asyncio.wait(connection.tasks, return_when=asyncio.FIRST_EXCEPTION)
        # A failure on one side (a reset, a broken pipe) is passed on as a reset.
        failed = any(not t.cancelled() and t.exception() is not None for t in done)
        await connection.close(rst=failed)

    def _due(self, pipe: _Pipe) -> float:
        now = time.monotonic()
        mode = self._mode
        if mode.hits(pipe.direction, "delay"):
            extra = mode.delay_s + self._random.uniform(-mode.jitter_s, mode.jitter_s)
            now += max(0.0, extra)
        pipe.last_due = max(pipe.last_due, now)  # a byte stream: never reorder
        return pipe.last_due

    async def _read(
        self, connection: _Connection, reader: asyncio.StreamReader, pipe: _Pipe
    ) -> None:
        try:
            while not connection.closed:
                while pipe.queued >= _HELD_MAX and not connection.closed:
                    pipe.space.clear()
                    await pipe.space.wait()
                data = await reader.read(_CHUNK)
                if connection.closed:
                    return
                if not (pipe.direction == "to_client" and connection.half_closed):
                    pipe.queue.append((self._due(pipe), data))
                    pipe.queued += len(data)
                if not data:
                    return
                pipe.kick.set()
        finally:
            pipe.reading = False
            pipe.kick.set()

    async def _write(
        self, connection: _Connection, writer: asyncio.StreamWriter, pipe: _Pipe
    ) -> None:
        while not connection.closed:
            pipe.kick.clear()
            if pipe.direction == "to_client" and connection.half_closed:
                pipe.queue.clear()  # the client will read nothing more: drop it
                pipe.queued = 0
                pipe.space.set()
                if not pipe.reading:
                    return
                await pipe.kick.wait()
                continue
            if not pipe.queue or self._mode.hits(pipe.direction, "blackhole"):
                await pipe.kick.wait()
                continue
            due, data = pipe.queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pipe.kick.wait(), wait)
                continue
            if not data:  # EOF from the other side: pass it on, then this pipe is done
                pipe.queue.popleft()
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if self._mode.hits(pipe.direction, "bandwidth"):
                rate = self._mode.bytes_per_s
                data = data[: max(1, int(rate / 20))]  # ~50 ms worth per write
                now = time.monotonic()
                if pipe.next_send > now:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(pipe.kick.wait(), pipe.next_send - now)
                    continue
                pipe.next_send = max(now, pipe.next_send) + len(data) / rate
            writer.write(data)
            rest = pipe.queue[0][1][len(data) :]
            if rest:
                pipe.queue[0] = (due, rest)
            else:
                pipe.queue.popleft()
            pipe.queued -= len(data)
            pipe.space.set()
            await writer.drain()
