"""Cancel requests reaching the runs in flight within about a second.

A request to stop a running attempt (``fleetcron cancel``, ``Fleet.cancel``, the
dashboard, or a newer slot of an ``overlap = "cancel_other"`` job) is a flag on the
attempt's ledger row. The attempt's own lease renewals would see it only every
``lock_at_most / 3`` (200 s with the default 10 m), so while a replica has attempts in
flight it reads their rows every :data:`CANCEL_WATCH_S`: one read per replica and second,
whatever the number of its runs, and none while it runs nothing. A request is acted on
as a lost lease is — a command's process group gets SIGTERM, then SIGKILL after the kill
grace; a Python job's ``ctx.cancelled`` is set — and the attempt is recorded
``cancelled`` with who asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fleetcron.errors import StoreError
from fleetcron.models import RunRecord
from fleetcron.slot_lease import cancel_reason
from fleetcron.stores.base import AsyncStore, Operation, Operations

__all__ = ["CANCEL_WATCH_S", "Attempt", "CancelWatch", "runs_of"]

CANCEL_WATCH_S = 1.0
"""How often a replica with runs in flight reads their rows for cancel requests."""


def runs_of(
    ops: Operations, namespace: str, keys: Sequence[tuple[str, int]]
) -> Operation[list[RunRecord | None]]:
    """The ledger rows of ``keys`` (``(job, slot_us)``), in order, in one store call: a
    primary-key read each, whatever the backend."""
    rows: list[RunRecord | None] = []
    for job, slot_us in keys:
        row = yield from ops.run_get(namespace, job, slot_us)
        rows.append(row)
    return rows


class Attempt(Protocol):
    """What the watch needs of a run in flight."""

    @property
    def record(self) -> RunRecord: ...

    @property
    def stopping(self) -> bool:
        """Whether the attempt is already being stopped (for any reason)."""
        ...

    def cancel(self, reason: str) -> None:
        """A cancel request reached the attempt: stop it, recording ``reason``."""
        ...


class CancelWatch:
    """Reads the rows of the attempts in ``running`` every ``every_s`` while there are
    any, and stops those whose row asks for it. :meth:`wake` after a run starts; the
    watch ends by itself when nothing runs."""

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        running: Callable[[], Mapping[tuple[str, int], Attempt]],
        *,
        every_s: float = CANCEL_WATCH_S,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._running = running
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Make sure the watch runs (a run has just started)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="fleetcron-cancel-watch")

    async def close(self) -> None:
        """Stop the watch and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while self._running():
            await asyncio.sleep(self._every_s)
            attempts = [a for a in self._running().values() if not a.stopping]
            if not attempts:
                continue
            keys = [(a.record.job, a.record.slot_us) for a in attempts]
            try:
                rows = await self._store.run(runs_of(self._store.ops, self._namespace, keys))
            except StoreError:
                continue  # an outage: the runs' leases deal with it; looked at again
            for attempt, row in zip(attempts, rows, strict=True):
                self._apply(attempt, row)

    @staticmethod
    def _apply(attempt: Attempt, row: RunRecord | None) -> None:
        record = attempt.record
        if (
            row is None
            or not row.cancel_requested
            or row.state != "running"
            or row.fence != record.fence
            or attempt.stopping
        ):
            return
        attempt.cancel(cancel_reason(row))
