"""Lease handles: the holder's side of a lock, with keepalive and the local deadline.

The store decides expiry by its own clock. The holder keeps a *local deadline* on its
monotonic clock: the time the acquire (or last successful extend) request was **sent**,
plus the lease length, minus a safety margin. The store's expiry can only be later than
that, so a holder that stops at its deadline stops before anybody else can take the lease.

Keepalive renews every ``lock_at_most / 3`` (the rules are :mod:`fleetcron.keepalive`).
When a renewal is refused, or the deadline passes without a successful renewal (store
unreachable, process starved), the lease is *lost*: ``lease.lost`` is set, the
``on_lost`` callbacks run, the protected work is cancelled, and leaving the ``with`` block
raises :class:`~fleetcron.errors.LeaseLost`.

There is one implementation, :class:`AsyncLease`. The sync :class:`Lease` is its face: a
renewal or release asked for by the holder runs in the holder's thread there and then (the
coroutine completes without suspending over a
:class:`~fleetcron.bridge.ThreadedAsyncStore` driven by ``run_inline``), and the
keepalive runs on a
:class:`~fleetcron.bridge.Portal`, each renewal in a worker thread so that one that hangs
never holds up the deadline. A subclass of :class:`AsyncLease` changes what a renewal and a
release are in the store (a claimed slot renews its ledger row and records its outcome:
:mod:`fleetcron.slot_lease`), never when they happen or what a loss does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

from fleetcron._log import log
from fleetcron.bridge import Portal, ThreadedAsyncStore, run_inline
from fleetcron.clock import Clock
from fleetcron.errors import FleetcronError, LeaseLost, StoreError
from fleetcron.keepalive import (
    describe_failure,
    local_deadline_us,
    renew_interval_s,
    retry_interval_s,
    safety_margin_us,
)
from fleetcron.models import LeaseRecord
from fleetcron.stores.base import AsyncStore, SyncStore

__all__ = [
    "AsyncLease",
    "Lease",
    "LeaseTerms",
    "LockMode",
    "PortalSource",
    "new_holder",
    "safety_margin_us",
]

T = TypeVar("T")

_HOST = socket.gethostname()


def new_holder() -> str:
    """``host:pid:token`` — the token is secret and unique per acquisition."""
    return f"{_HOST}:{os.getpid()}:{secrets.token_hex(10)}"


LockMode = Literal["lease", "advisory"]
"""How a lock is held: ``lease`` (a lease row in the store, every backend) or ``advisory``
(PostgreSQL: a session advisory lock on a connection of its own as well, released by the
server the moment the holder's session ends: :mod:`fleetcron.advisory_lease`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTerms:
    """What was asked for: namespace, name, lengths (µs), the keepalive choice and the
    lock mode."""

    namespace: str
    name: str
    lock_at_most_us: int
    lock_at_least_us: int
    keepalive: bool
    mode: LockMode = "lease"


class AsyncLease:
    """A held lease (asyncio): the one implementation of a lease's life. Use with
    ``async with`` to release on exit; the task inside is cancelled when it is lost."""

    def __init__(
        self,
        store: AsyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
    ) -> None:
        self.terms = terms
        self.record = record
        self.clock = clock
        self._store = store
        self._deadline_us = local_deadline_us(sent_us, terms.lock_at_most_us)
        self._released = False
        self._lost_reason: str | None = None
        self.lost = asyncio.Event()
        """Set when the lease is lost."""
        self._task: asyncio.Task[None] | None = None
        # Until the first renewal is due the keepalive is a timer, not a task: most runs
        # end before it, and a task costs several turns of the loop to start and cancel.
        self._timer: asyncio.TimerHandle | None = None
        self._keepalive_started = False
        self._owner: asyncio.Task[object] | None = None
        self._on_lost: list[Callable[[Any], None]] = []
        self._cancelled_owner = False

    # -- what the lease is -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.terms.name

    @property
    def namespace(self) -> str:
        return self.terms.namespace

    @property
    def fence(self) -> int:
        """The fencing token: strictly greater than every token issued before for this name."""
        return self.record.fence

    @property
    def holder(self) -> str:
        return self.record.holder

    @property
    def deadline_us(self) -> int:
        """Local monotonic deadline (µs) after which the lease is not trusted."""
        return self._deadline_us

    def remaining_us(self) -> int:
        """Microseconds until the local deadline (negative when past)."""
        return self._deadline_us - self.clock.monotonic_us()

    @property
    def is_lost(self) -> bool:
        return self._lost_reason is not None

    @property
    def is_released(self) -> bool:
        return self._released

    @property
    def valid(self) -> bool:
        """Held, not released, not lost and before the local deadline."""
        return not self._released and not self.is_lost and self.remaining_us() > 0

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else "released" if self._released else "held"
        return f"<{type(self).__name__} {self.namespace}/{self.name} fence={self.fence} {state}>"

    # -- loss ------------------------------------------------------------------------------
    def on_lost(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is)."""
        self._on_lost.append(callback)
        if self.is_lost:
            callback(self)

    def _declare_lost(self, reason: str) -> None:
        if self.is_lost or self._released:
            return
        self._lost_reason = reason
        self.lost.set()
        log.error(
            "lease on %s (fence %d) lost: %s",
            self.name,
            self.fence,
            reason,
            extra={"action": "lease_lost", "lock": self.name, "fence": self.fence},
        )
        for callback in self._on_lost:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback failed", extra={"action": "callback_failed"})
        if self._owner is not None and not self._owner.done():
            self._cancelled_owner = True
            self._owner.cancel(f"lease on {self.name!r} lost")

    def _lost_error(self) -> LeaseLost:
        if self._lost_reason is None:
            message = f"lease on {self.name!r} (fence {self.fence}) was already released"
            return LeaseLost(self.name, message, fence=self.fence)
        return LeaseLost(
            self.name,
            f"lease on {self.name!r} (fence {self.fence}) was lost: {self._lost_reason}",
            fence=self.fence,
        )

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or past its local deadline."""
        if self.is_lost:
            raise self._lost_error()
        if self.remaining_us() <= 0:
            self._declare_lost("the local deadline passed")
            raise self._lost_error()

    # -- keepalive -------------------------------------------------------------------------
    def start_keepalive(self) -> None:
        """Start renewing on the running loop (idempotent): the renewal task starts when
        the first renewal is due."""
        if self._keepalive_started:
            return
        self._keepalive_started = True
        first_s = self._next_wait_s(renew_interval_s(self.terms.lock_at_most_us))
        self._timer = asyncio.get_running_loop().call_later(first_s, self._begin_keepalive)

    def _begin_keepalive(self) -> None:
        self._timer = None
        if self._released or self.is_lost:
            return
        self._task = asyncio.get_running_loop().create_task(
            self._keepalive(renew_at_once=True), name=f"fleetcron-keepalive:{self.name}"
        )
        self._task.add_done_callback(self._keepalive_ended)

    def cancel_keepalive(self) -> None:
        """Stop renewing, without waiting for the renewal task to end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    async def stop_keepalive(self) -> None:
        """Stop the renewal task and wait until it has stopped."""
        task = self._task
        self.cancel_keepalive()
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _keepalive_ended(self, task: asyncio.Task[None]) -> None:
        """A keepalive that died of an unexpected error renews nothing: the lease is lost."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self._declare_lost(f"the keepalive failed: {describe_failure(error)}")

    def _next_wait_s(self, interval_s: float) -> float:
        return min(interval_s, max(self.remaining_us() / 1e6, 0))

    async def _keepalive(self, *, renew_at_once: bool = False) -> None:
        interval = renew_interval_s(self.terms.lock_at_most_us)
        while not self._released:
            if not renew_at_once:
                await asyncio.sleep(self._next_wait_s(interval))
            renew_at_once = False
            if self._released:
                return
            if self.remaining_us() <= 0:
                self._declare_lost("the local deadline passed without a successful renewal")
                return
            try:
                async with asyncio.timeout(self.remaining_us() / 1e6):
                    await self.extend()
                interval = renew_interval_s(self.terms.lock_at_most_us)
            except LeaseLost:
                return
            except (StoreError, TimeoutError) as exc:
                log.warning(
                    "renewing %s failed: %s",
                    self.name,
                    describe_failure(exc),
                    extra={"action": "lease_renew_failed", "lock": self.name, "fence": self.fence},
                )
                interval = retry_interval_s(interval, self.remaining_us())

    # -- the store -------------------------------------------------------------------------
    async def extend(self) -> None:
        """Renew for another ``lock_at_most``. Raises :class:`LeaseLost` if refused."""
        if self.is_lost:
            raise self._lost_error()
        sent = self.clock.monotonic_us()
        record = await self._renew_in_store()
        if record is None:
            self._declare_lost("the store refused the renewal (expired or taken over)")
            raise self._lost_error()
        if self.is_lost:
            raise self._lost_error()
        # The deadline moves from the renewal's send time, never from its answer's.
        self.record = record
        self._deadline_us = local_deadline_us(sent, self.terms.lock_at_most_us)

    async def _renew_in_store(self) -> LeaseRecord | None:
        """One renewal request; ``None`` when refused."""
        terms = self.terms
        return await self._store.run(
            self._store.ops.lease_extend(
                terms.namespace, terms.name, self.holder, self.fence, terms.lock_at_most_us
            )
        )

    async def _release_in_store(self) -> bool:
        """One release request; whether the store still knew the lease as ours."""
        terms = self.terms
        return await self._store.run(
            self._store.ops.lease_release(terms.namespace, terms.name, self.holder, self.fence)
        )

    def _stop_holding(self) -> None:
        """The holder is done: no renewal from now on (the store is told separately)."""
        self._released = True
        self.cancel_keepalive()

    async def release(self) -> bool:
        """Give the lease back (held until ``lock_at_least``). Idempotent; returns whether
        the store still knew the lease as ours."""
        if self._released:
            return False
        self._stop_holding()
        released = await self._release_in_store()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "released %s (fence %d)",
                self.name,
                self.fence,
                extra={"action": "lock_released", "lock": self.name, "fence": self.fence},
            )
        return released

    async def __aenter__(self) -> Self:
        self._owner = asyncio.current_task()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._owner = None
        lost = self.is_lost
        try:
            await self.release()
        except FleetcronError as error:
            _release_failed(self.name, error)
        if lost:
            task = asyncio.current_task()
            if self._cancelled_owner and task is not None:
                task.uncancel()
            if exc is None or isinstance(exc, LeaseLost | asyncio.CancelledError):
                raise self._lost_error() from exc


