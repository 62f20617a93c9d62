"""The entry point: :class:`Fleet` (sync) and :class:`AsyncFleet` (asyncio).

A fleet is one store and one namespace. Locks taken through it are leases in the store,
each with a fencing token::

    fleet = fleetcron.Fleet("postgresql://app@db/app", namespace="prod")
    with fleet.lock("report", lock_at_most="10m", lock_at_least="30s") as lease:
        write_report(fence=lease.fence)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from prometheus_client import make_asgi_app

from fleetcron.bridge import Portal, ThreadedAsyncStore
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import DurationLike
from fleetcron.errors import ConfigurationError, LockBusy
from fleetcron.lease import AsyncLease, Lease, LeaseTerms, new_holder
from fleetcron.metrics import Metrics
from fleetcron.models import REPLICA_RETAIN_US, LeaseRecord, ReplicaRecord, RunRecord
from fleetcron.names import validate_name
from fleetcron.queue import AsyncQueue, Queue, QueueSettings
from fleetcron.registry import JobRegistry
from fleetcron.scheduler import AsyncScheduler
from fleetcron.scheduling.retention import (
    OrphanJob,
    prune_jobs_plan,
    prune_runs_plan,
    run_plan,
    run_plan_async,
)
from fleetcron.status import FleetStatus, read_status, shown_leases
from fleetcron.stores import (
    AsyncStore,
    StoreURL,
    SyncStore,
    open_async_store,
    open_store,
    resolve_backend,
)
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.sync import Scheduler
from fleetcron.terms import (
    DEFAULT_LOCK_AT_MOST,
    cached_terms,
    lease_terms,
    log_acquired,
    log_skipped,
    older_than_us,
    resolve_namespace,
    row_limit,
    scheduler_options,
    wait_backoff_s,
    wait_micros,
)

__all__ = ["AsyncFleet", "Fleet"]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


def _check_backend(backend: object, *, store_allowed: bool) -> None:
    """Refuse, by its type, a backend that is neither a URL (nor, where allowed, an open
    store): ``Fleet(5)`` must fail here, not with an AttributeError on first use."""
    if backend is None or isinstance(backend, str):
        return
    if store_allowed and hasattr(backend, "run") and hasattr(backend, "ops"):
        return
    hint = " (decode it: backend.decode())" if isinstance(backend, bytes | bytearray) else ""
    wanted = "a URL string or an open store" if store_allowed else "a URL string"
    raise ConfigurationError(f"backend must be {wanted}, not {type(backend).__name__}{hint}")


class _Observed:
    """What the sync and the async fleet share to be watched: their schedulers' metrics."""

    _metrics: Metrics | None = None

    @property
    def metrics(self) -> Metrics:
        """The Prometheus metrics of this fleet's schedulers (:mod:`fleetcron.metrics`)."""
        if self._metrics is None:
            self._metrics = Metrics()
        return self._metrics

    def metrics_app(self) -> Any:
        """An ASGI app serving :attr:`metrics` in the Prometheus text format, to mount in
        a web application (``prometheus_client.make_asgi_app``)."""
        return make_asgi_app(self.metrics.registry)


