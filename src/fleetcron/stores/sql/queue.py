"""The work queue of the SQL backends (:class:`~fleetcron.stores.base.QueueOperations`,
docs/design/queue.md), shared by the three dialects.

Each operation is one named query of ``<dialect>/queries.sql``, whatever the number of
items it names: a batch goes as one JSON array, unpacked server-side, and the answers come
back as rows that this module puts in input order. The SQL keeps the rules of the
reference (:mod:`fleetcron.stores.memory_queue`) at the store's clock; what is left to
Python is what a set of rows cannot say by itself:

- the repeats of an item within a batch, dropped before sending and answered here as the
  reference does (a second put of a dedupe key is refused; a second ack or nack of a claim
  finds it no longer held; a second extend extends it again);
- which answer goes with which input: rows come back as ``(id, …)`` of the items that were
  changed, in no particular order.

Rows are read by column name (:mod:`fleetcron.stores.rows`): items with ``ITEMS``, stats
with ``STATS``, the answers of put, extend, ack and nack with the decoders below.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from fleetcron.queue_models import QueueItem, QueueNack, QueuePut, QueueStats
from fleetcron.stores.base import Operation, as_text
from fleetcron.stores.memory_queue import expired_claim_error
from fleetcron.stores.rows import ITEMS, STATS, RowDecoder
from fleetcron.stores.sql.statements import Query, SqlResult

__all__ = ["SqlQueue"]


def _expired_error_parts() -> tuple[str, str]:
    """The text around N of :func:`expired_claim_error`: the SQL builds the error of an
    item that died of an expired claim from its attempts, so the wording stays defined in
    one place."""
    marker = 987654321  # a number the wording itself never contains
    head, found, tail = expired_claim_error(marker).partition(str(marker))
    assert found, "expired_claim_error must say the number of deliveries"
    return head, tail


_EXPIRED_HEAD, _EXPIRED_TAIL = _expired_error_parts()


def _dumps(value: object) -> str:
    # UTF-8 as it is: no server has to undo \u escapes (surrogate pairs) of payloads.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _count(result: SqlResult) -> int:
    """A count answered as a row (PostgreSQL) or as the statement's row count."""
    return int(result.rows[0][0]) if result.rows else max(result.rowcount, 0)


def _put(values: Iterable[Sequence[Any]]) -> list[tuple[int, str | None]]:
    return [(int(i), None if key is None else as_text(key)) for i, key in values]


def _extended(values: Iterable[Sequence[Any]]) -> list[tuple[tuple[int, int], int]]:
    return [((int(i), int(fence)), int(until)) for i, fence, until in values]


def _held(values: Iterable[Sequence[Any]]) -> list[tuple[int, int]]:
    return [(int(i), int(fence)) for i, fence in values]


def _given_back(values: Iterable[Sequence[Any]]) -> list[tuple[tuple[int, int], str]]:
    return [((int(i), int(fence)), as_text(state)) for i, fence, state in values]


_PUT = RowDecoder("put item", ("id", "dedupe_key"), _put)
_EXTENDED = RowDecoder("extended item", ("id", "fence", "available_us"), _extended)
_ACKED = RowDecoder("acknowledged item", ("id", "fence"), _held)
_NACKED = RowDecoder("given-back item", ("id", "fence", "state"), _given_back)