def _release_failed(name: str, error: FleetcronError) -> None:
    log.warning(
        "releasing %s failed: %s (it expires at the end of its lease)",
        name,
        error,
        extra={"action": "lock_release_failed", "lock": name},
    )


# -- the sync face --------------------------------------------------------------------------
PortalSource = Callable[[], Portal]
"""Where a sync lease runs its keepalive: a fleet's shared portal."""


class Lease:
    """A held lease (sync): the face of an :class:`AsyncLease` core. Use as a context
    manager to release on exit; the holder's thread is interrupted (``LeaseLost`` at its
    next bytecode) when the lease is lost inside the ``with`` block."""

    def __init__(
        self,
        store: SyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
        interrupt_thread: bool = True,
        portal: PortalSource | None = None,
    ) -> None:
        self._core = self._make_core(
            ThreadedAsyncStore(store), terms, record, sent_us=sent_us, clock=clock
        )
        self._portal_source = portal
        self._portal: Portal | None = None
        self._owns_portal = False
        self._keepalive_on_portal = False
        self.lost = threading.Event()
        """Set when the lease is lost; long-running work can poll or wait on it."""
        self._on_lost: list[Callable[[Lease], None]] = []
        self._owner_thread = threading.get_ident() if interrupt_thread else None
        self._guard = threading.Lock()
        self._inside = False
        self._interrupted = False
        self._core.on_lost(self._core_lost)

    def _make_core(
        self, store: ThreadedAsyncStore, terms: LeaseTerms, record: LeaseRecord, **kw: Any
    ) -> AsyncLease:
        """The lease's core (a subclass of a face makes the matching core)."""
        return AsyncLease(store, terms, record, **kw)

    # -- what the lease is (the core's) -------------------------------------------------
    @property
    def terms(self) -> LeaseTerms:
        return self._core.terms

    @property
    def record(self) -> LeaseRecord:
        return self._core.record

    @property
    def clock(self) -> Clock:
        return self._core.clock

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def namespace(self) -> str:
        return self._core.namespace

    @property
    def fence(self) -> int:
        """The fencing token: strictly greater than every token issued before for this name."""
        return self._core.fence

    @property
    def holder(self) -> str:
        return self._core.holder

    @property
    def deadline_us(self) -> int:
        """Local monotonic deadline (µs) after which the lease is not trusted."""
        return self._core.deadline_us

    def remaining_us(self) -> int:
        """Microseconds until the local deadline (negative when past)."""
        return self._core.remaining_us()

    @property
    def is_lost(self) -> bool:
        return self._core.is_lost

    @property
    def valid(self) -> bool:
        """Held, not released, not lost and before the local deadline."""
        return self._core.valid

    def __repr__(self) -> str:
        return repr(self._core).replace("AsyncLease", "Lease", 1)

    # -- loss ------------------------------------------------------------------------------
    def on_lost(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` when the lease is lost (from the keepalive's thread, or
        at once if it already is)."""
        self._on_lost.append(callback)
        if self.is_lost:
            callback(self)

    def _core_lost(self, _core: AsyncLease) -> None:
        self.lost.set()
        for callback in self._on_lost:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback failed", extra={"action": "callback_failed"})
        with self._guard:
            owner = self._owner_thread
            if self._inside and owner is not None and owner != threading.get_ident():
                self._interrupted = True
                _raise_in_thread(owner, _interruption(self._core._lost_error()))

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or past its local deadline."""
        self._core.check()

    # -- keepalive and the store ------------------------------------------------------------
    def start_keepalive(self) -> None:
        """Start renewing on the portal (idempotent)."""
        if self._keepalive_on_portal:
            return
        self._keepalive_on_portal = True
        self._ensure_portal()
        assert self._portal is not None
        self._portal.call_soon(self._core.start_keepalive)

    def _ensure_portal(self) -> None:
        """The loop the core's tasks (renewals, watches) run on, started once."""
        if self._portal is not None:
            return
        if self._portal_source is not None:
            self._portal = self._portal_source()
        else:
            self._portal, self._owns_portal = Portal(f"fleetcron-keepalive:{self.name}"), True

    def extend(self) -> None:
        """Renew for another ``lock_at_most``. Raises :class:`LeaseLost` if refused."""
        run_inline(self._core.extend())

    def release(self) -> bool:
        """Give the lease back (it stays held until ``lock_at_least``). Idempotent.

        Returns whether the store still knew the lease as ours.
        """
        portal = self._portal
        if portal is not None:
            # No renewal may run after the release: stop the keepalive and wait for it.
            with contextlib.suppress(RuntimeError):  # the portal was closed with its fleet
                portal.call(self._core.stop_keepalive)
            if self._owns_portal:
                portal.close()
        return run_inline(self._core.release())

    def __enter__(self) -> Self:
        with self._guard:
            self._inside = True
            if self._owner_thread is not None:
                self._owner_thread = threading.get_ident()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._guard:
            self._inside = False
            if self._interrupted and self._owner_thread is not None:
                _clear_pending(self._owner_thread)  # not delivered yet: we raise below instead
        lost = self.is_lost
        try:
            self.release()
        except FleetcronError as error:
            _release_failed(self.name, error)
        if lost and (exc is None or isinstance(exc, LeaseLost)):
            raise self._core._lost_error() from exc


def _interruption(error: LeaseLost) -> type[LeaseLost]:
    # An exception raised in another thread is given as a class and instantiated there
    # with no arguments, which LeaseLost (name required) does not allow: bind them here.
    class LeaseInterrupted(LeaseLost):
        def __init__(self) -> None:
            super().__init__(error.name, error.message, fence=error.fence)

    return LeaseInterrupted


def _raise_in_thread(thread_id: int, exc_type: type[BaseException]) -> None:
    # Interrupts pure-Python work in the holder's thread at its next bytecode; a blocking
    # C call (socket read, sleep) finishes first. The lost event is the cooperative path.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type)
    )


def _clear_pending(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