class Fleet(JobRegistry, _Observed):
    """A store and a namespace; hands out leases with fencing tokens (sync API).

    ``backend`` is a URL (``sqlite:///…``, ``postgresql://…``, ``mysql://…``,
    ``redis://…``, ``memory://``), an already-open store, or ``None`` for
    ``$FLEETCRON_BACKEND`` or the SQLite default. Connecting happens here, so an
    unreachable store raises :class:`~fleetcron.errors.StoreUnavailable` at once.
    """

    def __init__(
        self,
        backend: str | SyncStore | None = None,
        *,
        namespace: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        _check_backend(backend, store_allowed=True)
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
        self._background: Scheduler | None = None
        self._portal: Portal | None = None  # where the keepalives of its leases run
        self._portal_lock = threading.Lock()

    # -- the scheduler -------------------------------------------------------------------
    def _async_store(self) -> Awaitable[AsyncStore]:
        async def opened() -> AsyncStore:
            if self._url is not None:
                return await open_async_store(self._url)
            if isinstance(self.store, MemoryStore):
                return AsyncMemoryStore(self.store)
            return ThreadedAsyncStore(self.store)

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

    def status(self, jobs: Sequence[str] | None = None) -> FleetStatus:
        """Every job's health read from the store (:mod:`fleetcron.health`), worst
        first: what ``fleetcron status`` prints."""
        return self.store.run(read_status(self.store.ops, self.namespace, jobs))

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

    def runs(self, job: str | None = None, *, limit: int = 50) -> list[RunRecord]:
        """Ledger rows of this namespace (of ``job`` only, when given), newest slot first."""
        return self.store.run(self.store.ops.run_list(self.namespace, job, row_limit(limit)))

    def replicas(self, *, include_gone: bool = False) -> list[ReplicaRecord]:
        """The scheduler replicas of this namespace that are up — their heartbeat rows have
        not expired on the store's clock — by replica id. With ``include_gone``, also those
        that stopped beating without leaving (crashed, hung, cut off from the store) within
        the last 10 minutes, each with ``gone`` set and ``silent_us`` since its last beat.
        A replica that stopped cleanly is never listed."""
        gone_within = REPLICA_RETAIN_US if include_gone else 0
        return self.store.run(self.store.ops.replica_list(self.namespace, gone_within))

    def _terms(
        self, name: str, lock_at_most: DurationLike, lock_at_least: DurationLike, keepalive: bool
    ) -> LeaseTerms:
        return cached_terms(
            self.namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )

    def _acquire(self, terms: LeaseTerms) -> Lease | None:
        sent = self.clock.monotonic_us()
        record = self.store.run(
            self.store.ops.lease_acquire(
                terms.namespace,
                terms.name,
                new_holder(),
                terms.lock_at_most_us,
                terms.lock_at_least_us,
            )
        )
        if record is None:
            return None
        lease = Lease(
            self.store, terms, record, sent_us=sent, clock=self.clock, portal=self._keepalives
        )
        if terms.keepalive:
            lease.start_keepalive()
        log_acquired(lease)
        return lease

    def try_lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
    ) -> Lease | None:
        """Take the lease ``name`` or return ``None`` when another holder has it.

        With ``wait``, retry (with jittered back-off) for up to that long first.
        Contention is never an error here; store failures raise ``StoreError``.
        """
        terms = self._terms(name, lock_at_most, lock_at_least, keepalive)
        wait_us = wait_micros(wait)
        give_up = self.clock.monotonic_us() + wait_us
        attempt = 0
        while True:
            lease = self._acquire(terms)
            if lease is not None:
                return lease
            left = give_up - self.clock.monotonic_us()
            if left <= 0:
                log_skipped(terms)
                return None
            time.sleep(min(wait_backoff_s(attempt), left / 1e6))
            attempt += 1

    def lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
    ) -> Lease:
        """Take the lease ``name`` or raise :class:`~fleetcron.errors.LockBusy`.

        The returned :class:`Lease` is a context manager that releases on exit.
        """
        lease = self.try_lock(
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            wait=wait,
        )
        if lease is None:
            raise LockBusy(validate_name(name), holder=self._holder_of(name))
        return lease

    def _holder_of(self, name: str) -> str | None:
        try:
            record = self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))
        except Exception:  # only decorates the error message
            return None
        return record.holder_display if record is not None and record.held else None

    def locked(self, name: str, **options: Any) -> Callable[[F], F]:
        """Decorator: run the function under the lease, or skip (return ``None``) when held.

        The skip returns ``None`` whatever the function's declared type. Works for plain
        and ``async def`` functions (the latter take the lease through
        the same store in a worker thread, so they never block the loop).
        """
        terms = self._terms(
            name,
            options.get("lock_at_most", DEFAULT_LOCK_AT_MOST),
            options.get("lock_at_least", 0),
            options.get("keepalive", True),
        )
        unknown = set(options) - {"lock_at_most", "lock_at_least", "keepalive"}
        if unknown:
            raise ConfigurationError(f"locked(): unknown option(s) {', '.join(sorted(unknown))}")

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
        """Every lease row of this namespace (held or not), by name — without the
        monitor's alert markers, which lock nothing."""
        return shown_leases(self.store.run(self.store.ops.lease_list(self.namespace)))

    def get(self, name: str) -> LeaseRecord | None:
        """The lease row of ``name``, or ``None`` if it never existed."""
        return self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))

    def prune(self, older_than: DurationLike = "30d", *, dry_run: bool = False) -> list[str]:
        """Delete lease rows unused for ``older_than``; return their names."""
        micros = older_than_us(older_than)
        return self.store.run(self.store.ops.lease_prune(self.namespace, micros, dry_run))

    def prune_runs(
        self,
        *,
        older_than: DurationLike | None = None,
        keep: int | None = None,
        job: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Apply retention now: delete each job's finished runs that finished more than
        its rule's age ago and are not among its newest ``keep`` (runs queued, running or
        waiting for a retry always stay). The rule is each job's as its replicas
        registered it (``retention``, ``retention_keep``; else 30 days and 100);
        ``older_than`` and ``keep`` replace those parts for every job. ``job``: that job
        only (a :class:`ConfigurationError` when the store does not know it).

        Rows go in bounded batches, one short store operation each. Returns the rows
        deleted per job — with ``dry_run``, those that would be, deleting nothing (counted
        up to :data:`~fleetcron.scheduling.retention.COUNT_LIMIT` per job: a job at that
        count has at least that many); jobs with none are left out."""
        plan = prune_runs_plan(
            self.store.ops,
            self.namespace,
            older_than=older_than,
            keep=keep,
            job=job,
            dry_run=dry_run,
        )
        return run_plan(plan, self.store)

    def prune_jobs(
        self, older_than: DurationLike = "7d", *, dry_run: bool = False
    ) -> list[OrphanJob]:
        """Forget jobs no replica defines any more: delete the job rows of this namespace
        that nobody registered, claimed or finished for ``older_than`` (default 7 days),
        each with its finished run rows. A job with a queued or running run is kept
        (``deleted`` false). Returns every idle job found, by name; with ``dry_run``,
        what would be deleted, deleting nothing.

        A replica that still defines a job, has not restarted since, and whose schedule
        fires less often than ``older_than`` looks the same: check with ``dry_run``."""
        plan = prune_jobs_plan(
            self.store.ops, self.namespace, older_than_us(older_than), dry_run=dry_run
        )
        return run_plan(plan, self.store)

    def queue(
        self,
        name: str,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> Queue:
        """The work queue ``name`` of this fleet's namespace (:mod:`fleetcron.queue`):
        a claim holds an item for ``visibility`` unless extended; an item gets
        ``max_attempts`` deliveries, the next one ``retry_backoff`` after a failure
        (doubled each time, at most ``retry_backoff_max``), then it is dead."""
        settings = QueueSettings.of(
            visibility=visibility,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
        )
        return Queue(self.store, self.namespace, name, settings, portal=self._keepalives)

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


class AsyncFleet(JobRegistry, _Observed):
    """The asyncio twin of :class:`Fleet`. Create with ``await AsyncFleet.connect(url)``."""

    def __init__(
        self, store: AsyncStore, *, namespace: str | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        if not (hasattr(store, "run") and hasattr(store, "ops")):
            raise ConfigurationError(
                f"AsyncFleet takes an open async store, not {type(store).__name__}; "
                "use `await AsyncFleet.connect(url)` for a URL"
            )
        JobRegistry.__init__(self)
        self.store = store
        self.namespace = resolve_namespace(namespace)
        self.clock = clock
        self._owns_store = False
        self._url: StoreURL | None = None
        self._background: asyncio.Task[None] | None = None
        self._background_core: AsyncScheduler | None = None

    def queue(
        self,
        name: str,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> AsyncQueue:
        """The work queue ``name`` of this fleet's namespace (see :meth:`Fleet.queue`)."""
        settings = QueueSettings.of(
            visibility=visibility,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
        )
        return AsyncQueue(self.store, self.namespace, name, settings)

    @classmethod
    async def connect(
        cls,
        backend: str | None = None,
        *,
        namespace: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> AsyncFleet:
        """Open the store behind ``backend`` (same resolution as :class:`Fleet`)."""
        _check_backend(backend, store_allowed=False)
        namespace = resolve_namespace(namespace)
        url = resolve_backend(backend)
        fleet = cls(await open_async_store(url), namespace=namespace, clock=clock)
        fleet._owns_store = True
        fleet._url = url
        return fleet

    async def _acquire(self, terms: LeaseTerms) -> AsyncLease | None:
        sent = self.clock.monotonic_us()
        record = await self.store.run(
            self.store.ops.lease_acquire(
                terms.namespace,
                terms.name,
                new_holder(),
                terms.lock_at_most_us,
                terms.lock_at_least_us,
            )
        )
        if record is None:
            return None
        lease = AsyncLease(self.store, terms, record, sent_us=sent, clock=self.clock)
        if terms.keepalive:
            lease.start_keepalive()
        log_acquired(lease)
        return lease

    async def try_lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
    ) -> AsyncLease | None:
        """Async :meth:`Fleet.try_lock`."""
        terms = cached_terms(
            self.namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )
        give_up = self.clock.monotonic_us() + wait_micros(wait)
        attempt = 0
        while True:
            lease = await self._acquire(terms)
            if lease is not None:
                return lease
            left = give_up - self.clock.monotonic_us()
            if left <= 0:
                log_skipped(terms)
                return None
            await asyncio.sleep(min(wait_backoff_s(attempt), left / 1e6))
            attempt += 1

    async def lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
    ) -> AsyncLease:
        """Async :meth:`Fleet.lock`: ``async with await fleet.lock(...)``, or raises LockBusy."""
        lease = await self.try_lock(
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            wait=wait,
        )
        if lease is None:
            holder = None
            try:
                record = await self.get(name)
                holder = record.holder_display if record is not None and record.held else None
            except Exception:  # only decorates the error message
                holder = None
            raise LockBusy(validate_name(name), holder=holder)
        return lease

    def locked(
        self, name: str, **options: Any
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorator for ``async def`` functions: run under the lease or skip when held."""
        unknown = set(options) - {"lock_at_most", "lock_at_least", "keepalive"}
        if unknown:
            raise ConfigurationError(f"locked(): unknown option(s) {', '.join(sorted(unknown))}")
        terms = lease_terms(
            self.namespace,
            name,
            lock_at_most=options.get("lock_at_most", DEFAULT_LOCK_AT_MOST),
            lock_at_least=options.get("lock_at_least", 0),
            keepalive=options.get("keepalive", True),
        )

        def decorate(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
            @functools.wraps(func)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
                lease = await self._acquire(terms)
                if lease is None:
                    log_skipped(terms)
                    return None
                async with lease:
                    return await func(*args, **kwargs)

            return run

        return decorate

    async def locks(self) -> list[LeaseRecord]:
        """Every lease row of this namespace — without the monitor's alert markers."""
        return shown_leases(await self.store.run(self.store.ops.lease_list(self.namespace)))

    async def get(self, name: str) -> LeaseRecord | None:
        """The lease row of ``name``."""
        return await self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))

    async def prune(self, older_than: DurationLike = "30d", *, dry_run: bool = False) -> list[str]:
        """Async :meth:`Fleet.prune`."""
        micros = older_than_us(older_than)
        return await self.store.run(self.store.ops.lease_prune(self.namespace, micros, dry_run))

    async def prune_runs(
        self,
        *,
        older_than: DurationLike | None = None,
        keep: int | None = None,
        job: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Async :meth:`Fleet.prune_runs`."""
        plan = prune_runs_plan(
            self.store.ops,
            self.namespace,
            older_than=older_than,
            keep=keep,
            job=job,
            dry_run=dry_run,
        )
        return await run_plan_async(plan, self.store)

    async def prune_jobs(
        self, older_than: DurationLike = "7d", *, dry_run: bool = False
    ) -> list[OrphanJob]:
        """Async :meth:`Fleet.prune_jobs`."""
        plan = prune_jobs_plan(
            self.store.ops, self.namespace, older_than_us(older_than), dry_run=dry_run
        )
        return await run_plan_async(plan, self.store)

    async def runs(self, job: str | None = None, *, limit: int = 50) -> list[RunRecord]:
        """Async :meth:`Fleet.runs`."""
        return await self.store.run(self.store.ops.run_list(self.namespace, job, row_limit(limit)))

    async def replicas(self, *, include_gone: bool = False) -> list[ReplicaRecord]:
        """Async :meth:`Fleet.replicas`."""
        gone_within = REPLICA_RETAIN_US if include_gone else 0
        return await self.store.run(self.store.ops.replica_list(self.namespace, gone_within))

    # -- the scheduler -------------------------------------------------------------------
    def scheduler(
        self, *, mode: str = "claim", concurrency: int = 16, **options: Any
    ) -> AsyncScheduler:
        """A scheduler of this fleet's jobs over its store, not started:
        ``await scheduler.run()`` runs it until ``scheduler.stop()``."""
        if not self.jobs:
            raise ConfigurationError("no jobs: register some with @fleet.job(...) first")
        return AsyncScheduler(
            self.store,
            self.jobs,
            scheduler_options(self.namespace, self._url, mode, concurrency, options),
            clock=self.clock,
            metrics=self.metrics,
        )

    async def status(self, jobs: Sequence[str] | None = None) -> FleetStatus:
        """Async :meth:`Fleet.status`."""
        return await self.store.run(read_status(self.store.ops, self.namespace, jobs))

    async def run(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs until the task is cancelled (running jobs get their shutdown
        grace, then the cancellation goes on)."""
        core = self.scheduler(mode=mode, concurrency=concurrency)
        serving = asyncio.ensure_future(core.run())
        try:
            await asyncio.shield(serving)
        except asyncio.CancelledError:
            core.stop()
            await serving
            raise

    async def start(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs in a background task; return once the scheduler has started."""
        if self._background is not None:
            raise ConfigurationError("the scheduler is already running")
        core = self.scheduler(mode=mode, concurrency=concurrency)
        task = asyncio.ensure_future(core.run())
        started = asyncio.ensure_future(core.signals.started.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if task.done():
            task.result()  # the error that stopped it at start
        self._background, self._background_core = task, core

    async def stop(self) -> None:
        """Stop the background scheduler: no new claims; running jobs finish (grace)."""
        task, core = self._background, self._background_core
        self._background = self._background_core = None
        if task is None or core is None:
            return
        core.stop()
        await task

    async def close(self) -> None:
        """Stop the scheduler if it runs; close the store if this fleet opened it."""
        await self.stop()
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
