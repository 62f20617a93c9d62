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
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from fleetcron._log import log
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import DurationLike, to_micros
from fleetcron.errors import ConfigurationError, LockBusy
from fleetcron.jobsfile import JobSpec, job_spec
from fleetcron.lease import AsyncLease, Lease, LeaseTerms, new_holder
from fleetcron.models import LeaseRecord
from fleetcron.names import validate_name, validate_namespace
from fleetcron.scheduler import Scheduler, SchedulerOptions
from fleetcron.stores import (
    AsyncStore,
    StoreURL,
    SyncStore,
    open_async_store,
    open_store,
    resolve_backend,
)
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.stores.threaded import ThreadedAsyncStore

__all__ = ["DEFAULT_LOCK_AT_MOST", "NAMESPACE_ENV", "AsyncFleet", "Fleet", "lease_terms"]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

NAMESPACE_ENV = "FLEETCRON_NAMESPACE"
DEFAULT_LOCK_AT_MOST = "10m"
_MIN_LOCK_AT_MOST_US = 100_000


def resolve_namespace(explicit: str | None) -> str:
    """Namespace: explicit > ``$FLEETCRON_NAMESPACE`` > ``default``."""
    if explicit is not None:
        return validate_namespace(explicit)  # an explicit empty namespace is an error
    return validate_namespace(os.environ.get(NAMESPACE_ENV) or "default")


def lease_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
) -> LeaseTerms:
    """Validate a lock request; every problem is a :class:`ConfigurationError`."""
    most = to_micros(lock_at_most, what="lock_at_most")
    least = to_micros(lock_at_least, what="lock_at_least")
    if most <= 0:
        raise ConfigurationError(f"lock_at_most must be positive, got {lock_at_most!r}")
    if most < _MIN_LOCK_AT_MOST_US:
        raise ConfigurationError(f"lock_at_most must be at least 100ms, got {lock_at_most!r}")
    if least < 0:
        raise ConfigurationError(f"lock_at_least must not be negative, got {lock_at_least!r}")
    if least > most:
        raise ConfigurationError(
            f"lock_at_least ({lock_at_least}) is longer than lock_at_most ({lock_at_most})"
        )
    return LeaseTerms(
        namespace=namespace,
        name=validate_name(name),
        lock_at_most_us=most,
        lock_at_least_us=least,
        keepalive=keepalive,
    )


_lease_terms_cached = functools.lru_cache(maxsize=1024)(lease_terms)


def _cached_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
) -> LeaseTerms:
    """:func:`lease_terms`, memoised: a hot loop of ``try_lock`` parses nothing twice."""
    try:
        return _lease_terms_cached(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )
    except TypeError:  # an unhashable argument: let validation say what is wrong
        return lease_terms(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )


def _wait_micros(wait: DurationLike | None) -> int:
    if wait is None:
        return 0
    micros = to_micros(wait, what="wait")
    if micros < 0:
        raise ConfigurationError(f"wait must not be negative, got {wait!r}")
    return micros


def _backoff(attempt: int) -> float:
    # 50 ms doubling to 1 s, jittered so waiters do not retry in lock step.
    return min(1.0, 0.05 * 2.0**attempt) * random.uniform(0.5, 1.0)


def _log_skipped(terms: LeaseTerms) -> None:
    log.info(
        "lock %s is held elsewhere; skipped",
        terms.name,
        extra={"action": "lock_skipped", "lock": terms.name, "namespace": terms.namespace},
    )


def _log_acquired(lease: Lease | AsyncLease) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "acquired %s (fence %d)",
        lease.name,
        lease.fence,
        extra={"action": "lock_acquired", "lock": lease.name, "fence": lease.fence},
    )


