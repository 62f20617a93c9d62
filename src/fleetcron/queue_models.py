"""The work queue's records, as the store keeps and answers them (docs/design/queue.md).

An item is a JSON text in a named queue of a namespace. Times are the store's clock in µs
since the epoch; every answer carries the store's now (``now_us``), so callers judge a
claim's expiry in store time, never by their own clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleetcron.models import micros_to_datetime

__all__ = [
    "ITEM_STATES",
    "CheckpointRecord",
    "QueueItem",
    "QueueNack",
    "QueuePut",
    "QueueStats",
]

ITEM_STATES = ("ready", "claimed", "done", "dead")
"""``ready``: waiting (claimable once ``available_us`` has come); ``claimed``: delivered,
held while ``available_us`` (the claim's expiry) is in the future and due again after it;
``done``: acknowledged; ``dead``: given up after ``max_attempts`` deliveries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePut:
    """One item to put: its JSON text, an optional dedupe key (an item whose key is
    already in the queue, in any state, is not put again), how long after the store's now
    it becomes claimable, and how many deliveries it gets before it is dead."""

    payload: str
    dedupe_key: str | None = None
    delay_us: int = 0
    max_attempts: int = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueNack:
    """A held item given back: ``error`` says why; it is claimable again
    ``retry_in_us`` after the store's now, or dead when its deliveries are used up."""

    item_id: int
    fence: int
    error: str
    retry_in_us: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueItem:
    """An item's row. ``fence`` is its latest claim's fencing token (0: never claimed),
    strictly greater than every earlier claim's of the item; ``attempts`` counts its
    deliveries; ``available_us`` is when a ``ready`` item becomes claimable, or when a
    ``claimed`` item's claim expires."""

    namespace: str
    queue: str
    item_id: int
    dedupe_key: str | None
    payload: str
    state: str
    attempts: int
    max_attempts: int
    fence: int
    holder: str | None
    available_us: int
    created_us: int
    finished_us: int | None
    error: str | None
    now_us: int

    @property
    def held(self) -> bool:
        """Claimed, and the claim has not expired at ``now_us``."""
        return self.state == "claimed" and self.available_us > self.now_us

    @property
    def created(self) -> datetime:
        return micros_to_datetime(self.created_us)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """How a queue stands at ``now_us``: items claimable now (``ready``: ready and due, or
    a claim that expired), ``scheduled`` (ready but not yet due: delayed, or backing off
    after a failure), ``claimed`` (held), ``done``, ``dead``; ``oldest_us``: since when the
    longest-waiting claimable item has been claimable (``None``: nothing claimable)."""

    namespace: str
    queue: str
    ready: int
    scheduled: int
    claimed: int
    done: int
    dead: int
    oldest_us: int | None
    now_us: int

    @property
    def depth(self) -> int:
        """Items not finished: claimable, scheduled or held."""
        return self.ready + self.scheduled + self.claimed

    @property
    def oldest_age_us(self) -> int:
        """How long the longest-waiting claimable item has waited (0: none waits)."""
        return 0 if self.oldest_us is None else max(0, self.now_us - self.oldest_us)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """A job's high-water mark: ``value`` (a JSON text) as last set, by the run whose
    fence was ``fence``, at ``updated_us``; ``now_us``: when it was read."""

    namespace: str
    name: str
    value: str
    fence: int
    updated_us: int
    now_us: int
