"""The work queue and the checkpoints of the in-memory store: the reference the other
backends are held to (:class:`~fleetcron.stores.base.QueueOperations`,
:class:`~fleetcron.stores.base.CheckpointOperations`, docs/design/queue.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetcron.queue_models import (
    CheckpointRecord,
    QueueItem,
    QueueNack,
    QueuePut,
    QueueStats,
)
from fleetcron.stores.base import Operation
from fleetcron.stores.memory_step import Step

__all__ = ["MemoryQueue", "QueueTables", "expired_claim_error"]


def expired_claim_error(attempts: int) -> str:
    """The error of an item whose last claim expired with its deliveries used up."""
    return f"claim expired after {attempts} deliveries"


@dataclass(slots=True)
class QueueTables:
    """Every queue's items, by ``(namespace, queue)`` then id, the last id given, and the
    checkpoints by ``(namespace, name)``."""

    items: dict[tuple[str, str], dict[int, QueueItem]] = field(default_factory=dict)
    last_id: int = 0
    checkpoints: dict[tuple[str, str], CheckpointRecord] = field(default_factory=dict)


def _held(item: QueueItem, fence: int, now: int) -> bool:
    return item.state == "claimed" and item.fence == fence and item.available_us > now


def _claimable(item: QueueItem, now: int) -> bool:
    return item.state in ("ready", "claimed") and item.available_us <= now


class MemoryQueue:
    """Queue operations over :class:`QueueTables` (the store's ``state.queues``); each
    yields one step that the memory store runs atomically at its clock's now."""

    def _queue_step(self, fn: Callable[[QueueTables, int], Any]) -> Step:
        return Step(lambda state, now: fn(state.queues, now))

    def queue_put(
        self, namespace: str, queue: str, items: Sequence[QueuePut]
    ) -> Operation[list[int | None]]:
        def step(tables: QueueTables, now: int) -> list[int | None]:
            rows = tables.items.setdefault((namespace, queue), {})
            keys = {row.dedupe_key for row in rows.values() if row.dedupe_key is not None}
            answers: list[int | None] = []
            for put in items:
                if put.dedupe_key is not None and put.dedupe_key in keys:
                    answers.append(None)
                    continue
                tables.last_id += 1
                rows[tables.last_id] = QueueItem(
                    namespace=namespace,
                    queue=queue,
                    item_id=tables.last_id,
                    dedupe_key=put.dedupe_key,
                    payload=put.payload,
                    state="ready",
                    attempts=0,
                    max_attempts=put.max_attempts,
                    fence=0,
                    holder=None,
                    available_us=now + put.delay_us,
                    created_us=now,
                    finished_us=None,
                    error=None,
                    now_us=now,
                )
                if put.dedupe_key is not None:
                    keys.add(put.dedupe_key)
                answers.append(tables.last_id)
            if not rows:
                del tables.items[(namespace, queue)]
            return answers

        result: list[int | None] = yield self._queue_step(step)
        return result

    def queue_claim(
        self, namespace: str, queue: str, holder: str, limit: int, visibility_us: int
    ) -> Operation[list[QueueItem]]:
        def step(tables: QueueTables, now: int) -> list[QueueItem]:
            rows = tables.items.get((namespace, queue), {})
            due = sorted(
                (row for row in rows.values() if _claimable(row, now)),
                key=lambda row: (row.available_us, row.item_id),
            )[: max(limit, 0)]
            delivered = []
            for row in due:
                if row.state == "claimed" and row.attempts >= row.max_attempts:
                    rows[row.item_id] = replace(
                        row,
                        state="dead",
                        finished_us=now,
                        error=expired_claim_error(row.attempts),
                        now_us=now,
                    )
                    continue
                claimed = replace(
                    row,
                    state="claimed",
                    attempts=row.attempts + 1,
                    fence=max(row.fence + 1, now),
                    holder=holder,
                    available_us=now + visibility_us,
                    now_us=now,
                )
                rows[row.item_id] = claimed
                delivered.append(claimed)
            return delivered

        result: list[QueueItem] = yield self._queue_step(step)
        return result

    def queue_extend(
        self,
        namespace: str,
        queue: str,
        claims: Sequence[tuple[int, int]],
        visibility_us: int,
    ) -> Operation[list[int | None]]:
        def step(tables: QueueTables, now: int) -> list[int | None]:
            rows = tables.items.get((namespace, queue), {})
            answers: list[int | None] = []
            for item_id, fence in claims:
                row = rows.get(item_id)
                if row is None or not _held(row, fence, now):
                    answers.append(None)
                    continue
                rows[item_id] = replace(row, available_us=now + visibility_us, now_us=now)
                answers.append(now + visibility_us)
            return answers

        result: list[int | None] = yield self._queue_step(step)
        return result

    def queue_ack(
        self, namespace: str, queue: str, claims: Sequence[tuple[int, int]]
    ) -> Operation[list[bool]]:
        def step(tables: QueueTables, now: int) -> list[bool]:
            rows = tables.items.get((namespace, queue), {})
            answers = []
            for item_id, fence in claims:
                row = rows.get(item_id)
                if row is None or not _held(row, fence, now):
                    answers.append(False)
                    continue
                rows[item_id] = replace(row, state="done", finished_us=now, now_us=now)
                answers.append(True)
            return answers

        result: list[bool] = yield self._queue_step(step)
        return result

    def queue_nack(
        self, namespace: str, queue: str, nacks: Sequence[QueueNack]
    ) -> Operation[list[str | None]]:
        def step(tables: QueueTables, now: int) -> list[str | None]:
            rows = tables.items.get((namespace, queue), {})
            answers: list[str | None] = []
            for nack in nacks:
                row = rows.get(nack.item_id)
                if row is None or not _held(row, nack.fence, now):
                    answers.append(None)
                    continue
                if row.attempts >= row.max_attempts:
                    rows[nack.item_id] = replace(
                        row, state="dead", finished_us=now, error=nack.error, now_us=now
                    )
                else:
                    rows[nack.item_id] = replace(
                        row,
                        state="ready",
                        holder=None,
                        available_us=now + nack.retry_in_us,
                        error=nack.error,
                        now_us=now,
                    )
                answers.append(rows[nack.item_id].state)
            return answers

        result: list[str | None] = yield self._queue_step(step)
        return result

    def queue_get(self, namespace: str, queue: str, item_id: int) -> Operation[QueueItem | None]:
        def step(tables: QueueTables, now: int) -> QueueItem | None:
            row = tables.items.get((namespace, queue), {}).get(item_id)
            return None if row is None else replace(row, now_us=now)

        result: QueueItem | None = yield self._queue_step(step)
        return result

    def queue_list(
        self, namespace: str, queue: str, states: Sequence[str] | None, limit: int
    ) -> Operation[list[QueueItem]]:
        def step(tables: QueueTables, now: int) -> list[QueueItem]:
            rows = tables.items.get((namespace, queue), {})
            chosen = [
                replace(row, now_us=now)
                for row in rows.values()
                if states is None or row.state in states
            ]
            chosen.sort(key=lambda row: -row.item_id)
            return chosen[: max(limit, 0)]

        result: list[QueueItem] = yield self._queue_step(step)
        return result

    def queue_stats(self, namespace: str, queue: str | None) -> Operation[list[QueueStats]]:
        def step(tables: QueueTables, now: int) -> list[QueueStats]:
            found = []
            for (ns, name), rows in sorted(tables.items.items()):
                if ns != namespace or (queue is not None and name != queue) or not rows:
                    continue
                claimable = [row for row in rows.values() if _claimable(row, now)]
                found.append(
                    QueueStats(
                        namespace=namespace,
                        queue=name,
                        ready=len(claimable),
                        scheduled=sum(
                            row.state == "ready" and row.available_us > now for row in rows.values()
                        ),
                        claimed=sum(
                            row.state == "claimed" and row.available_us > now
                            for row in rows.values()
                        ),
                        done=sum(row.state == "done" for row in rows.values()),
                        dead=sum(row.state == "dead" for row in rows.values()),
                        oldest_us=min((row.available_us for row in claimable), default=None),
                        now_us=now,
                    )
                )
            return found

        result: list[QueueStats] = yield self._queue_step(step)
        return result

    def queue_prune(
        self, namespace: str, queue: str | None, older_than_us: int, limit: int
    ) -> Operation[int]:
        def step(tables: QueueTables, now: int) -> int:
            doomed = sorted(
                (
                    (row.finished_us, row.item_id, key)
                    for key, rows in tables.items.items()
                    if key[0] == namespace and (queue is None or key[1] == queue)
                    for row in rows.values()
                    if row.state in ("done", "dead")
                    and row.finished_us is not None
                    and row.finished_us <= now - older_than_us
                ),
            )[: max(limit, 0)]
            for _finished, item_id, key in doomed:
                del tables.items[key][item_id]
                if not tables.items[key]:
                    del tables.items[key]
            return len(doomed)

        result: int = yield self._queue_step(step)
        return result

    def queue_requeue(self, namespace: str, queue: str, item_ids: Sequence[int]) -> Operation[int]:
        def step(tables: QueueTables, now: int) -> int:
            rows = tables.items.get((namespace, queue), {})
            count = 0
            for item_id in dict.fromkeys(item_ids):
                row = rows.get(item_id)
                if row is None or row.state != "dead":
                    continue
                rows[item_id] = replace(
                    row,
                    state="ready",
                    attempts=0,
                    holder=None,
                    available_us=now,
                    finished_us=None,
                    now_us=now,
                )
                count += 1
            return count

        result: int = yield self._queue_step(step)
        return result

    def checkpoint_get(self, namespace: str, name: str) -> Operation[CheckpointRecord | None]:
        def step(tables: QueueTables, now: int) -> CheckpointRecord | None:
            found = tables.checkpoints.get((namespace, name))
            return None if found is None else replace(found, now_us=now)

        result: CheckpointRecord | None = yield self._queue_step(step)
        return result

    def checkpoint_set(self, namespace: str, name: str, fence: int, value: str) -> Operation[bool]:
        def step(tables: QueueTables, now: int) -> bool:
            found = tables.checkpoints.get((namespace, name))
            if found is not None and found.fence > fence:
                return False
            tables.checkpoints[(namespace, name)] = CheckpointRecord(
                namespace=namespace, name=name, value=value, fence=fence, updated_us=now, now_us=now
            )
            return True

        result: bool = yield self._queue_step(step)
        return result
