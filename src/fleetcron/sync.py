"""The sync face of the async core: a portal, and the sync :class:`Scheduler`.

fleetcron's scheduler is one asyncio implementation,
:class:`~fleetcron.scheduler.AsyncScheduler`. Sync code drives it the way APScheduler's
sync scheduler drives its async one: through a :class:`Portal` — an event loop in a daemon
thread that sync calls hand coroutines to (:mod:`fleetcron.bridge`) — or, for the
blocking daemon, in the calling thread itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence

from fleetcron.bridge import Portal
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.errors import ConfigurationError
from fleetcron.jobspec import JobSpec
from fleetcron.metrics import Metrics
from fleetcron.models import DefinitionConflict, RunRecord
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores.base import AsyncStore

__all__ = ["Scheduler"]


class Scheduler:
    """One replica's scheduler, for sync code: the sync face of
    :class:`~fleetcron.scheduler.AsyncScheduler`. Hand out by :meth:`Fleet.scheduler`.

    :meth:`run` blocks in the calling thread until SIGTERM or SIGINT (the daemon);
    :meth:`start` runs it on a :class:`Portal` and returns once it has started, and
    :meth:`stop` stops it: no new claims, running jobs get their shutdown grace.
    """

    def __init__(
        self,
        open_store: Callable[[], Awaitable[AsyncStore]],
        jobs: Sequence[JobSpec],
        options: SchedulerOptions,
        *,
        clock: Clock = SYSTEM_CLOCK,
        close_store: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        if not jobs:
            raise ConfigurationError("no jobs: register some with @fleet.job(...) first")
        self._open_store = open_store
        self._close_store = close_store
        self.jobs = tuple(jobs)
        self.options = options
        self.clock = clock
        self.metrics = metrics
        self.core: AsyncScheduler | None = None
        """The async scheduler while it runs."""
        self._portal: Portal | None = None
        self._future: concurrent.futures.Future[None] | None = None
        self._started = threading.Event()

    @property
    def running(self) -> list[RunRecord]:
        """Attempts in flight on this replica."""
        core = self.core
        return core.running if core is not None else []

    @property
    def conflicts(self) -> Mapping[str, DefinitionConflict]:
        """The jobs this replica does not run because the store holds another definition
        of them (:attr:`AsyncScheduler.conflicts <fleetcron.scheduler.AsyncScheduler.conflicts>`);
        empty while the scheduler is not running."""
        core = self.core
        return core.conflicts if core is not None else {}

    @property
    def replaced(self) -> Mapping[str, DefinitionConflict]:
        """The other definitions this replica replaced in the store when it started
        (:attr:`AsyncScheduler.replaced <fleetcron.scheduler.AsyncScheduler.replaced>`);
        empty while the scheduler is not running."""
        core = self.core
        return core.replaced if core is not None else {}

    async def _serve(self, *, stop_on_signals: bool) -> None:
        store = await self._open_store()
        try:
            core = AsyncScheduler(
                store, self.jobs, self.options, clock=self.clock, metrics=self.metrics
            )
            self.core = core
            if stop_on_signals:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, core.stop)
            self._started.set()
            await core.run()
        finally:
            self.core = None
            if self._close_store:
                await store.close()

    def run(self) -> None:
        """Run in this thread until SIGTERM or SIGINT (the blocking daemon)."""
        asyncio.run(self._serve(stop_on_signals=True))

    def start(self, timeout: float = 30) -> None:
        """Run on a portal thread; return once the scheduler has started."""
        if self._future is not None:
            raise ConfigurationError("the scheduler is already running")
        self._started.clear()
        self._portal = Portal("fleetcron-scheduler")
        self._future = self._portal.spawn(self._serve(stop_on_signals=False))
        self._future.add_done_callback(lambda _: self._started.set())
        self._started.wait(timeout)
        if self._future.done():
            future, self._future = self._future, None
            self._portal.close()
            future.result()  # the error that stopped it at start

    def stop(self, timeout: float | None = 60) -> None:
        """Stop claiming; running jobs get their shutdown grace. Re-raises the error that
        stopped the scheduler, if one did."""
        future, portal = self._future, self._portal
        if future is None or portal is None:
            return
        core = self.core
        if core is not None:
            portal.call_soon(core.stop)
        try:
            future.result(timeout)
        finally:
            self._future = None
            portal.close()
