"""Queue workers in a replica: the ``[queues.NAME]`` tables of a jobs file, run by
``fleetcron run`` beside the scheduler (docs/queues.md).

A table names the handler and how to work::

    [queues.invoices]
    call = "billing:invoice"      # called with each item (a fleetcron.Claimed)
    batch = 10                    # items claimed at a time
    workers = 2                   # worker loops in each replica
    visibility = "5m"             # a claim's length, renewed while the batch is worked
    retry_backoff = "10s"         # after a failure; doubled each time…
    retry_backoff_max = "1h"      # …up to this
    idle = "1s"                   # the wait when there is nothing to claim

How many deliveries an item gets is the item's own, set by whoever puts it
(``fleet.queue(name, max_attempts=…)``): workers with different files agree on it.

On shutdown the workers stop claiming and finish the batch in hand within the replica's
shutdown grace; what is left is cancelled, its claims expire, and another replica gets the
items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcron._log import log
from fleetcron.durations import to_micros
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.job_options import import_call
from fleetcron.jobspec import one_line
from fleetcron.names import validate_name
from fleetcron.queue import MAX_BATCH, AsyncQueue, QueueSettings, wait_set
from fleetcron.stores.base import AsyncStore

__all__ = ["QUEUE_KEYS", "QueueSpec", "QueueWorkers", "load_queue_specs"]

QUEUE_KEYS = frozenset(
    {
        "call",
        "batch",
        "workers",
        "visibility",
        "retry_backoff",
        "retry_backoff_max",
        "idle",
    }
)
_MAX_WORKERS = 64
STATS_EVERY_S = 15.0
"""How often a replica with workers reads its queues' standing for the metrics."""


@dataclass(frozen=True, kw_only=True)
class QueueSpec:
    """One ``[queues.NAME]`` table, checked."""

    name: str
    reference: str
    handler: Callable[..., Any]
    batch: int = 10
    workers: int = 1
    idle_us: int = 1_000_000
    settings: QueueSettings = field(default_factory=QueueSettings)


class _Table:
    def __init__(self, name: str, options: Mapping[str, object], where: str) -> None:
        self.name, self.options, self.where = name, options, where

    def fail(self, key: str, problem: str) -> ConfigurationError:
        return ConfigurationError(
            one_line(f"{self.where}: queue {self.name!r}: key {key!r}: {problem}")
        )

    def duration(self, key: str, default: str) -> str:
        value = self.options.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, f'{value!r} is not a duration: write a string, e.g. "30s"')
        try:
            to_micros(value, what=key)
        except ConfigurationError as exc:
            raise self.fail(key, exc.message.removeprefix(f"{key}: ")) from None
        return value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, not {value!r}")
        if not low <= value <= high:
            raise self.fail(key, f"must be {low} to {high}, got {value}")
        return value