def _unique_pairs(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each ``(item_id, fence)`` once, in ascending order: claims sent in one order by every
    caller are locked in one order, so two batches never wait on each other in a cycle."""
    return sorted(set(pairs))


def _claim_params(
    namespace: str, queue: str, holder: str, limit: int, visibility_us: int
) -> dict[str, object]:
    """The bound parameters of ``queue_claim`` (every dialect uses the same names)."""
    return {
        "namespace": namespace,
        "queue": queue,
        "holder": holder,
        "limit": limit,
        # MariaDB/MySQL first read this many candidates without locks (mysql/queries.sql)
        "window": 2 * limit + 64,
        "visibility_us": visibility_us,
        "expired_head": _EXPIRED_HEAD,
        "expired_tail": _EXPIRED_TAIL,
    }


class SqlQueue:
    """The queue operations of the SQL dialects, each one named query (its SQL in
    ``<dialect>/queries.sql``). A dialect that cannot claim in one statement overrides
    :meth:`_claim_rows` (SQLite, inside its one transaction)."""

    def queue_put(
        self, namespace: str, queue: str, items: Sequence[QueuePut]
    ) -> Operation[list[int | None]]:
        # A dedupe key repeated within the call: only its first item is sent.
        sent: list[QueuePut] = []
        first: set[str] = set()
        for put in items:
            if put.dedupe_key is None or put.dedupe_key not in first:
                sent.append(put)
                if put.dedupe_key is not None:
                    first.add(put.dedupe_key)
        if not sent:
            return []
        result: SqlResult = yield Query(
            "queue_put",
            {
                "namespace": namespace,
                "queue": queue,
                "items": _dumps(
                    [[p.payload, p.dedupe_key, p.delay_us, p.max_attempts] for p in sent]
                ),
                # MySQL only: tells this call's new rows from a concurrent call's.
                "token": secrets.token_hex(16),
            },
        )
        # The rows put are (id, dedupe_key): a keyed item is known by its key; the others
        # always go in, with ids increasing in input order, so their ids, sorted, are theirs.
        by_key: dict[str, int] = {}
        keyless: list[int] = []
        for item_id, key in _PUT.all(result):
            if key is None:
                keyless.append(item_id)
            else:
                by_key[key] = item_id
        keyless.sort(reverse=True)
        answers: list[int | None] = []
        given: set[str] = set()
        for put in items:
            if put.dedupe_key is None:
                answers.append(keyless.pop())
            elif put.dedupe_key in given:
                answers.append(None)
            else:
                given.add(put.dedupe_key)
                answers.append(by_key.get(put.dedupe_key))
        return answers

    def queue_claim(
        self, namespace: str, queue: str, holder: str, limit: int, visibility_us: int
    ) -> Operation[list[QueueItem]]:
        if limit <= 0:
            return []
        result = yield from self._claim_rows(
            _claim_params(namespace, queue, holder, limit, visibility_us)
        )
        return ITEMS.all(result, namespace, queue)

    def _claim_rows(self, params: dict[str, object]) -> Operation[SqlResult]:
        """The rows delivered by one claim, in claim order: one statement picks, locks,
        kills and delivers."""
        result: SqlResult = yield Query("queue_claim", params)
        return result

    def queue_extend(
        self,
        namespace: str,
        queue: str,
        claims: Sequence[tuple[int, int]],
        visibility_us: int,
    ) -> Operation[list[int | None]]:
        if not claims:
            return []
        result: SqlResult = yield Query(
            "queue_extend",
            {
                "namespace": namespace,
                "queue": queue,
                "claims": _dumps(_unique_pairs(claims)),
                "visibility_us": visibility_us,
            },
        )
        # (id, fence, new expiry): a repeat of a claim extends it again, to the same time.
        extended = dict(_EXTENDED.all(result))
        return [extended.get((item_id, fence)) for item_id, fence in claims]

    def queue_ack(
        self, namespace: str, queue: str, claims: Sequence[tuple[int, int]]
    ) -> Operation[list[bool]]:
        if not claims:
            return []
        result: SqlResult = yield Query(
            "queue_ack",
            {"namespace": namespace, "queue": queue, "claims": _dumps(_unique_pairs(claims))},
        )
        # (id, fence) of each item acknowledged: a repeat finds it done already.
        acked = set(_ACKED.all(result))
        answers: list[bool] = []
        for pair in claims:
            answers.append(pair in acked)
            acked.discard(pair)
        return answers

    def queue_nack(
        self, namespace: str, queue: str, nacks: Sequence[QueueNack]
    ) -> Operation[list[str | None]]:
        if not nacks:
            return []
        # The first nack of each claim is the one applied; a repeat finds it no longer held.
        sent: dict[tuple[int, int], QueueNack] = {}
        for nack in nacks:
            sent.setdefault((nack.item_id, nack.fence), nack)
        result: SqlResult = yield Query(
            "queue_nack",
            {
                "namespace": namespace,
                "queue": queue,
                "nacks": _dumps(
                    [
                        [n.item_id, n.fence, n.error, n.retry_in_us]
                        for _, n in sorted(sent.items(), key=lambda entry: entry[0])
                    ]
                ),
            },
        )
        # (id, fence, the state it was given back in).
        states = dict(_NACKED.all(result))
        return [states.pop((n.item_id, n.fence), None) for n in nacks]

    def queue_get(self, namespace: str, queue: str, item_id: int) -> Operation[QueueItem | None]:
        result: SqlResult = yield Query(
            "queue_get", {"namespace": namespace, "queue": queue, "item_id": item_id}
        )
        return ITEMS.first(result, namespace, queue)

    def queue_list(
        self, namespace: str, queue: str, states: Sequence[str] | None, limit: int
    ) -> Operation[list[QueueItem]]:
        if limit <= 0 or (states is not None and not states):
            return []
        result: SqlResult = yield Query(
            "queue_list",
            {
                "namespace": namespace,
                "queue": queue,
                "states": None if states is None else _dumps(list(states)),
                "limit": limit,
            },
        )
        return ITEMS.all(result, namespace, queue)

    def queue_stats(self, namespace: str, queue: str | None) -> Operation[list[QueueStats]]:
        result: SqlResult = yield Query("queue_stats", {"namespace": namespace, "queue": queue})
        return STATS.all(result, namespace)

    def queue_prune(
        self, namespace: str, queue: str | None, older_than_us: int, limit: int
    ) -> Operation[int]:
        if limit <= 0:
            return 0
        result: SqlResult = yield Query(
            "queue_prune",
            {
                "namespace": namespace,
                "queue": queue,
                "older_than_us": older_than_us,
                "limit": limit,
            },
        )
        return _count(result)

    def queue_requeue(self, namespace: str, queue: str, item_ids: Sequence[int]) -> Operation[int]:
        if not item_ids:
            return 0
        result: SqlResult = yield Query(
            "queue_requeue",
            {"namespace": namespace, "queue": queue, "ids": _dumps(sorted(set(item_ids)))},
        )
        return _count(result)
