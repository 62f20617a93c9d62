"""A store replaced under a running replica (:class:`~fleetcron.errors.StoreReplaced`: the
SQLite file deleted or replaced since the replica opened it).

Whichever part of the replica meets it first — a scheduling pass, a heartbeat, a queue
worker, a run's renewal — the replica learns it through :class:`ReplacedWatch`, which
every part's store calls go through. It is said once, as an error (``store_replaced``),
and the replica stops: it claims nothing more, lets its runs in flight end as on SIGTERM
(their renewals and outcomes are refused by the store like every other call) and then
raises the error, so ``fleetcron run`` exits 78 and a supervisor starts it again on the
file now at the path. It never goes on quietly, and it never reconnects by itself: the
file now at the path may be another fleet's, and which of the two is right is the
operator's call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fleetcron._log import log
from fleetcron.errors import StoreReplaced
from fleetcron.stores.base import AsyncStore, Operation
from fleetcron.stores.wrapped import WrappedStore

__all__ = ["ReplacedWatch"]

T = TypeVar("T")


class ReplacedWatch(WrappedStore):
    """An :class:`~fleetcron.stores.base.AsyncStore` that passes every operation on to
    ``store`` and notices the first :class:`~fleetcron.errors.StoreReplaced`: logs it,
    keeps it in :attr:`error` and calls ``on_replaced`` (once)."""

    def __init__(self, store: AsyncStore, on_replaced: Callable[[], None]) -> None:
        super().__init__(store)
        self._on_replaced = on_replaced
        self.error: StoreReplaced | None = None

    async def run(self, operation: Operation[T]) -> T:
        try:
            return await self._store.run(operation)
        except StoreReplaced as exc:
            self._noticed(exc)
            raise

    def _noticed(self, error: StoreReplaced) -> None:
        if self.error is not None:
            return
        self.error = error
        log.error(
            "%s; this replica claims nothing more, lets its runs in flight end (their "
            "outcomes are not recorded) and exits",
            error,
            extra={"action": "store_replaced", "store": self.url},
        )
        self._on_replaced()
