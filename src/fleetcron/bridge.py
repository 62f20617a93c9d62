"""The bridge between sync and async code: one room for every way fleetcron crosses it.

fleetcron is written once, async (leases, the scheduler, the queue); its sync faces cross
to it in three ways, each for a reason:

- :class:`Portal` — an event loop in a daemon thread, for sync code to run async code on:
  a sync :class:`~fleetcron.sync.Scheduler` runs the async scheduler there, a sync
  :class:`~fleetcron.lease.Lease` its keepalive, a sync queue worker its renewals.
- :func:`run_inline` over a :class:`ThreadedAsyncStore` — a coroutine written once (a
  lease's renewal and release) driven in the caller's thread there and then, without a
  thread hop on its hot path, while the same coroutine awaited on a loop (the keepalive)
  runs each store call in a worker thread, so a call that hangs never blocks the loop.
- :func:`call_on_loop` — the other way: a job's thread calling the scheduler's loop
  (``ctx.checkpoint`` and ``ctx.queue`` in a plain ``def`` job).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fleetcron.errors import ConfigurationError
from fleetcron.stores.base import Operation, SyncStore

__all__ = ["Portal", "ThreadedAsyncStore", "call_on_loop", "run_blocking", "run_inline"]

T = TypeVar("T")

_inline = threading.local()


class Portal:
    """An event loop running in a daemon thread, for sync code to call async code on."""

    def __init__(self, name: str = "fleetcron-portal") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the portal's loop; its result as a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await ``function(*args)`` on the portal's loop and return its result here."""

        async def call() -> T:
            return await function(*args)

        return self.spawn(call()).result()

    def call_soon(self, function: Callable[..., object], *args: Any) -> None:
        """Call ``function(*args)`` on the portal's loop, without waiting."""
        self._loop.call_soon_threadsafe(function, *args)

    def close(self, timeout: float | None = 10) -> None:
        """Stop the loop (tasks still running are cancelled) and join its thread."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


def run_inline(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion in this thread. Over a :class:`ThreadedAsyncStore`
    it never suspends; if it did, that is a bug."""
    outer = getattr(_inline, "active", False)  # a nested call must not end the outer one
    _inline.active = True
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        _inline.active = outer
    coroutine.close()
    raise RuntimeError("an operation driven inline waited on the event loop")


async def run_blocking(function: Callable[..., T], *args: Any) -> T:
    """Call the blocking ``function(*args)``: in this thread under :func:`run_inline`
    (the sync face's call, there and then), else in a worker thread, so that it never
    blocks the event loop — what :class:`ThreadedAsyncStore` does for a store call."""
    if getattr(_inline, "active", False):
        return function(*args)
    return await asyncio.to_thread(function, *args)


class ThreadedAsyncStore:
    """Runs each operation of a :class:`SyncStore` in a worker thread (in the caller's
    thread under :func:`run_inline`)."""

    def __init__(self, store: SyncStore) -> None:
        self.sync = store
        self.url = store.url
        self.capabilities = store.capabilities
        self.ops = store.ops
        # A store's own retention default (etcd's), seen through the wrapper.
        self.default_retention: object = getattr(store, "default_retention", None)

    async def run(self, operation: Operation[T]) -> T:
        if getattr(_inline, "active", False):
            return self.sync.run(operation)
        return await asyncio.to_thread(self.sync.run, operation)

    async def migrate(self) -> list[str]:
        return await asyncio.to_thread(self.sync.migrate)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)


def call_on_loop(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T], *, instead: str
) -> T:
    """Run ``coroutine`` on ``loop`` and wait for it here. Called on the loop itself (from
    an ``async def`` job) it would wait forever: refused, saying what to use ``instead``."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise ConfigurationError(f"this call blocks: in an async job use {instead}")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()
