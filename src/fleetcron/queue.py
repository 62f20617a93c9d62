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
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from fleetcron.bridge import Portal, ThreadedAsyncStore, call_on_loop, run_inline
from fleetcron.durations import DurationLike, format_duration, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.jsonvalue import encode_json
from fleetcron.lease import new_holder
from fleetcron.names import validate_name
from fleetcron.queue_models import ITEM_STATES, QueueItem, QueueNack, QueuePut, QueueStats
from fleetcron.queue_work import LoopSide, ThreadSide, drain, error_text, wait_set
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
        item_id=item.item_id, fence=item.fence, error=error_text(error), retry_in_us=wait
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
        await drain(
            self,
            handler,
            size=_batch_size(batch),
            idle_s=_positive(idle, "idle") / 1e6,
            until_empty=until_empty,
            observe=observe,
            side=LoopSide(stop),
        )


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
    """A named queue of a fleet's namespace (sync): the face of an :class:`AsyncQueue`,
    whose calls it drives in the caller's thread (``run_inline`` over a threaded store).
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
        self._core = AsyncQueue(ThreadedAsyncStore(store), namespace, name, settings)
        self.store = store
        self.namespace = namespace
        self.name = self._core.name
        self.settings = settings
        self.holder = self._core.holder
        self._portal = portal

    def put(
        self, value: Any, *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> int | None:
        """Sync :meth:`AsyncQueue.put`."""
        return run_inline(self._core.put(value, dedupe_key=dedupe_key, delay=delay))

    def put_many(
        self, values: Iterable[Any], *, dedupe_key: str | None = None, delay: DurationLike = 0
    ) -> list[int | None]:
        """Sync :meth:`AsyncQueue.put_many`."""
        return run_inline(self._core.put_many(values, dedupe_key=dedupe_key, delay=delay))

    def claim(self, batch: int = 1, *, visibility: DurationLike | None = None) -> list[Claimed]:
        """Sync :meth:`AsyncQueue.claim`."""
        return run_inline(self._core.claim(batch, visibility=visibility))

    def ack(self, *items: Claimed) -> list[bool]:
        """Sync :meth:`AsyncQueue.ack`."""
        return run_inline(self._core.ack(*items))

    def nack(
        self, item: Claimed, error: BaseException | str, *, retry_in: DurationLike | None = None
    ) -> str | None:
        """Sync :meth:`AsyncQueue.nack`."""
        return run_inline(self._core.nack(item, error, retry_in=retry_in))

    def extend(self, *items: Claimed, visibility: DurationLike | None = None) -> list[int | None]:
        """Sync :meth:`AsyncQueue.extend`."""
        return run_inline(self._core.extend(*items, visibility=visibility))

    def stats(self) -> QueueStats:
        """Sync :meth:`AsyncQueue.stats`."""
        return run_inline(self._core.stats())

    def items(self, *, states: Sequence[str] | None = None, limit: int = 100) -> list[QueueItem]:
        """Sync :meth:`AsyncQueue.items`."""
        return run_inline(self._core.items(states=states, limit=limit))

    def requeue(self, item_ids: Sequence[int]) -> int:
        """Sync :meth:`AsyncQueue.requeue`."""
        return run_inline(self._core.requeue(item_ids))

    def prune(self, older_than: DurationLike = "7d") -> int:
        """Sync :meth:`AsyncQueue.prune`."""
        return run_inline(self._core.prune(older_than))

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
        """:meth:`AsyncQueue.work`'s loop, in the calling thread: ``handler`` is called
        here, so a database connection made in this thread can be used in it, while a
        background thread renews the batch's claims. ``stop`` is a ``threading.Event``."""
        run_inline(
            drain(
                self._core,
                handler,
                size=_batch_size(batch),
                idle_s=_positive(idle, "idle") / 1e6,
                until_empty=until_empty,
                observe=observe,
                side=ThreadSide(stop, self._portal),
            )
        )
