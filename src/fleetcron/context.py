"""What a job function receives: :class:`RunContext`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetcron import fencing
from fleetcron.checkpoint import Checkpoint
from fleetcron.durations import DurationLike
from fleetcron.errors import ConfigurationError, RunCancelled
from fleetcron.models import micros_to_datetime
from fleetcron.queue import JobQueue, QueueSettings

__all__ = ["RunContext"]


class _CancelState:
    """Whether, and why, the run was asked to stop; set once, from any thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """One attempt of one slot, as the job sees it.

    ``fence`` is strictly greater than every fence issued before for this job: hand it to
    the data the job writes so a stale holder is refused. ``cancelled`` becomes true when
    the run must stop (lease lost, timeout, cancel requested, shutdown).

    What each kind of job gets when its run is cancelled:

    - ``async def``: the task is cancelled (``CancelledError`` at its next ``await``).
    - a plain function (``isolate = "none"``): it runs in a worker thread, which cannot be
      killed. It is told — ``ctx.cancelled``, ``ctx.raise_if_cancelled()``,
      ``ctx.sleep()`` returning early — and should stop between units of work. One that
      does not return by the lease's deadline is abandoned: its outcome is recorded as
      ``cancelled`` and the replica starts no other run of the job until it returns. Its
      late writes are refused only where the data checks the fence.
    - ``isolate = "process"``: the function runs in a child process, stopped like a
      command: SIGTERM (``RunCancelled`` is raised in it) a grace before the lease's
      deadline, SIGKILL at the deadline. Nothing of it outlives the lease.
    """

    job: str
    namespace: str
    slot_us: int
    fence: int
    attempt: int
    run_id: str
    trigger: str
    logger: logging.LoggerAdapter[logging.Logger]
    _cancel: _CancelState = field(default_factory=_CancelState, repr=False)
    _checkpoint: Checkpoint | None = field(default=None, repr=False)
    _queues: Callable[[str, QueueSettings], JobQueue] | None = field(default=None, repr=False)

    def queue(
        self,
        name: str,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> JobQueue:
        """The work queue ``name`` of this run's namespace, to put work in (a scheduled
        job that fans out): ``ctx.queue("invoices").put_many(…)`` (``aput_many`` in an
        ``async def``). The settings are those of :meth:`fleetcron.Fleet.queue`;
        ``max_attempts`` is given to the items put."""
        settings = QueueSettings.of(
            visibility=visibility,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
        )
        if self._queues is None:
            raise ConfigurationError(
                "ctx.queue is for jobs run in the scheduler's process (a Python job without "
                'isolate = "process"); elsewhere open the queue with fleetcron.Fleet(...).queue'
            )
        return self._queues(name, settings)

    @property
    def checkpoint(self) -> Checkpoint:
        """The job's high-water mark in the store (:mod:`fleetcron.checkpoint`), moved
        only under this run's fence: ``ctx.checkpoint.get(default)`` /
        ``ctx.checkpoint.set(value)`` (``aget``/``aset`` in an ``async def``)."""
        if self._checkpoint is None:
            raise ConfigurationError(
                "ctx.checkpoint is for jobs run in the scheduler's process (a Python job "
                'without isolate = "process"); a command or an isolated job keeps its mark '
                "in its own database, fenced with FLEETCRON_FENCE (docs/idempotency.md)"
            )
        return self._checkpoint

    @property
    def slot(self) -> datetime:
        """The scheduled time of this run (UTC)."""
        return micros_to_datetime(self.slot_us)

    @property
    def cancelled(self) -> bool:
        """Whether the run has been asked to stop."""
        return self._cancel.event.is_set()

    @property
    def cancel_reason(self) -> str | None:
        """Why the run was asked to stop (``None`` while it was not)."""
        return self._cancel.reason

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~fleetcron.errors.RunCancelled` if the run was asked to stop:
        call it between units of work."""
        if self._cancel.event.is_set():
            reason = self._cancel.reason or "cancelled"
            raise RunCancelled(f"run of {self.job!r} cancelled: {reason}", reason=reason)

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return ``True`` early if the run was cancelled."""
        return self._cancel.event.wait(seconds)

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the run to stop (called by fleetcron)."""
        self._cancel.set(reason)

    def check_fence(self, conn: Any, resource: str | None = None) -> None:
        """Refuse this run's writes to your database once a newer run of the job has
        written: :func:`fleetcron.fencing.check` of this run's fence for ``resource``
        (the job's name by default), inside the transaction of ``conn`` that does the
        work. Raises :class:`~fleetcron.fencing.StaleFence` for a stale run."""
        fencing.check(conn, resource if resource is not None else f"job:{self.job}", self.fence)

    def once(self, conn: Any, key: str) -> bool:
        """The processed marker of ``key`` for this job (:func:`fleetcron.fencing.once`):
        recorded in the transaction of ``conn`` that does the work; ``False`` when the
        work it marks has committed already (skip it)."""
        return fencing.once(conn, f"{self.job}:{key}", fence=self.fence)