def load_queue_specs(table: object, *, where: str, base_dir: Path | None) -> tuple[QueueSpec, ...]:
    """The ``[queues]`` table of a jobs file, checked: every problem is a one-line
    :class:`ConfigurationError` naming the file, the queue and the key."""
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where}: 'queues' must be [queues.NAME] tables")
    specs = []
    for raw_name, options in table.items():
        try:
            name = validate_name(raw_name, what="queue name")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc.message}") from None
        if not isinstance(options, dict):
            raise ConfigurationError(f"{where}: queue {name!r}: must be a table [queues.{name}]")
        checked = _Table(name, options, where)
        unknown = sorted(set(options) - QUEUE_KEYS)
        if unknown:
            raise checked.fail(unknown[0], f"unknown key (known: {', '.join(sorted(QUEUE_KEYS))})")
        reference = options.get("call")
        if not isinstance(reference, str) or not reference.strip():
            raise checked.fail("call", "a 'module:function' handler is required")
        try:
            handler = import_call(reference.strip(), base_dir)
        except ConfigurationError as exc:
            raise checked.fail("call", exc.message) from None
        try:
            settings = QueueSettings.of(
                visibility=checked.duration("visibility", "5m"),
                retry_backoff=checked.duration("retry_backoff", "10s"),
                retry_backoff_max=checked.duration("retry_backoff_max", "1h"),
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: queue {name!r}: {exc.message}") from None
        idle = to_micros(checked.duration("idle", "1s"), what="idle")
        if idle <= 0:
            raise checked.fail("idle", "must be longer than 0")
        specs.append(
            QueueSpec(
                name=name,
                reference=reference.strip(),
                handler=handler,
                batch=checked.integer("batch", 10, 1, MAX_BATCH),
                workers=checked.integer("workers", 1, 1, _MAX_WORKERS),
                idle_us=idle,
                settings=settings,
            )
        )
    return tuple(specs)


class QueueWorkers:
    """The worker loops of a replica's queues, on its event loop."""

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        specs: Sequence[QueueSpec],
        *,
        observe: Callable[[str, str, int], None] | None = None,
        on_stats: Callable[[Sequence[Any]], None] | None = None,
    ) -> None:
        self.specs = tuple(specs)
        self._queues = [
            (spec, AsyncQueue(store, namespace, spec.name, spec.settings)) for spec in specs
        ]
        self._observe = observe
        self._on_stats = on_stats
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start every worker loop (and the stats reader, when someone listens)."""
        for spec, queue in self._queues:
            for index in range(spec.workers):
                self._tasks.append(
                    asyncio.create_task(
                        self._work(spec, queue), name=f"fleetcron-queue:{spec.name}:{index}"
                    )
                )
        if self._on_stats is not None and self._queues:
            self._tasks.append(asyncio.create_task(self._stats(), name="fleetcron-queue-stats"))

    async def _work(self, spec: QueueSpec, queue: AsyncQueue) -> None:
        observe = None
        if self._observe is not None:
            report = self._observe
            observe = lambda outcome, count: report(spec.name, outcome, count)  # noqa: E731
        while not self._stop.is_set():
            try:
                await queue.work(
                    spec.handler,
                    batch=spec.batch,
                    idle=spec.idle_us / 1e6,
                    stop=self._stop,
                    observe=observe,
                )
            except StoreError as exc:
                # The store is down: what the worker held expires and is delivered again.
                log.warning(
                    "queue %s: store unavailable (%s); retrying",
                    spec.name,
                    exc,
                    extra={"action": "queue_store_error", "queue": spec.name},
                )
                await wait_set(self._stop, spec.idle_us / 1e6 + 1)
            except Exception:
                # Not the handler's (work gives those back): a fault of the loop itself.
                # Said at once, not at shutdown, and the replica keeps its worker.
                log.exception(
                    "queue %s: worker failed; restarting it",
                    spec.name,
                    extra={"action": "queue_worker_failed", "queue": spec.name},
                )
                await wait_set(self._stop, spec.idle_us / 1e6 + 1)

    async def _stats(self) -> None:
        assert self._on_stats is not None
        while not self._stop.is_set():
            try:
                self._on_stats([await queue.stats() for _spec, queue in self._queues])
            except StoreError:
                pass  # the workers report the outage
            await wait_set(self._stop, STATS_EVERY_S)

    async def stop(self, grace_s: float) -> None:
        """Stop claiming; let each worker finish its batch for up to ``grace_s``, then
        cancel what is left (its claims expire and the items go to another replica)."""
        self._stop.set()
        if not self._tasks:
            return
        done, pending = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "%d queue worker(s) did not finish their batch within %.0fs; their items "
                "will be delivered again",
                len(pending),
                grace_s,
                extra={"action": "queue_workers_cancelled"},
            )
            await asyncio.wait(pending, timeout=5)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "queue worker %s failed: %r",
                    task.get_name(),
                    task.exception(),
                    extra={"action": "queue_worker_failed"},
                )
