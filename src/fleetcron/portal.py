"""A portal: an event loop in a daemon thread, for sync code to run async code on.

The sync faces of fleetcron use one: a :class:`~fleetcron.sync.Scheduler` runs the async
scheduler on it, and a sync :class:`~fleetcron.lease.Lease` runs its keepalive there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["Portal"]

T = TypeVar("T")


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
