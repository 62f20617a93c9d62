"""The entry point: :class:`AsyncFleet` (asyncio); its sync face is
:class:`~fleetcron.sync.Fleet`.

A fleet is one store and one namespace. Locks taken through it are leases in the store,
each with a fencing token::

    fleet = fleetcron.Fleet("postgresql://app@db/app", namespace="prod")
    with fleet.lock("report", lock_at_most="10m", lock_at_least="30s") as lease:
        write_report(fence=lease.fence)

:class:`AsyncFleet` is the one implementation of what a fleet reads and writes. A
:class:`Fleet` holds one over its sync store (:class:`~fleetcron.bridge.ThreadedAsyncStore`)
and drives each call in the caller's thread there and then
(:func:`~fleetcron.bridge.run_inline`: no thread hop, no event loop); what it adds is what
only the sync side has — sync :class:`~fleetcron.lease.Lease` handles with their keepalive
portal, the sync queue, a scheduler in a background thread, and ``locked`` for plain
functions.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from prometheus_client import make_asgi_app

from fleetcron._log import log
from fleetcron.advisory_lease import AdvisoryLease, advisory_holds, grant_advisory
from fleetcron.cancel_request import (
    cancel_note,
    cancel_runs,
    default_requester,
    requested_slot,
    unknown_job,
)
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import DurationLike, to_micros
from fleetcron.errors import ConfigurationError, LockBusy
from fleetcron.jobspec import MAX_COUNT
from fleetcron.lease import AsyncLease, Lease, LeaseTerms, LockMode, new_holder
from fleetcron.lock_terms import (
    DEFAULT_LOCK_AT_MOST,
    cached_terms,
    lease_terms,
    log_acquired,
    log_skipped,
    wait_backoff_s,
    wait_micros,
)
from fleetcron.metrics import Metrics
from fleetcron.models import (
    REPLICA_RETAIN_US,
    AdvisoryHold,
    LeaseRecord,
    ReplicaRecord,
    RunRecord,
)
from fleetcron.names import resolve_namespace, validate_job_name, validate_name
from fleetcron.queue import AsyncQueue, QueueSettings
from fleetcron.registry import JobRegistry
from fleetcron.scheduler import AsyncScheduler
from fleetcron.scheduling.options import scheduler_options
from fleetcron.scheduling.retention import (
    OrphanJob,
    prune_jobs_plan,
    prune_runs_plan,
    run_plan_async,
    store_retention,
)
from fleetcron.status import FleetStatus, read_status, shown_leases
from fleetcron.stores import (
    AsyncStore,
    StoreURL,
    open_async_store,
    resolve_backend,
)

__all__ = [
    "AsyncFleet",
    "blocking_sleep",
    "locked_terms",
    "older_than_us",
    "queue_settings",
    "retrying",
    "row_limit",
]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
L = TypeVar("L", Lease, AsyncLease)


def check_backend(backend: object, *, store_allowed: bool) -> None:
    """Refuse, by its type, a backend that is neither a URL (nor, where allowed, an open
    store): ``Fleet(5)`` must fail here, not with an AttributeError on first use."""
    if backend is None or isinstance(backend, str):
        return
    if store_allowed and hasattr(backend, "run") and hasattr(backend, "ops"):
        return
    hint = " (decode it: backend.decode())" if isinstance(backend, bytes | bytearray) else ""
    wanted = "a URL string or an open store" if store_allowed else "a URL string"
    raise ConfigurationError(f"backend must be {wanted}, not {type(backend).__name__}{hint}")


async def retrying(
    acquire: Callable[[LeaseTerms], Awaitable[L | None]],
    terms: LeaseTerms,
    wait_us: int,
    clock: Clock,
    pause: Callable[[float], Awaitable[None]],
) -> L | None:
    """Try ``acquire`` until it grants the lease or ``wait_us`` has passed, with a jittered
    back-off between tries (``pause``: how to wait, on a loop or in the caller's thread);
    ``None`` (logged as skipped) when it never did."""
    give_up = clock.monotonic_us() + wait_us
    attempt = 0
    while True:
        lease = await acquire(terms)
        if lease is not None:
            return lease
        left = give_up - clock.monotonic_us()
        if left <= 0:
            log_skipped(terms)
            return None
        await pause(min(wait_backoff_s(attempt), left / 1e6))
        attempt += 1


async def blocking_sleep(seconds: float) -> None:
    """A pause for the sync face: it waits in the caller's thread, never suspending (the
    coroutine is driven by :func:`~fleetcron.bridge.run_inline`, never on a loop)."""
    time.sleep(seconds)  # noqa: ASYNC251


class Observed:
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


class AsyncFleet(JobRegistry, Observed):
    """A store and a namespace; hands out leases with fencing tokens (asyncio). Create
    with ``await AsyncFleet.connect(url)``, or around an open async store.

    ``backend`` is a URL (``sqlite:///…``, ``postgresql://…``, ``mysql://…``,
    ``redis://…``, ``memory://``) or ``None`` for ``$FLEETCRON_BACKEND`` or the SQLite
    default. Connecting happens at once, so an unreachable store raises
    :class:`~fleetcron.errors.StoreUnavailable` there.
    """

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

    @classmethod
    async def connect(
        cls,
        backend: str | None = None,
        *,
        namespace: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> AsyncFleet:
        """Open the store behind ``backend`` (see the class)."""
        check_backend(backend, store_allowed=False)
        namespace = resolve_namespace(namespace)
        url = resolve_backend(backend)
        fleet = cls(await open_async_store(url), namespace=namespace, clock=clock)
        fleet._owns_store = True
        fleet._url = url
        return fleet

    # -- leases --------------------------------------------------------------------------
    def _terms(
        self,
        name: str,
        lock_at_most: DurationLike,
        lock_at_least: DurationLike,
        keepalive: bool,
        mode: LockMode = "lease",
    ) -> LeaseTerms:
        return cached_terms(
            self.namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            mode=mode,
        )

    async def _grant(self, terms: LeaseTerms) -> tuple[LeaseRecord, int] | None:
        """One acquisition: the lease granted and when its request was sent (its local
        deadline counts from then), or ``None`` when another holder has it."""
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
        return None if record is None else (record, sent)

    async def _acquire(self, terms: LeaseTerms) -> AsyncLease | None:
        if terms.mode == "advisory":
            return await self._acquire_advisory(terms)
        granted = await self._grant(terms)
        if granted is None:
            return None
        record, sent = granted
        lease = AsyncLease(self.store, terms, record, sent_us=sent, clock=self.clock)
        if terms.keepalive:
            lease.start_keepalive()
        log_acquired(lease)
        return lease

    async def _acquire_advisory(self, terms: LeaseTerms) -> AsyncLease | None:
        advisory = await grant_advisory(self.store, terms, self.clock)
        if advisory is None:
            return None
        record, sent, session = advisory
        lease = AdvisoryLease(
            self.store, terms, record, sent_us=sent, clock=self.clock, session=session
        )
        lease.start_keepalive()  # watches the session whether or not it renews
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
        mode: LockMode = "lease",
    ) -> AsyncLease | None:
        """Take the lease ``name`` or return ``None`` when another holder has it.

        With ``wait``, retry (with jittered back-off) for up to that long first.
        Contention is never an error here; store failures raise ``StoreError``.
        ``mode="advisory"`` (PostgreSQL only, else a ``ConfigurationError``) also holds
        a session advisory lock, which frees the name the moment this process or its
        connection dies (:mod:`fleetcron.advisory_lease`).
        """
        terms = self._terms(name, lock_at_most, lock_at_least, keepalive, mode)
        return await retrying(self._acquire, terms, wait_micros(wait), self.clock, asyncio.sleep)

    async def lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = DEFAULT_LOCK_AT_MOST,
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
        mode: LockMode = "lease",
    ) -> AsyncLease:
        """Take the lease ``name`` or raise :class:`~fleetcron.errors.LockBusy`:
        ``async with await fleet.lock(...)`` releases on exit. ``mode``: as for
        :meth:`try_lock`."""
        lease = await self.try_lock(
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            wait=wait,
            mode=mode,
        )
        if lease is None:
            raise await self._busy(name)
        return lease

    async def _busy(self, name: str) -> LockBusy:
        """The error of a lock another holder has, naming it when the store says who."""
        try:
            record = await self.get(name)
        except Exception:  # only decorates the error message
            record = None
        holder = record.holder_display if record is not None and record.held else None
        return LockBusy(validate_name(name), holder=holder)

    def locked(
        self, name: str, **options: Any
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorator for ``async def`` functions: run under the lease or skip (return
        ``None``) when held."""
        terms = locked_terms(self.namespace, name, options)

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
        """Every lease row of this namespace (held or not), by name — without the
        monitor's alert markers, which lock nothing."""
        return shown_leases(await self.store.run(self.store.ops.lease_list(self.namespace)))

    async def advisory_locks(self, names: Sequence[str] | None = None) -> list[AdvisoryHold]:
        """The session advisory locks (lock mode ``advisory``) held now on ``names`` (by
        default the names of this namespace's lease rows), each with its session (server
        pid, client address, ``application_name``, since when), by name; none on a store
        other than PostgreSQL."""

        async def leases() -> list[str]:
            return [record.name for record in await self.locks()]

        return await advisory_holds(self.store, self.namespace, leases if names is None else names)

    async def get(self, name: str) -> LeaseRecord | None:
        """The lease row of ``name``, or ``None`` if it never existed."""
        return await self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))

    async def prune(self, older_than: DurationLike = "30d", *, dry_run: bool = False) -> list[str]:
        """Delete lease rows unused for ``older_than`` (0: every lease not held now); return
        their names. A fence never goes back: a row goes only once the store's clock has
        passed its fence, and a new one starts at that clock."""
        micros = older_than_us(older_than, zero=True)
        return await self.store.run(self.store.ops.lease_prune(self.namespace, micros, dry_run))

    # -- the ledger ----------------------------------------------------------------------
    async def runs(self, job: str | None = None, *, limit: int = 50) -> list[RunRecord]:
        """Ledger rows of this namespace (of ``job`` only, when given), newest slot first."""
        return await self.store.run(self.store.ops.run_list(self.namespace, job, row_limit(limit)))

    async def cancel(self, job: str, *, slot: datetime | None = None, by: str | None = None) -> int:
        """Ask the running attempts of ``job`` to stop — that of ``slot`` (an aware
        datetime) only, when given — and return how many were asked: 0 when none runs.

        The replica running each stops it within about a second, as on a lost lease (a
        command: SIGTERM to its process group, SIGKILL after the kill grace; a function:
        ``ctx.cancelled`` and :class:`~fleetcron.errors.RunCancelled`), and records it
        ``cancelled`` with the error "cancelled by BY". ``by`` names who asked (default:
        ``user@host`` of this process). A job the store does not know is a
        :class:`ConfigurationError`; so is a naive ``slot``."""
        name = validate_job_name(job)
        slot_us = requested_slot(slot)
        requester = default_requester() if by is None else by
        note = cancel_note(requester)
        ops = self.store.ops
        asked = await self.store.run(cancel_runs(ops, self.namespace, name, slot_us, note))
        if asked is None:
            raise unknown_job(name, self.namespace)
        log.info(
            "%s: asked %d running attempt(s) to stop (%s)",
            name,
            asked,
            note,
            extra={"action": "run_cancel_requested", "job": name, "asked": asked, "by": requester},
        )
        return asked

    async def replicas(self, *, include_gone: bool = False) -> list[ReplicaRecord]:
        """The scheduler replicas of this namespace that are up — their heartbeat rows have
        not expired on the store's clock — by replica id. With ``include_gone``, also those
        that stopped beating without leaving (crashed, hung, cut off from the store) within
        the last 10 minutes, each with ``gone`` set and ``silent_us`` since its last beat.
        A replica that stopped cleanly is never listed."""
        gone_within = REPLICA_RETAIN_US if include_gone else 0
        return await self.store.run(self.store.ops.replica_list(self.namespace, gone_within))

    async def status(self, jobs: Sequence[str] | None = None) -> FleetStatus:
        """Every job's health read from the store (:mod:`fleetcron.health`), worst
        first: what ``fleetcron status`` prints."""
        return await self.store.run(read_status(self.store.ops, self.namespace, jobs))

    async def prune_runs(
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
        registered it (``retention``, ``retention_keep``; else 30 days and 100, on etcd a
        day and 10);
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
            default=store_retention(self.store),
        )
        return await run_plan_async(plan, self.store)

    async def prune_jobs(
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
        return await run_plan_async(plan, self.store)

    # -- the queue -----------------------------------------------------------------------
    def queue(
        self,
        name: str,
        *,
        visibility: DurationLike = "5m",
        max_attempts: int = 5,
        retry_backoff: DurationLike = "10s",
        retry_backoff_max: DurationLike = "1h",
    ) -> AsyncQueue:
        """The work queue ``name`` of this fleet's namespace (:mod:`fleetcron.queue`):
        a claim holds an item for ``visibility`` unless extended; an item gets
        ``max_attempts`` deliveries, the next one ``retry_backoff`` after a failure
        (doubled each time, at most ``retry_backoff_max``), then it is dead."""
        return AsyncQueue(
            self.store,
            self.namespace,
            name,
            queue_settings(visibility, max_attempts, retry_backoff, retry_backoff_max),
        )

    # -- the scheduler -------------------------------------------------------------------
    def scheduler(
        self, *, mode: str = "claim", concurrency: int = 16, **options: Any
    ) -> AsyncScheduler:
        """A scheduler of this fleet's jobs over its store, not started:
        ``await scheduler.run()`` runs it until ``scheduler.stop()``. ``options``: the
        other fields of :class:`~fleetcron.scheduler.SchedulerOptions`
        (``shutdown_grace_s``, …)."""
        if not self.jobs:
            raise ConfigurationError("no jobs: register some with @fleet.job(...) first")
        return AsyncScheduler(
            self.store,
            self.jobs,
            scheduler_options(self.namespace, self._url, mode, concurrency, options),
            clock=self.clock,
            metrics=self.metrics,
        )

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


def locked_terms(namespace: str, name: str, options: dict[str, Any]) -> LeaseTerms:
    """The terms of a ``locked`` decorator: only the lease's options are accepted."""
    unknown = set(options) - {"lock_at_most", "lock_at_least", "keepalive", "mode"}
    if unknown:
        raise ConfigurationError(f"locked(): unknown option(s) {', '.join(sorted(unknown))}")
    return lease_terms(
        namespace,
        name,
        lock_at_most=options.get("lock_at_most", DEFAULT_LOCK_AT_MOST),
        lock_at_least=options.get("lock_at_least", 0),
        keepalive=options.get("keepalive", True),
        mode=options.get("mode", "lease"),
    )


def queue_settings(
    visibility: DurationLike,
    max_attempts: int,
    retry_backoff: DurationLike,
    retry_backoff_max: DurationLike,
) -> QueueSettings:
    return QueueSettings.of(
        visibility=visibility,
        max_attempts=max_attempts,
        retry_backoff=retry_backoff,
        retry_backoff_max=retry_backoff_max,
    )


def older_than_us(older_than: DurationLike, *, zero: bool = False) -> int:
    """``older_than`` (of the prune calls) in µs, or a :class:`ConfigurationError`;
    ``zero``: 0 is allowed (not for jobs: it would delete every job no replica runs now)."""
    micros = to_micros(older_than, what="older_than")
    if micros < 0 or (micros == 0 and not zero):
        wanted = "must not be negative" if zero else "must be positive"
        raise ConfigurationError(f"older_than {wanted}, got {older_than!r}")
    return micros


def row_limit(limit: int) -> int:
    """``limit`` (of ``Fleet.runs``), or a :class:`ConfigurationError`: an integer from 1
    to :data:`~fleetcron.jobspec.MAX_COUNT`, which every store takes (a larger one fails
    in a 64-bit argument, or in a Redis script's double)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(f"limit must be a positive integer, got {limit!r}")
    if limit > MAX_COUNT:
        raise ConfigurationError(f"limit must be 1 to {MAX_COUNT}, got {limit}")
    return limit
