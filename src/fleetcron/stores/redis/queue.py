"""The work queue of the Redis store (:class:`~fleetcron.stores.base.QueueOperations`):
each operation on a queue is one Lua script call (the scripts are ``queue.lua``), so one
round trip and one atomic step whatever the number of items, with every time from the
server's ``TIME`` read inside the script.

Every key of a queue is under the hash tag of the name ``fleetcron:queue:<queue>``, built
as a lease's is (:func:`~fleetcron.stores.redis.keys.lease_key`), so one queue is one
Cluster slot. With ``Q = fleetcron:{<len(ns)>:<ns>:fleetcron:queue:<queue>}``:

- ``Q:item:<id>`` — one item: ``payload``, ``dedupe``, ``state``, ``attempts``,
  ``max_attempts``, ``fence``, ``holder``, ``available``, ``created``, ``finished``,
  ``error``; NULL is an absent field;
- ``Q:seq`` — the last id given (``INCR``). It is never deleted, like a lease row, so ids
  keep increasing and never repeat within the queue after its items are pruned;
- ``Q:ids`` — sorted set of every item (score the id), for listing newest first. It exists
  exactly while the queue has items, which is how the queues of a namespace are found: a
  SCAN of ``…:fleetcron:queue:*}:ids``;
- ``Q:ready`` — sorted set of the ``ready`` items, score ``available_us``;
- ``Q:claimed`` — the ``claimed`` items, score the claim's expiry (their
  ``available_us``): its part up to now is the expired claims, claimable again;
- ``Q:done``, ``Q:dead`` — the finished items, score ``finished_us``, counted by stats and
  taken oldest first by prune;
- ``Q:dedupe`` — hash of dedupe key → id, for as long as the item exists (prune frees it).

An item is in exactly one of the four state sets: the one of its ``state``. Members of the
sorted sets are ids zero-padded to 16 digits (every id a Lua number holds exactly): members
of equal score come out in byte order, so ties of ``available_us`` or ``finished_us`` come
out lowest id first. No key ends with ``}``, nor is under a ``fleetcron:job:`` or
``fleetcron:replicas`` tag, so the lease and ledger SCANs never see one; and no suffix
contains ``}``, so no two queues' keys are the same whatever their names.

Every script gets the queue's seven fixed keys (:func:`queue_keys`) and reaches the item
hashes by name under the same hash tag. ``queue_stats`` and ``queue_prune`` of a whole
namespace (``queue=None``) SCAN for its queues, then call a per-queue script for each in
one pipeline: atomic per queue, not across queues. A namespace-wide prune applies its
``limit`` over all queues in two pipelines: each queue names its candidates, oldest first
(``queue_prunable``, at most ``limit``), the oldest ``limit`` of them all are chosen here,
and each queue deletes its chosen ones (``queue_drop``), checking again that each is still
finished and old enough (an item requeued in between stays).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetcron.queue_models import QueueItem, QueueNack, QueuePut, QueueStats
from fleetcron.stores.base import Operation, as_text
from fleetcron.stores.redis.keys import glob_escape, lease_key
from fleetcron.stores.redis.replies import items_of, stats_of
from fleetcron.stores.redis.statements import KeyScan, Script, ScriptArg, ScriptCalls

__all__ = ["QUEUE_PREFIX", "RedisQueue", "item_key", "queue_keys"]

QUEUE_PREFIX = "fleetcron:queue:"
"""A queue's keys are under the hash tag of this prefix and the queue's name."""

# The order of KEYS in every queue script (queue.lua); the first is the id index.
_SUFFIXES = ("ids", "seq", "ready", "claimed", "done", "dead", "dedupe")
_INDEX = ":ids"


def _base(namespace: str, queue: str) -> str:
    return lease_key(namespace, QUEUE_PREFIX + queue)


def queue_keys(namespace: str, queue: str) -> tuple[str, ...]:
    """The KEYS of every script of ``queue``: ids, seq, ready, claimed, done, dead, dedupe."""
    base = _base(namespace, queue)
    return tuple(f"{base}:{suffix}" for suffix in _SUFFIXES)


def item_key(namespace: str, queue: str, item_id: int) -> str:
    """The hash of one item: under its queue's hash tag."""
    return f"{_base(namespace, queue)}:item:{item_id}"


def _queues_pattern(namespace: str) -> str:
    """SCAN pattern of the id index of every queue of ``namespace`` that has items."""
    prefix = glob_escape(QUEUE_PREFIX)
    return f"fleetcron:{{{len(namespace)}:{glob_escape(namespace)}:{prefix}*}}{_INDEX}"


def _queue_name(namespace: str, index_key: str) -> str:
    """The queue whose id index is ``index_key`` (a key the SCAN pattern matched)."""
    head = f"fleetcron:{{{len(namespace)}:{namespace}:{QUEUE_PREFIX}"
    return index_key[len(head) : -len("}" + _INDEX)]


def _maybe_text(value: Any) -> str | None:
    return None if value is None else as_text(value)


def _opt(value: str | None) -> str:
    """An optional script argument: ``''`` is NULL, anything else is ``'=' + value``."""
    return "" if value is None else "=" + value