class Fleet:
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
        self._jobs: list[JobSpec] = []
        self._thread: threading.Thread | None = None
        self._scheduler: Scheduler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduler_ready = threading.Event()
        self._scheduler_error: BaseException | None = None

    # -- the scheduler -------------------------------------------------------------------
    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """The jobs registered with :meth:`job` or :meth:`add_job`."""
        return tuple(self._jobs)

    def add_job(self, spec: JobSpec) -> None:
        """Register a job definition (e.g. from a jobs file); names must be unique."""
        if any(existing.name == spec.name for existing in self._jobs):
            raise ConfigurationError(f"Fleet.job: job {spec.name!r} is defined twice")
        self._jobs.append(spec)

    def job(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Decorator: schedule the function as a job (keys as in the jobs file).

        ``@fleet.job(schedule="*/5 * * * *", timezone="Europe/Berlin", lock_at_most="20m")``;
        the function takes a :class:`~fleetcron.RunContext`; ``async def`` works too.
        """

        if callable(name):
            raise ConfigurationError(
                "Fleet.job needs its options: write @fleet.job(every=...) or "
                "@fleet.job(schedule=...), not a bare @fleet.job"
            )
        reserved = sorted({"call", "command", "where"} & options.keys())
        if reserved:
            raise ConfigurationError(
                f"Fleet.job: {', '.join(reserved)} cannot be given: the decorated function "
                "is the job's call"
            )

        def decorate(func: F) -> F:
            reference = getattr(func, "__name__", None)
            if name is None and not isinstance(reference, str):
                raise ConfigurationError(
                    f"Fleet.job: {func!r} has no __name__; give the job a name"
                )
            job_name = name or str(reference).replace("_", "-")
            self.add_job(job_spec(job_name, where="Fleet.job", call=func, **options))
            return func

        return decorate

    def _async_store(self) -> Awaitable[AsyncStore]:
        async def opened() -> AsyncStore:
            if self._url is not None:
                return await open_async_store(self._url)
            if isinstance(self.store, MemoryStore):
                return AsyncMemoryStore(self.store)
            return ThreadedAsyncStore(self.store)

        return opened()

    async def _serve(self, options: SchedulerOptions, stop_on_signals: bool) -> None:
        store = await self._async_store()
        try:
            scheduler = Scheduler(store, self._jobs, options, clock=self.clock)
            self._scheduler = scheduler
            self._loop = asyncio.get_running_loop()
            if stop_on_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.add_signal_handler(sig, scheduler.stop)
            self._scheduler_ready.set()
            await scheduler.run()
        finally:
            self._scheduler = None
            if self._url is not None:
                await store.close()

    def _options(self, mode: str, concurrency: int) -> SchedulerOptions:
        if not self._jobs:
            raise ConfigurationError("no jobs: register some with @fleet.job(...) first")
        return SchedulerOptions(
            namespace=self.namespace,
            mode=mode,
            concurrency=concurrency,
            backend_url=self._url.raw if self._url is not None else None,
        )

    def run(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs in this thread until SIGTERM/SIGINT (the blocking daemon)."""
        asyncio.run(self._serve(self._options(mode, concurrency), stop_on_signals=True))

    def start(self, *, mode: str = "claim", concurrency: int = 16) -> None:
        """Run the jobs in a background thread; :meth:`stop` ends it."""
        options = self._options(mode, concurrency)
        if self._thread is not None:
            raise ConfigurationError("the scheduler is already running")
        self._scheduler_ready.clear()

        def target() -> None:
            try:
                asyncio.run(self._serve(options, stop_on_signals=False))
            except BaseException as exc:  # surfaced by stop()
                self._scheduler_error = exc
                self._scheduler_ready.set()

        self._thread = threading.Thread(target=target, name="fleetcron-scheduler", daemon=True)
        self._thread.start()
        self._scheduler_ready.wait(timeout=30)
        if self._scheduler_error is not None:
            error, self._scheduler_error, self._thread = self._scheduler_error, None, None
            raise error

    def stop(self, timeout: float | None = 60) -> None:
        """Stop the background scheduler: no new claims; running jobs finish (grace)."""
        thread, scheduler, loop = self._thread, self._scheduler, self._loop
        if thread is None:
            return
        if scheduler is not None and loop is not None:
            loop.call_soon_threadsafe(scheduler.stop)
        thread.join(timeout)
        self._thread = None
        if self._scheduler_error is not None:
            error, self._scheduler_error = self._scheduler_error, None
            raise error

    def _terms(
        self, name: str, lock_at_most: DurationLike, lock_at_least: DurationLike, keepalive: bool
    ) -> LeaseTerms:
        return _cached_terms(
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
        lease = Lease(self.store, terms, record, sent_us=sent, clock=self.clock)
        if terms.keepalive:
            lease.start_keepalive()
        _log_acquired(lease)
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
        wait_us = _wait_micros(wait)
        give_up = self.clock.monotonic_us() + wait_us
        attempt = 0
        while True:
            lease = self._acquire(terms)
            if lease is not None:
                return lease
            left = give_up - self.clock.monotonic_us()
            if left <= 0:
                _log_skipped(terms)
                return None
            time.sleep(min(_backoff(attempt), left / 1e6))
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
                        _log_skipped(terms)
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
                    _log_skipped(terms)
                    return None
                with lease:
                    return func(*args, **kwargs)

            return cast(F, run)

        return decorate

    def locks(self) -> list[LeaseRecord]:
        """Every lease row of this namespace (held or not), by name."""
        return self.store.run(self.store.ops.lease_list(self.namespace))

    def get(self, name: str) -> LeaseRecord | None:
        """The lease row of ``name``, or ``None`` if it never existed."""
        return self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))

    def prune(self, older_than: DurationLike = "30d", *, dry_run: bool = False) -> list[str]:
        """Delete lease rows unused for ``older_than``; return their names."""
        micros = to_micros(older_than, what="older_than")
        if micros <= 0:
            raise ConfigurationError(f"older_than must be positive, got {older_than!r}")
        return self.store.run(self.store.ops.lease_prune(self.namespace, micros, dry_run))

    def close(self) -> None:
        """Stop the scheduler if it runs; close the store if this fleet opened it."""
        self.stop()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFleet:
    """The asyncio twin of :class:`Fleet`. Create with ``await AsyncFleet.connect(url)``."""

    def __init__(
        self, store: AsyncStore, *, namespace: str | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.namespace = resolve_namespace(namespace)
        self.clock = clock
        self._owns_store = False

    @classmethod
    async def connect(
        cls,
        backend: str | None = None,
        *,
        namespace: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> AsyncFleet:
        """Open the store behind ``backend`` (same resolution as :class:`Fleet`)."""
        namespace = resolve_namespace(namespace)
        fleet = cls(
            await open_async_store(resolve_backend(backend)), namespace=namespace, clock=clock
        )
        fleet._owns_store = True
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
        _log_acquired(lease)
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
        terms = _cached_terms(
            self.namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )
        give_up = self.clock.monotonic_us() + _wait_micros(wait)
        attempt = 0
        while True:
            lease = await self._acquire(terms)
            if lease is not None:
                return lease
            left = give_up - self.clock.monotonic_us()
            if left <= 0:
                _log_skipped(terms)
                return None
            await asyncio.sleep(min(_backoff(attempt), left / 1e6))
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
                    _log_skipped(terms)
                    return None
                async with lease:
                    return await func(*args, **kwargs)

            return run

        return decorate

    async def locks(self) -> list[LeaseRecord]:
        """Every lease row of this namespace."""
        return await self.store.run(self.store.ops.lease_list(self.namespace))

    async def get(self, name: str) -> LeaseRecord | None:
        """The lease row of ``name``."""
        return await self.store.run(self.store.ops.lease_get(self.namespace, validate_name(name)))

    async def close(self) -> None:
        """Close the store if this fleet opened it."""
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
