"""Work queues: chunked work spread over the fleet, a crash costing one batch
(docs/queues.md, docs/design/queue.md).

A job that would hold one lock for an hour loses everything to a crash at minute 50. Put
the work in a queue instead — a scheduled job enqueues, every replica's workers drain — and
a crash costs the batch the crashed worker held: its claims expire and the items are
delivered again, with higher fences.

:class:`AsyncQueue` is the core and :class:`Queue` its sync face; both come from a fleet
(``fleet.queue("emails")``). Items are JSON values (never pickle). Each delivery is a
:class:`Claimed` item with its own lease (``expires_us``, on the store's clock) and fencing
token (``fence``), so the item's effects can refuse a stale worker
(:mod:`fleetcron.fencing`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from fleetcron._log import log
from fleetcron.bridge import Portal, call_on_loop
from fleetcron.durations import DurationLike, format_duration, to_micros
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.jsonvalue import encode_json
from fleetcron.lease import new_holder
from fleetcron.names import validate_name
from fleetcron.queue_models import ITEM_STATES, QueueItem, QueueNack, QueuePut, QueueStats
from fleetcron.stores.base import QUEUE_PRUNE_LIMIT, AsyncStore, SyncStore

__all__ = [
    "MAX_ITEM_BYTES",
    "MAX_ITEM_ID",
    "AsyncQueue",
    "Claimed",
    "Entry",
    "JobQueue",
    "Queue",
    "QueueSettings",
    "wait_set",
]

MAX_ITEM_BYTES = 1_048_576
"""The largest item, as UTF-8 JSON text (1 MiB): a queue carries work, not data."""
MAX_BATCH = 10_000
"""The most items one put, claim or acknowledgement may carry."""
MAX_ITEM_ID = 2**63 - 1
"""The largest item id: ids count up from 1 in a signed 64-bit integer on every store."""

Handler: TypeAlias = Callable[["Claimed"], Any]
"""A worker's handler: called with each item; returning is success, raising is failure.
A coroutine function is awaited; a plain function runs in a thread."""


@dataclass(frozen=True, slots=True)
class Entry:
    """An item to put with options: its ``value``, a ``dedupe_key`` (an item whose key
    the queue already holds is not put again) and a ``delay`` before it is claimable."""

    value: Any
    dedupe_key: str | None = None
    delay: DurationLike = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSettings:
    """A queue's policies: how long a claim lasts unless extended (``visibility_us``),
    how many deliveries an item gets before it is dead (``max_attempts``), and the
    back-off after a failure — ``retry_backoff_us`` after the first, doubled after each
    next one, at most ``retry_backoff_max_us``."""

    visibility_us: int = 300_000_000
    max_attempts: int = 5
    retry_backoff_us: int = 10_000_000
    retry_backoff_max_us: int = 3_600_000_000

    @classmethod
    def of(
        cls,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> QueueSettings:
        """Settings from durations (``"5m"``, seconds, ``timedelta``), checked."""
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise ConfigurationError(f"max_attempts must be an integer, not {max_attempts!r}")
        if not 1 <= max_attempts <= 1000:
            raise ConfigurationError(f"max_attempts must be 1 to 1000, not {max_attempts}")
        settings = cls(
            visibility_us=_positive(visibility, "visibility"),
            max_attempts=max_attempts,
            retry_backoff_us=_not_negative(retry_backoff, "retry_backoff"),
            retry_backoff_max_us=_not_negative(retry_backoff_max, "retry_backoff_max"),
        )
        if settings.retry_backoff_max_us < settings.retry_backoff_us:
            raise ConfigurationError(
                f"retry_backoff_max ({format_duration(settings.retry_backoff_max_us)}) is "
                f"shorter than retry_backoff ({format_duration(settings.retry_backoff_us)})"
            )
        return settings

    def backoff_us(self, attempts: int) -> int:
        """The wait before the next delivery of an item that failed its ``attempts``-th."""
        doublings = min(max(attempts - 1, 0), 62)
        return min(self.retry_backoff_us * (1 << doublings), self.retry_backoff_max_us)


@dataclass(frozen=True, slots=True)
class Claimed:
    """One delivery of an item: ``value`` (the JSON decoded), ``fence`` (this delivery's
    fencing token, higher than every earlier delivery's of the item), ``attempt`` (1 for
    the first delivery), and the row as claimed (``item``: its claim expires at
    ``item.available_us`` on the store's clock unless extended)."""

    queue: str
    item_id: int
    value: Any
    fence: int
    attempt: int
    item: QueueItem

    @property
    def claim(self) -> tuple[int, int]:
        """``(item_id, fence)``: what names this delivery to the store."""
        return (self.item_id, self.fence)


def _positive(value: DurationLike, what: str) -> int:
    micros = to_micros(value, what=what)
    if micros <= 0:
        raise ConfigurationError(f"{what} must be longer than 0, not {value!r}")
    return micros


def _not_negative(value: DurationLike, what: str) -> int:
    micros = to_micros(value, what=what)
    if micros < 0:
        raise ConfigurationError(f"{what} must not be negative, not {value!r}")
    return micros


def _visibility(settings: QueueSettings, visibility: DurationLike | None) -> int:
    if visibility is None:
        return settings.visibility_us
    return _positive(visibility, "visibility")


def _states(states: Sequence[str] | None) -> list[str] | None:
    """``states`` as a list of known item states (one name alone is one state, not its
    characters)."""
    if states is None:
        return None
    wanted = [states] if isinstance(states, str) else list(states)
    unknown = [state for state in wanted if state not in ITEM_STATES]
    if unknown:
        raise ConfigurationError(
            f"unknown item state(s) {', '.join(map(repr, unknown))}: "
            f"states are {', '.join(ITEM_STATES)}"
        )
    return wanted


def _item_ids(item_ids: Sequence[int]) -> list[int]:
    """``item_ids`` as a list of ids, or a clear error (not a driver's)."""
    if isinstance(item_ids, int | str | bytes):
        raise ConfigurationError(f"item_ids is a list of item ids, not {item_ids!r}")
    ids = list(item_ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise ConfigurationError(f"an item id is an integer, not {bad[0]!r}")
    # An id no store can hold names no item; PostgreSQL would fail the whole call on it.
    outside = [i for i in ids if not 1 <= i <= MAX_ITEM_ID]
    if outside:
        raise ConfigurationError(f"an item id is 1 to {MAX_ITEM_ID}, not {outside[0]}")
    return ids


def _batch_size(batch: object, what: str = "batch") -> int:
    if isinstance(batch, bool) or not isinstance(batch, int):
        raise ConfigurationError(f"{what} must be an integer, not {batch!r}")
    if not 1 <= batch <= MAX_BATCH:
        raise ConfigurationError(f"{what} must be 1 to {MAX_BATCH}, not {batch}")
    return batch


def encode(value: Any, *, where: str = "item") -> str:
    """``value`` as the JSON text a queue stores (:func:`~fleetcron.jsonvalue.encode_json`)."""
    return encode_json(
        value,
        where=where,
        limit=MAX_ITEM_BYTES,
        too_big="put a reference to the data in the queue instead",
    )


def _dedupe_key(key: object, where: str) -> str | None:
    if key is None:
        return None
    return validate_name(key, what=f"{where}: dedupe key")


def to_puts(
    values: Iterable[Any], settings: QueueSettings, *, dedupe_key: str | None, delay: DurationLike
) -> list[QueuePut]:
    """The store's puts of ``values`` (each a value or an :class:`Entry`), checked."""
    puts = []
    for index, value in enumerate(values):
        where = f"item {index}"
        entry = value if isinstance(value, Entry) else Entry(value, dedupe_key, delay)
        puts.append(
            QueuePut(
                payload=encode(entry.value, where=where),
                dedupe_key=_dedupe_key(entry.dedupe_key, where),
                delay_us=_not_negative(entry.delay, f"{where}: delay"),
                max_attempts=settings.max_attempts,
            )
        )
    if len(puts) > MAX_BATCH:
        raise ConfigurationError(f"at most {MAX_BATCH} items go in one put, not {len(puts)}")
    return puts


def claimed(item: QueueItem) -> Claimed:
    """The delivery of a claimed row."""
    return Claimed(
        queue=item.queue,
        item_id=item.item_id,
        value=json.loads(item.payload),
        fence=item.fence,
        attempt=item.attempts,
        item=item,
    )


def _nack_of(
    settings: QueueSettings,
    item: Claimed,
    error: BaseException | str,
    retry_in: DurationLike | None,
) -> QueueNack:
    """The give-back of ``item``: claimable again after ``retry_in``, or the queue's
    back-off for the attempt it failed."""
    wait = (
        settings.backoff_us(item.attempt)
        if retry_in is None
        else _not_negative(retry_in, "retry_in")
    )
    return QueueNack(
        item_id=item.item_id, fence=item.fence, error=_error_text(error), retry_in_us=wait
    )


def _empty_stats(namespace: str, queue: str, now_us: int) -> QueueStats:
    """The standing of a queue that holds nothing."""
    return QueueStats(
        namespace=namespace,
        queue=queue,
        ready=0,
        scheduled=0,
        claimed=0,
        done=0,
        dead=0,
        oldest_us=None,
        now_us=now_us,
    )


def _error_text(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text[:4096]


class AsyncQueue:
    """A named queue of a fleet's namespace (asyncio). Get one with
    ``fleet.queue(name, …)`` on an :class:`~fleetcron.AsyncFleet`."""

    def __init__(
        self, store: AsyncStore, namespace: str, name: str, settings: QueueSettings
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = validate_name(name, what="queue name")
        self.settings = settings
        self.holder = new_holder()

    async def put(
        self, value: Any, *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> int | None:
        """Queue one JSON value; its id, or ``None`` when ``dedupe_key`` is taken."""
        (answer,) = await self.put_many([Entry(value, dedupe_key, delay)])
        return answer

    async def put_many(
        self,
        values: Iterable[Any],
        *,
        dedupe_key: str | None = None,
        delay: DurationLike = 0,
    ) -> list[int | None]:
        """Queue many values (or :class:`Entry` items) in one round trip; each one's id,
        or ``None`` for one whose dedupe key is taken."""
        return await self.put_encoded(
            to_puts(values, self.settings, dedupe_key=dedupe_key, delay=delay)
        )

    async def put_encoded(self, puts: list[QueuePut]) -> list[int | None]:
        """Queue items :func:`to_puts` has encoded already (one round trip)."""
        if not puts:
            return []
        return await self.store.run(self.store.ops.queue_put(self.namespace, self.name, puts))

    async def claim(
        self, batch: int = 1, *, visibility: DurationLike | None = None
    ) -> list[Claimed]:
        """Claim up to ``batch`` items for this worker, each held for ``visibility`` (the
        queue's, by default) unless extended. Fewer than ``batch`` (or none) when fewer
        are claimable; never waits."""
        size = _batch_size(batch)
        ttl = _visibility(self.settings, visibility)
        items = await self.store.run(
            self.store.ops.queue_claim(self.namespace, self.name, self.holder, size, ttl)
        )
        return [claimed(item) for item in items]

    async def ack(self, *items: Claimed) -> list[bool]:
        """Mark deliveries done, in one round trip; ``False`` for one whose claim was
        lost (expired and delivered again, or finished already): its work may be redone
        by another worker — which is what the fence is for."""
        if not items:
            return []
        pairs = [item.claim for item in items]
        return await self.store.run(self.store.ops.queue_ack(self.namespace, self.name, pairs))

    async def nack(
        self, item: Claimed, error: BaseException | str, *, retry_in: DurationLike | None = None
    ) -> str | None:
        """Give a delivery back as failed: claimable again after ``retry_in`` (the queue's
        back-off for its attempt, by default), or ``dead`` once its attempts are used up.
        The new state, or ``None`` when the claim was lost already."""
        nack = _nack_of(self.settings, item, error, retry_in)
        (state,) = await self.store.run(
            self.store.ops.queue_nack(self.namespace, self.name, [nack])
        )
        return state

    async def extend(
        self, *items: Claimed, visibility: DurationLike | None = None
    ) -> list[int | None]:
        """Hold deliveries ``visibility`` longer from now (store clock); each one's new
        expiry, or ``None`` when its claim was lost."""
        if not items:
            return []
        pairs = [item.claim for item in items]
        ttl = _visibility(self.settings, visibility)
        return await self.store.run(
            self.store.ops.queue_extend(self.namespace, self.name, pairs, ttl)
        )

    async def stats(self) -> QueueStats:
        """How the queue stands now (all zero when it holds nothing)."""
        found = await self.store.run(self.store.ops.queue_stats(self.namespace, self.name))
        if found:
            return found[0]
        return _empty_stats(
            self.namespace, self.name, await self.store.run(self.store.ops.store_now())
        )

    async def items(
        self, *, states: Sequence[str] | None = None, limit: int = 100
    ) -> list[QueueItem]:
        """The queue's items in ``states`` (any, by default), newest first."""
        size = _batch_size(limit, "limit")
        return await self.store.run(
            self.store.ops.queue_list(self.namespace, self.name, _states(states), size)
        )

    async def requeue(self, item_ids: Sequence[int]) -> int:
        """Give dead items their deliveries back; how many were dead."""
        return await self.store.run(
            self.store.ops.queue_requeue(self.namespace, self.name, _item_ids(item_ids))
        )

    async def prune(self, older_than: DurationLike = "7d") -> int:
        """Delete items done or dead for ``older_than`` (their dedupe keys become free);
        how many (at most 1,000 a call)."""
        age = _not_negative(older_than, "older_than")
        return await self.store.run(
            self.store.ops.queue_prune(self.namespace, self.name, age, QUEUE_PRUNE_LIMIT)
        )

    async def work(
        self,
        handler: Handler,
        *,
        batch: int = 10,
        idle: DurationLike = "1s",
        stop: asyncio.Event | None = None,
        until_empty: bool = False,
        observe: Callable[[str, int], None] | None = None,
    ) -> None:
        """Drain the queue until ``stop`` is set (forever without one): claim up to
        ``batch`` items, call ``handler`` on each in turn while the batch's claims are
        renewed every third of the visibility, acknowledge the successes together at the
        end of the batch and give back each failure (:meth:`nack`) at once. An item whose
        claim was lost before its turn is not handled. With nothing to claim it waits
        ``idle`` (or until ``stop``) — or returns, with ``until_empty``, once nothing is
        claimable (a claim that only killed items does not end it). ``observe`` is
        told how many items each batch ``claimed``, ``acked``, ``failed`` (given back to
        be retried), killed (``dead``) and ``lost`` (its claim expired before it was
        acknowledged)."""
        size = _batch_size(batch)
        idle_s = _positive(idle, "idle") / 1e6
        while stop is None or not stop.is_set():
            items = await self.claim(size)
            if not items:
                if until_empty:
                    # A claim can come back empty having killed items whose expired
                    # claims used up their deliveries, with others still claimable.
                    if (await self.stats()).ready == 0:
                        return
                    continue
                if stop is None:
                    await asyncio.sleep(idle_s)
                else:
                    await wait_set(stop, idle_s)
                continue
            counts = await self._work_batch(handler, items)
            _report(observe, len(items), counts)

    async def _work_batch(self, handler: Handler, items: list[Claimed]) -> dict[str, int]:
        tally = _Tally(self.name)
        lost: set[int] = set()
        renewing = asyncio.create_task(self._renew(items, lost))
        done: list[Claimed] = []
        try:
            for item in items:
                if item.item_id in lost:
                    tally.skipped()
                    continue
                try:
                    await _call(handler, item)
                except Exception as exc:  # the item failed; the worker goes on
                    tally.failed(item, exc, await self.nack(item, exc))
                else:
                    done.append(item)
        finally:
            renewing.cancel()
            answers = await self.ack(*done)
        tally.acked(done, answers)
        return tally.counts

    async def _renew(self, items: list[Claimed], lost: set[int]) -> None:
        every_s = self.settings.visibility_us / 3e6
        while True:
            await asyncio.sleep(every_s)
            live = [item for item in items if item.item_id not in lost]
            try:
                answers = await self.extend(*live)
            except StoreError as exc:
                _renewal_failed(self.name, exc)
                continue
            _note_lost(live, answers, lost)


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
            _error_text(error),
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


async def _call(handler: Handler, item: Claimed) -> None:
    if inspect.iscoroutinefunction(handler):
        await handler(item)
        return
    result = await asyncio.to_thread(handler, item)
    if inspect.isawaitable(result):
        await result


async def wait_set(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``event`` is set, or ``timeout_s`` has passed."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass


class JobQueue:
    """A queue as a scheduled job's run sees it (``ctx.queue(name)``): the run puts work
    in — the fan-out of a scheduled job — through the replica's store. ``put`` and
    ``put_many`` for a plain ``def`` job (in its thread); ``aput`` and ``aput_many`` in an
    ``async def`` job."""

    def __init__(self, core: AsyncQueue, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self.name = core.name
        self._loop = loop

    async def aput(
        self, value: Any, *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> int | None:
        """:meth:`AsyncQueue.put`."""
        return await self.core.put(value, dedupe_key=dedupe_key, delay=delay)

    async def aput_many(
        self, values: Iterable[Any], *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> list[int | None]:
        """:meth:`AsyncQueue.put_many`."""
        return await self.core.put_many(values, dedupe_key=dedupe_key, delay=delay)

    def put(
        self, value: Any, *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> int | None:
        """:meth:`aput` from a job function running in a thread."""
        (answer,) = self.put_many([Entry(value, dedupe_key, delay)])
        return answer

    def put_many(
        self, values: Iterable[Any], *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> list[int | None]:
        """:meth:`aput_many` from a job function running in a thread."""
        # Encoded here, in the job's thread: a bad value is refused there, with its
        # traceback, and the encoding's CPU stays off the replica's event loop.
        puts = to_puts(values, self.core.settings, dedupe_key=dedupe_key, delay=delay)
        coroutine = self.core.put_encoded(puts)
        return call_on_loop(self._loop, coroutine, instead="`await ctx.queue(name).aput_many(…)`")


class Queue:
    """A named queue of a fleet's namespace (sync): the face of an :class:`AsyncQueue`.
    Get one with ``fleet.queue(name, …)``."""

    def __init__(
        self,
        store: SyncStore,
        namespace: str,
        name: str,
        settings: QueueSettings,
        *,
        portal: Callable[[], Portal],
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = validate_name(name, what="queue name")
        self.settings = settings
        self.holder = new_holder()
        self._portal = portal

    def put(
        self, value: Any, *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> int | None:
        """Queue one JSON value; its id, or ``None`` when ``dedupe_key`` is taken."""
        (answer,) = self.put_many([Entry(value, dedupe_key, delay)])
        return answer

    def put_many(
        self, values: Iterable[Any], *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> list[int | None]:
        """Queue many values (or :class:`Entry` items) in one round trip; each one's id,
        or ``None`` for one whose dedupe key is taken."""
        puts = to_puts(values, self.settings, dedupe_key=dedupe_key, delay=delay)
        if not puts:
            return []
        return self.store.run(self.store.ops.queue_put(self.namespace, self.name, puts))

    def claim(self, batch: int = 1, *, visibility: DurationLike | None = None) -> list[Claimed]:
        """Claim up to ``batch`` items (see :meth:`AsyncQueue.claim`)."""
        size = _batch_size(batch)
        ttl = _visibility(self.settings, visibility)
        items = self.store.run(
            self.store.ops.queue_claim(self.namespace, self.name, self.holder, size, ttl)
        )
        return [claimed(item) for item in items]

    def ack(self, *items: Claimed) -> list[bool]:
        """Mark deliveries done (see :meth:`AsyncQueue.ack`)."""
        if not items:
            return []
        pairs = [item.claim for item in items]
        return self.store.run(self.store.ops.queue_ack(self.namespace, self.name, pairs))

    def nack(
        self, item: Claimed, error: BaseException | str, *, retry_in: DurationLike | None = None
    ) -> str | None:
        """Give a delivery back as failed (see :meth:`AsyncQueue.nack`)."""
        nack = _nack_of(self.settings, item, error, retry_in)
        (state,) = self.store.run(self.store.ops.queue_nack(self.namespace, self.name, [nack]))
        return state

    def extend(self, *items: Claimed, visibility: DurationLike | None = None) -> list[int | None]:
        """Hold deliveries longer (see :meth:`AsyncQueue.extend`)."""
        if not items:
            return []
        ttl = _visibility(self.settings, visibility)
        pairs = [item.claim for item in items]
        return self.store.run(self.store.ops.queue_extend(self.namespace, self.name, pairs, ttl))

    def stats(self) -> QueueStats:
        """How the queue stands now (all zero when it holds nothing)."""
        found = self.store.run(self.store.ops.queue_stats(self.namespace, self.name))
        if found:
            return found[0]
        return _empty_stats(self.namespace, self.name, self.store.run(self.store.ops.store_now()))

    def items(self, *, states: Sequence[str] | None = None, limit: int = 100) -> list[QueueItem]:
        """The queue's items in ``states`` (any, by default), newest first."""
        size = _batch_size(limit, "limit")
        return self.store.run(
            self.store.ops.queue_list(self.namespace, self.name, _states(states), size)
        )

    def requeue(self, item_ids: Sequence[int]) -> int:
        """Give dead items their deliveries back; how many were dead."""
        return self.store.run(
            self.store.ops.queue_requeue(self.namespace, self.name, _item_ids(item_ids))
        )

    def prune(self, older_than: DurationLike = "7d") -> int:
        """Delete items done or dead for ``older_than``; how many (at most 1,000 a call)."""
        age = _not_negative(older_than, "older_than")
        return self.store.run(
            self.store.ops.queue_prune(self.namespace, self.name, age, QUEUE_PRUNE_LIMIT)
        )

    def work(
        self,
        handler: Handler,
        *,
        batch: int = 10,
        idle: DurationLike = "1s",
        stop: threading.Event | None = None,
        until_empty: bool = False,
        observe: Callable[[str, int], None] | None = None,
    ) -> None:
        """Drain the queue until ``stop`` is set (forever without one; with
        ``until_empty``, until nothing is claimable): the loop of
        :meth:`AsyncQueue.work`, in the calling thread — ``handler`` is called here, so a
        database connection made in this thread can be used in it — while a background
        thread renews the batch's claims."""
        size = _batch_size(batch)
        idle_s = _positive(idle, "idle") / 1e6
        while stop is None or not stop.is_set():
            items = self.claim(size)
            if not items:
                if until_empty:
                    # As in AsyncQueue.work: an empty claim may only have killed items.
                    if self.stats().ready == 0:
                        return
                    continue
                if stop is None:
                    time.sleep(idle_s)
                else:
                    stop.wait(idle_s)
                continue
            counts = self._work_batch(handler, items)
            _report(observe, len(items), counts)

    def _work_batch(self, handler: Handler, items: list[Claimed]) -> dict[str, int]:
        tally = _Tally(self.name)
        lost: set[int] = set()
        finished = threading.Event()
        renewer = threading.Thread(
            target=self._renew,
            args=(items, lost, finished),
            name=f"fleetcron-queue-renew:{self.name}",
            daemon=True,
        )
        renewer.start()
        done: list[Claimed] = []
        try:
            for item in items:
                if item.item_id in lost:
                    tally.skipped()
                    continue
                try:
                    result = handler(item)
                    if inspect.isawaitable(result):  # a coroutine function's coroutine
                        self._portal().call(_awaited, result)
                except Exception as exc:  # the item failed; the worker goes on
                    tally.failed(item, exc, self.nack(item, exc))
                else:
                    done.append(item)
        finally:
            finished.set()
            renewer.join()
            answers = self.ack(*done)
        tally.acked(done, answers)
        return tally.counts

    def _renew(self, items: list[Claimed], lost: set[int], finished: threading.Event) -> None:
        every_s = self.settings.visibility_us / 3e6
        while not finished.wait(every_s):
            live = [item for item in items if item.item_id not in lost]
            try:
                answers = self.extend(*live)
            except StoreError as exc:
                _renewal_failed(self.name, exc)
                continue
            _note_lost(live, answers, lost)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
