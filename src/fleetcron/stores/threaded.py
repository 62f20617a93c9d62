"""An async face for a sync store: each operation runs in a worker thread — or, driven by
:func:`run_inline`, in the caller's thread there and then.

The second way lets a coroutine written once (a lease's renewal and release,
:class:`~fleetcron.lease.AsyncLease`) serve sync code without a thread hop on its hot path,
while the same coroutine awaited on an event loop (the keepalive) never blocks the loop: a
renewal that hangs runs in its worker thread, and the deadline still passes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from fleetcron.stores.base import Operation, SyncStore

__all__ = ["ThreadedAsyncStore", "run_inline"]

T = TypeVar("T")

_inline = threading.local()


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


class ThreadedAsyncStore:
    """Runs each operation of a :class:`SyncStore` in a worker thread (in the caller's
    thread under :func:`run_inline`)."""

    def __init__(self, store: SyncStore) -> None:
        self.sync = store
        self.url = store.url
        self.capabilities = store.capabilities
        self.ops = store.ops

    async def run(self, operation: Operation[T]) -> T:
        if getattr(_inline, "active", False):
            return self.sync.run(operation)
        return await asyncio.to_thread(self.sync.run, operation)

    async def migrate(self) -> list[str]:
        return await asyncio.to_thread(self.sync.migrate)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