class RedisQueue:
    """The work queue's operations as script calls: one script on one queue's keys each,
    except ``queue_stats`` and ``queue_prune`` of a whole namespace (a SCAN, then one
    pipeline of per-queue calls; prune, two). A request with nothing to do (no items, a
    ``limit`` of 0) answers without a round trip, as the script would have."""

    def queue_put(
        self, namespace: str, queue: str, items: Sequence[QueuePut]
    ) -> Operation[list[int | None]]:
        if not items:
            return []
        args = tuple(
            arg
            for put in items
            for arg in (put.payload, _opt(put.dedupe_key), put.delay_us, put.max_attempts)
        )
        reply = yield Script("queue_put", queue_keys(namespace, queue), args)
        return [None if answer is None else int(answer) for answer in reply]

    def queue_claim(
        self, namespace: str, queue: str, holder: str, limit: int, visibility_us: int
    ) -> Operation[list[QueueItem]]:
        if limit <= 0:
            return []
        reply = yield Script(
            "queue_claim", queue_keys(namespace, queue), (holder, limit, visibility_us)
        )
        return items_of(namespace, queue, reply)

    def queue_extend(
        self,
        namespace: str,
        queue: str,
        claims: Sequence[tuple[int, int]],
        visibility_us: int,
    ) -> Operation[list[int | None]]:
        if not claims:
            return []
        args = (visibility_us, *(arg for claim in claims for arg in claim))
        reply = yield Script("queue_extend", queue_keys(namespace, queue), args)
        return [None if answer is None else int(answer) for answer in reply]

    def queue_ack(
        self, namespace: str, queue: str, claims: Sequence[tuple[int, int]]
    ) -> Operation[list[bool]]:
        if not claims:
            return []
        args = tuple(arg for claim in claims for arg in claim)
        reply = yield Script("queue_ack", queue_keys(namespace, queue), args)
        return [bool(int(answer)) for answer in reply]

    def queue_nack(
        self, namespace: str, queue: str, nacks: Sequence[QueueNack]
    ) -> Operation[list[str | None]]:
        if not nacks:
            return []
        args = tuple(
            arg
            for nack in nacks
            for arg in (nack.item_id, nack.fence, nack.error, nack.retry_in_us)
        )
        reply = yield Script("queue_nack", queue_keys(namespace, queue), args)
        return [_maybe_text(answer) for answer in reply]

    def queue_get(self, namespace: str, queue: str, item_id: int) -> Operation[QueueItem | None]:
        reply = yield Script("queue_get", queue_keys(namespace, queue), (item_id,))
        return items_of(namespace, queue, [reply])[0] if reply else None

    def queue_list(
        self, namespace: str, queue: str, states: Sequence[str] | None, limit: int
    ) -> Operation[list[QueueItem]]:
        if limit <= 0 or (states is not None and not states):
            return []
        args: tuple[ScriptArg, ...] = (limit, *(states or ()))
        reply = yield Script("queue_list", queue_keys(namespace, queue), args)
        return items_of(namespace, queue, reply)

    def queue_stats(self, namespace: str, queue: str | None) -> Operation[list[QueueStats]]:
        if queue is not None:
            reply = yield Script("queue_stats", queue_keys(namespace, queue), ())
            return [stats_of(namespace, queue, reply)] if reply else []
        names = yield from _queues(namespace)
        if not names:
            return []
        replies = yield ScriptCalls(
            "queue_stats", tuple((queue_keys(namespace, name), ()) for name in names)
        )
        return [
            stats_of(namespace, name, reply)
            for name, reply in zip(names, replies, strict=True)
            if reply
        ]

    def queue_prune(
        self, namespace: str, queue: str | None, older_than_us: int, limit: int
    ) -> Operation[int]:
        if limit <= 0:
            return 0
        if queue is not None:
            reply = yield Script(
                "queue_prune", queue_keys(namespace, queue), (older_than_us, limit)
            )
            return int(reply)
        names = yield from _queues(namespace)
        if not names:
            return 0
        replies = yield ScriptCalls(
            "queue_prunable",
            tuple((queue_keys(namespace, name), (older_than_us, limit)) for name in names),
        )
        # The limit is over the namespace: the oldest finish first, then the lowest id
        # (ids are per queue, so the queue's name breaks what ties are left).
        found = sorted(
            (int(finished), int(item_id), name)
            for name, reply in zip(names, replies, strict=True)
            for finished, item_id in reply
        )[:limit]
        chosen: dict[str, list[int]] = {}
        for _finished, item_id, name in found:
            chosen.setdefault(name, []).append(item_id)
        if not chosen:
            return 0
        counts = yield ScriptCalls(
            "queue_drop",
            tuple(
                (queue_keys(namespace, name), (older_than_us, *ids)) for name, ids in chosen.items()
            ),
        )
        return sum(int(count) for count in counts)

    def queue_requeue(self, namespace: str, queue: str, item_ids: Sequence[int]) -> Operation[int]:
        if not item_ids:
            return 0
        reply = yield Script("queue_requeue", queue_keys(namespace, queue), tuple(item_ids))
        return int(reply)


def _queues(namespace: str) -> Operation[list[str]]:
    """The names of the queues of ``namespace`` that have items, sorted (a SCAN may name a
    key twice, and finds the queues in no order)."""
    keys = yield KeyScan(_queues_pattern(namespace))
    return sorted({_queue_name(namespace, key) for key in keys})
