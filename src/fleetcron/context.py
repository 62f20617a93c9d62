"""What a job function receives: :class:`RunContext`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime

from fleetcron.models import micros_to_datetime

__all__ = ["RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """One attempt of one slot, as the job sees it.

    ``fence`` is strictly greater than every fence issued before for this job: hand it to
    the data the job writes so a stale holder is refused. ``cancelled`` becomes true when
    the run must stop (lease lost, timeout, cancel requested, shutdown); a sync job should
    check it between units of work (``async def`` jobs are cancelled outright).
    """

    job: str
    namespace: str
    slot_us: int
    fence: int
    attempt: int
    run_id: str
    trigger: str
    logger: logging.LoggerAdapter[logging.Logger]
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def slot(self) -> datetime:
        """The scheduled time of this run (UTC)."""
        return micros_to_datetime(self.slot_us)

    @property
    def cancelled(self) -> bool:
        """Whether the run has been asked to stop."""
        return self._cancel.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return ``True`` early if the run was cancelled."""
        return self._cancel.wait(seconds)

    def cancel(self) -> None:
        """Ask the run to stop (called by fleetcron)."""
        self._cancel.set()
