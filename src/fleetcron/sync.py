"""The sync faces of the async core: :class:`Fleet` and :class:`Scheduler`.

fleetcron is one asyncio implementation (:class:`~fleetcron.fleet.AsyncFleet`,
:class:`~fleetcron.scheduler.AsyncScheduler`); sync code drives it the way APScheduler's
sync scheduler drives its async one, through :mod:`fleetcron.bridge`. A :class:`Fleet`
drives its core's calls in the caller's thread (``run_inline`` over a threaded store: no
thread hop, no loop); a :class:`Scheduler` runs on a portal — an event loop in a daemon
thread — or, for the blocking daemon, in the calling thread itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from fleetcron.advisory_lease import SyncAdvisoryLease, grant_advisory
from fleetcron.bridge import Portal, ThreadedAsyncStore, run_inline
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import DurationLike
from fleetcron.errors import ConfigurationError
from fleetcron.fleet import (
    AsyncFleet,
    Observed,
    blocking_sleep,
    check_backend,
    locked_terms,
    queue_settings,
    retrying,
)
from fleetcron.jobspec import JobSpec
from fleetcron.lease import Lease, LeaseTerms, LockMode
from fleetcron.lock_terms import DEFAULT_LOCK_AT_MOST, log_acquired, log_skipped, wait_micros
from fleetcron.metrics import Metrics
from fleetcron.models import (
    AdvisoryHold,
    DefinitionConflict,
    LeaseRecord,
    ReplicaRecord,
    RunRecord,
)
from fleetcron.names import resolve_namespace
from fleetcron.queue import Queue
from fleetcron.registry import JobRegistry
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.options import scheduler_options
from fleetcron.scheduling.retention import OrphanJob
from fleetcron.status import FleetStatus
from fleetcron.stores import (
    StoreURL,
    SyncStore,
    async_face,
    open_async_store,
    open_store,
    resolve_backend,
)
from fleetcron.stores.base import AsyncStore

__all__ = ["Fleet", "Scheduler"]

F = TypeVar("F", bound=Callable[..., Any])


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


class Fleet(JobRegistry, Observed):
    """The sync face of :class:`AsyncFleet`: the same calls, blocking, over a sync store.

    ``backend`` is a URL (as for :meth:`AsyncFleet.connect`), an already-open sync store,
    or ``None`` for ``$FLEETCRON_BACKEND`` or the SQLite default. Connecting happens here,
    so an unreachable store raises :class:`~fleetcron.errors.StoreUnavailable` at once.
    """

    def __init__(
        self,
        backend: str | SyncStore | None = None,
        *,
        namespace: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        check_backend(backend, store_allowed=True)
        self.namespace = resolve_namespace(namespace)
        self.clock = clock
        self._url: StoreURL | None = None
        if backend is None or isinstance(backend, str):
            self._url = resolve_backend(backend)
            self.store: SyncStore = open_store(self._url)
            self._owns_store = True
        else:
            self.store = backend
            self._owns_store = False
        JobRegistry.__init__(self)
        # The one implementation, over this fleet's store, driven in the caller's thread.
        self._core = AsyncFleet(
            ThreadedAsyncStore(self.store), namespace=self.namespace, clock=clock
        )
        self._background: Scheduler | None = None
        self._portal: Portal | None = None  # where the keepalives of its leases run
        self._portal_lock = threading.Lock()

    # -- leases --------------------------------------------------------------------------
    def _acquire(self, terms: LeaseTerms) -> Lease | None:
        if terms.mode == "advisory":
            return self._acquire_advisory(terms)
        granted = run_inline(self._core._grant(terms))
        if granted is None:
            return None
        record, sent = granted
        lease = Lease(
            self.store, terms, record, sent_us=sent, clock=self.clock, portal=self._keepalives
        )
        if terms.keepalive:
            lease.start_keepalive()
        log_acquired(lease)
        return lease

    def _acquire_advisory(self, terms: LeaseTerms) -> Lease | None:
        advisory = run_inline(grant_advisory(self._core.store, terms, self.clock))
        if advisory is None:
            return None
        record, sent, session = advisory
        lease = SyncAdvisoryLease(
            self.store,
            terms,
            record,
            sent_us=sent,
            clock=self.clock,
            session=session,
            portal=self._keepalives,
        )
        lease.start_keepalive()  # watches the session whether or not it renews
        log_acquired(lease)
        return lease

    async def _acquire_inline(self, terms: LeaseTerms) -> Lease | None:
        return self._acquire(terms)

    def try_lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
        mode: LockMode = "lease",
    ) -> Lease | None:
        """Sync :meth:`AsyncFleet.try_lock`: a :class:`~fleetcron.lease.Lease`, or
        ``None`` when another holder has it (after ``wait``, if given). ``mode="advisory"``
        (PostgreSQL): the name is free again the moment this process or its connection
        dies (:mod:`fleetcron.advisory_lease`)."""
        terms = self._core._terms(name, lock_at_most, lock_at_least, keepalive, mode)
        wait_us = wait_micros(wait)
        if wait_us <= 0:
            # One try, as retrying's first with nothing left to wait: without its
            # coroutine, which costs a tenth of an uncontended Redis cycle's client CPU.
            lease = self._acquire(terms)
            if lease is None:
                log_skipped(terms)
            return lease
        return run_inline(
            retrying(self._acquire_inline, terms, wait_us, self.clock, blocking_sleep)
        )

    def lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
        mode: LockMode = "lease",
    ) -> Lease:
        """Sync :meth:`AsyncFleet.lock`: the returned :class:`~fleetcron.lease.Lease` is a
        context manager that releases on exit; :class:`~fleetcron.errors.LockBusy` when
        another holder has it."""
        lease = self.try_lock(
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            wait=wait,
            mode=mode,
        )
        if lease is None:
            raise run_inline(self._core._busy(name))
        return lease

    def locked(self, name: str, **options: Any) -> Callable[[F], F]:
        """Decorator: run the function under the lease, or skip (return ``None``) when held.

        The skip returns ``None`` whatever the function's declared type. Works for plain
        and ``async def`` functions (the latter take the lease through
        the same store in a worker thread, so they never block the loop).
        """
        terms = locked_terms(self.namespace, name, options)

        def decorate(func: F) -> F:
            if inspect.iscoroutinefunction(func):

                @functools.wraps(func)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    lease = await asyncio.to_thread(self._acquire, terms)
                    if lease is None:
                        log_skipped(terms)
                        return None
                    task = asyncio.current_task()
                    loop = asyncio.get_running_loop()
                    if task is not None:

                        def cancel(_: Lease) -> None:
                            loop.call_soon_threadsafe(task.cancel)

                        lease.on_lost(cancel)
                    try:
                        return await func(*args, **kwargs)
                    except asyncio.CancelledError:
                        if lease.is_lost and task is not None:
                            task.uncancel()
                            lease.check()
                        raise
                    finally:
                        await asyncio.to_thread(lease.release)

                return cast(F, run_async)

            @functools.wraps(func)
            def run(*args: Any, **kwargs: Any) -> Any:
                lease = self._acquire(terms)
                if lease is None:
                    log_skipped(terms)
                    return None
                with lease:
                    return func(*args, **kwargs)

            return cast(F, run)

        return decorate

    def locks(self) -> list[LeaseRecord]:
        """Sync :meth:`AsyncFleet.locks`."""
        return run_inline(self._core.locks())

    def advisory_locks(self, names: Sequence[str] | None = None) -> list[AdvisoryHold]:
        """Sync :meth:`AsyncFleet.advisory_locks`."""
        return run_inline(self._core.advisory_locks(names))

    def get(self, name: str) -> LeaseRecord | None:
        """Sync :meth:`AsyncFleet.get`."""
        return run_inline(self._core.get(name))

    def prune(self, older_than: DurationLike = "30d", *, dry_run: bool = False) -> list[str]:
        """Sync :meth:`AsyncFleet.prune`."""
        return run_inline(self._core.prune(older_than, dry_run=dry_run))

    # -- the ledger ----------------------------------------------------------------------
    def runs(self, job: str | None = None, *, limit: int = 50) -> list[RunRecord]:
        """Sync :meth:`AsyncFleet.runs`."""
        return run_inline(self._core.runs(job, limit=limit))

    def cancel(self, job: str, *, slot: datetime | None = None, by: str | None = None) -> int:
        """Sync :meth:`AsyncFleet.cancel`."""
        return run_inline(self._core.cancel(job, slot=slot, by=by))

    def replicas(self, *, include_gone: bool = False) -> list[ReplicaRecord]:
        """Sync :meth:`AsyncFleet.replicas`."""
        return run_inline(self._core.replicas(include_gone=include_gone))

    def status(self, jobs: Sequence[str] | None = None) -> FleetStatus:
        """Sync :meth:`AsyncFleet.status`."""
        return run_inline(self._core.status(jobs))

    def prune_runs(
        self,
        *,
        older_than: DurationLike | None = None,
        keep: int | None = None,
        job: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Sync :meth:`AsyncFleet.prune_runs`."""
        return run_inline(
            self._core.prune_runs(older_than=older_than, keep=keep, job=job, dry_run=dry_run)
        )

    def prune_jobs(
        self, older_than: DurationLike = "7d", *, dry_run: bool = False
    ) -> list[OrphanJob]:
        """Sync :meth:`AsyncFleet.prune_jobs`."""
        return run_inline(self._core.prune_jobs(older_than, dry_run=dry_run))

    # -- the queue -----------------------------------------------------------------------
    def queue(
        self,
        name: str,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> Queue:
        """The sync face of :meth:`AsyncFleet.queue` (same settings)."""
        settings = queue_settings(visibility, max_attempts, retry_backoff, retry_backoff_max)
        return Queue(self.store, self.namespace, name, settings, portal=self._keepalives)

    # -- the scheduler -------------------------------------------------------------------
    def _async_store(self) -> Awaitable[AsyncStore]:
        async def opened() -> AsyncStore:
            if self._url is not None:
                return await open_async_store(self._url)
            return async_face(self.store)

        return opened()

    def scheduler(self, *, mode: str = "claim", concurrency: int = 16, **options: Any) -> Scheduler:
        """A scheduler of this fleet's jobs, not started: ``run()`` it (blocking) or
        ``start()`` / ``stop()`` it in the background. ``options``: the other fields of
        :class:`~fleetcron.scheduler.SchedulerOptions` (``shutdown_grace_s``, …)."""
        return Scheduler(
            self._async_store,
            self.jobs,
            scheduler_options(self.namespace, self._url, mode, concurrency, options),
            clock=self.clock,
            close_store=self._url is not None,
            metrics=self.metrics,
        )

    def run(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs in this thread until SIGTERM/SIGINT (the blocking daemon)."""
        self.scheduler(mode=mode, concurrency=concurrency).run()

    def start(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs in the background; :meth:`stop` ends it."""
        if self._background is not None:
            raise ConfigurationError("the scheduler is already running")
        background = self.scheduler(mode=mode, concurrency=concurrency)
        background.start()
        self._background = background

    def stop(self, timeout: float | None = 60) -> None:
        """Stop the background scheduler: no new claims; running jobs finish (grace)."""
        background, self._background = self._background, None
        if background is not None:
            background.stop(timeout)

    def _keepalives(self) -> Portal:
        """The portal the keepalives of this fleet's leases run on (started on first use)."""
        with self._portal_lock:
            if self._portal is None:
                self._portal = Portal("fleetcron-keepalive")
            return self._portal

    def close(self) -> None:
        """Stop the scheduler and the keepalives if they run; close the store if this
        fleet opened it."""
        self.stop()
        with self._portal_lock:
            portal, self._portal = self._portal, None
        if portal is not None:
            portal.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
