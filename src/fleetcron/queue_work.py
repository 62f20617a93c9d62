"""A queue worker's loop, written once: claim a batch, handle each item in turn while
the batch's claims are renewed, acknowledge the successes together and give back each
failure at once (:meth:`fleetcron.queue.AsyncQueue.work`).

Only what differs between the two faces is a :class:`WorkSide`: how the handler is called
(awaited on the loop, or in the caller's thread — the sync face's handler uses the
caller's database connection), how the loop pauses and is stopped (an asyncio or a
threading event), and where the renewals run (a task, or a thread). The sync face drives
:func:`drain` with :func:`~fleetcron.bridge.run_inline`: its side never suspends.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fleetcron._log import log
from fleetcron.bridge import Portal, run_inline
from fleetcron.errors import StoreError

if TYPE_CHECKING:
    from fleetcron.queue import AsyncQueue, Claimed, Handler

__all__ = ["LoopSide", "ThreadSide", "WorkSide", "drain", "error_text", "wait_set"]

Wait = Callable[[float], Awaitable[bool]]
"""Waits up to the given seconds; whether the renewals are to stop."""
Renewal = Callable[[Wait], Coroutine[Any, Any, None]]


class WorkSide(Protocol):
    """What a worker's loop does differently on each face (see the module)."""

    def stopped(self) -> bool:
        """Whether the worker is to stop before its next claim."""
        ...

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` with nothing to claim (less once stopped)."""
        ...

    async def call(self, handler: Handler, item: Claimed) -> None:
        """Handle ``item``; raising is the item's failure."""
        ...

    def renew(self, renewal: Renewal) -> Callable[[], Awaitable[None]]:
        """Start ``renewal``; the coroutine function that stops it."""
        ...


async def drain(
    queue: AsyncQueue,
    handler: Handler,
    *,
    size: int,
    idle_s: float,
    until_empty: bool,
    observe: Callable[[str, int], None] | None,
    side: WorkSide,
) -> None:
    """The loop of :meth:`~fleetcron.queue.AsyncQueue.work` (its docstring says what it
    does), claiming up to ``size`` items at a time."""
    while not side.stopped():
        items = await queue.claim(size)
        if not items:
            if until_empty:
                # A claim can come back empty having killed items whose expired claims
                # used up their deliveries, with others still claimable.
                if (await queue.stats()).ready == 0:
                    return
                continue
            await side.pause(idle_s)
            continue
        counts = await _work_batch(queue, handler, items, side)
        _report(observe, len(items), counts)


async def _work_batch(
    queue: AsyncQueue, handler: Handler, items: list[Claimed], side: WorkSide
) -> dict[str, int]:
    tally = _Tally(queue.name)
    lost: set[int] = set()
    stop_renewing = side.renew(lambda wait: _renew(queue, items, lost, wait))
    done: list[Claimed] = []
    try:
        for item in items:
            if item.item_id in lost:
                tally.skipped()
                continue
            try:
                await side.call(handler, item)
            except Exception as exc:  # the item failed; the worker goes on
                tally.failed(item, exc, await queue.nack(item, exc))
            else:
                done.append(item)
    finally:
        await stop_renewing()
        answers = await queue.ack(*done)
    tally.acked(done, answers)
    return tally.counts


async def _renew(queue: AsyncQueue, items: list[Claimed], lost: set[int], wait: Wait) -> None:
    """Renew the batch's claims every third of the visibility until ``wait`` says stop;
    a claim found lost is not handled when its turn comes."""
    every_s = queue.settings.visibility_us / 3e6
    while not await wait(every_s):
        live = [item for item in items if item.item_id not in lost]
        try:
            answers = await queue.extend(*live)
        except StoreError as exc:
            _renewal_failed(queue.name, exc)
            continue
        _note_lost(live, answers, lost)


class LoopSide:
    """The asyncio face's: handlers awaited (a plain function in a worker thread),
    renewals in a task, ``stop`` an :class:`asyncio.Event`."""

    def __init__(self, stop: asyncio.Event | None) -> None:
        self._stop = stop

    def stopped(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def pause(self, seconds: float) -> None:
        if self._stop is None:
            await asyncio.sleep(seconds)
        else:
            await wait_set(self._stop, seconds)

    async def call(self, handler: Handler, item: Claimed) -> None:
        if inspect.iscoroutinefunction(handler):
            await handler(item)
            return
        result = await asyncio.to_thread(handler, item)
        if inspect.isawaitable(result):
            await result

    def renew(self, renewal: Renewal) -> Callable[[], Awaitable[None]]:
        async def sleep(seconds: float) -> bool:
            await asyncio.sleep(seconds)
            return False  # until cancelled

        task = asyncio.create_task(renewal(sleep))

        async def stop() -> None:
            task.cancel()

        return stop


class ThreadSide:
    """The sync face's: handlers called in the caller's thread (a coroutine they return
    awaited on the fleet's portal), renewals in a thread of their own, ``stop`` a
    :class:`threading.Event`. Nothing here suspends: :func:`drain` runs inline."""

    def __init__(self, stop: threading.Event | None, portal: Callable[[], Portal]) -> None:
        self._stop = stop
        self._portal = portal

    def stopped(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def pause(self, seconds: float) -> None:
        if self._stop is None:
            time.sleep(seconds)  # noqa: ASYNC251 -- driven inline, never on a loop
        else:
            self._stop.wait(seconds)

    async def call(self, handler: Handler, item: Claimed) -> None:
        result = handler(item)
        if inspect.isawaitable(result):  # a coroutine function's coroutine
            self._portal().call(_awaited, result)

    def renew(self, renewal: Renewal) -> Callable[[], Awaitable[None]]:
        finished = threading.Event()

        async def wait(seconds: float) -> bool:
            return finished.wait(seconds)

        thread = threading.Thread(
            target=lambda: run_inline(renewal(wait)),
            name="fleetcron-queue-renew",
            daemon=True,
        )
        thread.start()

        async def stop() -> None:
            finished.set()
            thread.join()

        return stop


def error_text(error: BaseException | str) -> str:
    """How a failure is recorded with its item (its first 4,096 characters)."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text[:4096]


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def wait_set(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``event`` is set, or ``timeout_s`` has passed."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass


class _Tally:
    """What one batch of a worker came to (``acked``, ``failed``: given back to be
    retried, ``dead``, ``lost``: its claim expired first), and the log lines of it."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.counts = {"acked": 0, "failed": 0, "dead": 0, "lost": 0}

    def skipped(self) -> None:
        """An item whose claim was lost before its turn: not handled."""
        self.counts["lost"] += 1

    def failed(self, item: Claimed, error: Exception, state: str | None) -> None:
        """The handler raised; ``state`` is what the nack answered."""
        self.counts["lost" if state is None else "dead" if state == "dead" else "failed"] += 1
        log.warning(
            "queue %s: item %d failed (attempt %d): %s%s",
            self.queue,
            item.item_id,
            item.attempt,
            error_text(error),
            "; it is dead" if state == "dead" else "",
            extra={"action": "queue_item_failed", "queue": self.queue},
        )

    def acked(self, done: Sequence[Claimed], answers: Sequence[bool]) -> None:
        """The acknowledgement of the handled items answered ``answers``."""
        for item, acked in zip(done, answers, strict=True):
            self.counts["acked" if acked else "lost"] += 1
            if not acked:
                log.warning(
                    "queue %s: item %d was handled but its claim had been lost: another "
                    "worker may handle it again (fence %d)",
                    self.queue,
                    item.item_id,
                    item.fence,
                    extra={"action": "queue_claim_lost", "queue": self.queue},
                )


def _report(
    observe: Callable[[str, int], None] | None, claimed: int, counts: dict[str, int]
) -> None:
    """Tell ``observe`` what a batch came to: the items ``claimed``, then each outcome."""
    if observe is None:
        return
    observe("claimed", claimed)
    for outcome, count in counts.items():
        if count:
            observe(outcome, count)


def _note_lost(live: Sequence[Claimed], answers: Sequence[int | None], lost: set[int]) -> None:
    lost.update(item.item_id for item, at in zip(live, answers, strict=True) if at is None)


def _renewal_failed(queue: str, error: StoreError) -> None:
    # The claims may still be held: the next renewal tries again before they expire.
    log.warning(
        "queue %s: renewing the batch's claims failed (%s); trying again",
        queue,
        error,
        extra={"action": "queue_renew_failed", "queue": queue},
    )
