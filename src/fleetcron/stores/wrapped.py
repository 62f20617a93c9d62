"""An async store that passes everything on to another one: the base of the wrappers that
watch a replica's store calls (its metrics, a replaced SQLite file), each overriding
:meth:`WrappedStore.run` only."""

from __future__ import annotations

from typing import TypeVar

from fleetcron.stores.base import AsyncStore, Capability, Operation, Operations

__all__ = ["WrappedStore"]

T = TypeVar("T")


class WrappedStore:
    """An :class:`~fleetcron.stores.base.AsyncStore` over ``store``: its URL, capabilities
    and operations, and every call passed on as it is."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store

    @property
    def url(self) -> str:
        return self._store.url

    @property
    def capabilities(self) -> Capability:
        return self._store.capabilities

    @property
    def ops(self) -> Operations:
        return self._store.ops

    @property
    def default_retention(self) -> object:
        """The wrapped store's own retention default, if it has one (etcd's)."""
        return getattr(self._store, "default_retention", None)

    async def run(self, operation: Operation[T]) -> T:
        return await self._store.run(operation)

    async def migrate(self) -> list[str]:
        return await self._store.migrate()

    async def close(self) -> None:
        await self._store.close()
