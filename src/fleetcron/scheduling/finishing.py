"""Group commit of outcomes: the attempts of one replica that end together record their
outcomes in one round trip (:meth:`~fleetcron.stores.base.Operations.run_finish_many`).

No finish waits for a timer. The first one to arrive starts a flush on the next turn of
the event loop, so the attempts ending in the same turn share it; those that end while a
flush is in flight go together in the next one, sent as soon as it returns. An idle store
sees one round trip per outcome, a busy one far fewer: the batch grows with the load.

Each finish is decided by the store on its own (its fence, its lease), so one refused
outcome never spoils the others. A store error fails every finish of the batch with that
error; each one's lease then tries again on its own schedule (:meth:`AsyncSlotLease.finish`
retries until the lease's local deadline), through the next batch.
"""

from __future__ import annotations

import asyncio

from fleetcron.models import RunFinish
from fleetcron.stores.base import AsyncStore
from fleetcron.stores.ledger import OUTPUT_LIMIT

__all__ = ["FINISH_BATCH", "FINISH_BATCH_CHARS", "FinishBatcher"]

FINISH_BATCH = 200
"""At most this many outcomes per round trip."""

FINISH_BATCH_CHARS = 1_000_000
"""A batch is closed once the text of its outcomes (output and error) passes this size,
so a batch of long outputs stays far below any server's packet limit."""


class FinishBatcher:
    """Records the outcomes handed to :meth:`finish`, many per round trip."""

    def __init__(self, store: AsyncStore, namespace: str) -> None:
        self._store = store
        self._namespace = namespace
        self._waiting: list[tuple[RunFinish, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self.round_trips = 0
        """Batches sent so far (for the tests and the benchmarks)."""

    async def finish(self, item: RunFinish) -> bool:
        """Record one outcome; whether the store took it (``False``: the fence is no longer
        current). Raises the batch's :class:`~fleetcron.errors.StoreError` if the store
        failed."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        # Its error is read here even if the run was cancelled meanwhile (no "exception
        # never retrieved" at collection).
        future.add_done_callback(_retrieve)
        self._waiting.append((item, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush(), name="fleetcron-finish")
        # Shielded: a run cancelled while its outcome is in flight must not cancel the
        # batch of the others; the outcome is recorded all the same.
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch = [(item, future) for item, future in self._take() if not future.done()]
                if batch:
                    await self._send(batch)
        except BaseException:
            # Cancelled (the loop is closing): nobody may wait for an answer forever.
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()
            raise
        finally:
            self._flushing = None

    async def _send(self, batch: list[tuple[RunFinish, asyncio.Future[bool]]]) -> None:
        self.round_trips += 1
        try:
            answers = await self._store.run(
                self._store.ops.run_finish_many(self._namespace, [item for item, _ in batch])
            )
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), accepted in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(accepted)

    def _take(self) -> list[tuple[RunFinish, asyncio.Future[bool]]]:
        """The next batch: up to :data:`FINISH_BATCH` outcomes, or fewer once their text
        passes :data:`FINISH_BATCH_CHARS` (always at least one)."""
        size, count = 0, 0
        for item, _ in self._waiting:
            if count == FINISH_BATCH or (count and size >= FINISH_BATCH_CHARS):
                break
            output = min(len(item.outcome.output or ""), OUTPUT_LIMIT)  # what is stored
            size += output + len(item.outcome.error or "")
            count += 1
        batch, self._waiting = self._waiting[:count], self._waiting[count:]
        return batch


def _retrieve(future: asyncio.Future[bool]) -> None:
    if not future.cancelled():
        future.exception()
