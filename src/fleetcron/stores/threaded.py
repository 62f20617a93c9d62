"""An async face for a sync store whose driver has no native asyncio support here."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from fleetcron.stores.base import Operation, SyncStore

__all__ = ["ThreadedAsyncStore"]

T = TypeVar("T")


class ThreadedAsyncStore:
    """Runs each operation of a :class:`SyncStore` in a worker thread."""

    def __init__(self, store: SyncStore) -> None:
        self.sync = store
        self.url = store.url
        self.capabilities = store.capabilities
        self.ops = store.ops

    async def run(self, operation: Operation[T]) -> T:
        return await asyncio.to_thread(self.sync.run, operation)

    async def migrate(self) -> list[str]:
        return await asyncio.to_thread(self.sync.migrate)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
