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

A subclass changes what a renewal and a release are in the store (a claimed slot renews
its ledger row and records its outcome: :mod:`fleetcron.slot_lease`), never when they
happen or what a loss does.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from fleetcron._log import log
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

__all__ = ["AsyncLease", "Lease", "LeaseTerms", "new_holder", "safety_margin_us"]

_HOST = socket.gethostname()


def new_holder() -> str:
    """``host:pid:token`` — the token is secret and unique per acquisition."""
    return f"{_HOST}:{os.getpid()}:{secrets.token_hex(10)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTerms:
    """What was asked for: namespace, name, lengths (µs) and the keepalive choice."""

    namespace: str
    name: str
    lock_at_most_us: int
    lock_at_least_us: int
    keepalive: bool


class _LeaseBase:
    """State shared by the sync and async handles."""

    def __init__(
        self, terms: LeaseTerms, record: LeaseRecord, *, sent_us: int, clock: Clock
    ) -> None:
        self.terms = terms
        self.record = record
        self.clock = clock
        self._deadline_us = local_deadline_us(sent_us, terms.lock_at_most_us)
        self._released = False
        self._lost_reason: str | None = None

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
    def valid(self) -> bool:
        """Held, not released, not lost and before the local deadline."""
        return not self._released and not self.is_lost and self.remaining_us() > 0

    def _announce_loss(self, callbacks: Sequence[Callable[[Any], None]]) -> None:
        """Log the loss and run the handle's ``on_lost`` callbacks."""
        log.error(
            "lease on %s (fence %d) lost: %s",
            self.name,
            self.fence,
            self._lost_reason,
            extra={"action": "lease_lost", "lock": self.name, "fence": self.fence},
        )
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback failed", extra={"action": "callback_failed"})

    def _renewal_failed(self, error: BaseException, interval_s: float) -> float:
        """Log a failed renewal; return when to try again (sooner than usual)."""
        log.warning(
            "renewing %s failed: %s",
            self.name,
            describe_failure(error),
            extra={"action": "lease_renew_failed", "lock": self.name, "fence": self.fence},
        )
        return retry_interval_s(interval_s, self.remaining_us())

    def _renewed(self, record: LeaseRecord, sent_us: int) -> None:
        """A renewal sent at ``sent_us`` succeeded: the deadline moves from its send time."""
        self.record = record
        self._deadline_us = local_deadline_us(sent_us, self.terms.lock_at_most_us)

    def _lost_error(self) -> LeaseLost:
        if self._lost_reason is None:
            message = f"lease on {self.name!r} (fence {self.fence}) was already released"
            return LeaseLost(self.name, message, fence=self.fence)
        return LeaseLost(
            self.name,
            f"lease on {self.name!r} (fence {self.fence}) was lost: {self._lost_reason}",
            fence=self.fence,
        )

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else "released" if self._released else "held"
        return f"<{type(self).__name__} {self.namespace}/{self.name} fence={self.fence} {state}>"


class Lease(_LeaseBase):
    """A held lease (sync). Use as a context manager to release on exit."""

    def __init__(
        self,
        store: SyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
        interrupt_thread: bool = True,
    ) -> None:
        super().__init__(terms, record, sent_us=sent_us, clock=clock)
        self._store = store
        self.lost = threading.Event()
        """Set when the lease is lost; long-running work can poll or wait on it."""
        self._on_lost: list[Callable[[Lease], None]] = []
        self._owner_thread = threading.get_ident() if interrupt_thread else None
        self._inside = False
        self._cond = threading.Condition()
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._interrupted = False

    # -- keepalive -------------------------------------------------------------------
    def on_lost(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` (from a keepalive thread) when the lease is lost."""
        self._on_lost.append(callback)
        if self.is_lost:
            callback(self)

    def start_keepalive(self) -> None:
        """Start the renewal and deadline-watch threads (idempotent)."""
        if self._threads:
            return
        for target, label in ((self._renew_loop, "renew"), (self._watch_loop, "watch")):
            thread = threading.Thread(
                target=target, name=f"fleetcron-{label}:{self.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _renew_loop(self) -> None:
        interval = renew_interval_s(self.terms.lock_at_most_us)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop, timeout=interval)
                if self._stop or self.is_lost:
                    return
            try:
                self.extend()
                interval = renew_interval_s(self.terms.lock_at_most_us)
            except LeaseLost:
                return
            except StoreError as exc:
                # Keep trying until the deadline; the watch thread declares the loss.
                interval = self._renewal_failed(exc, interval)

    def _watch_loop(self) -> None:
        while True:
            with self._cond:
                remaining = self.remaining_us() / 1e6
                if self._stop:
                    return
                if remaining > 0:
                    self._cond.wait(timeout=remaining)
                    continue
            self._declare_lost("the local deadline passed without a successful renewal")
            return

    def _declare_lost(self, reason: str) -> None:
        with self._cond:
            if self.is_lost or self._released:
                return
            self._lost_reason = reason
            self._cond.notify_all()
        self.lost.set()
        self._announce_loss(self._on_lost)
        with self._cond:
            if self._inside and self._owner_thread is not None:
                self._interrupted = True
                _raise_in_thread(self._owner_thread, _interruption(self._lost_error()))

    # -- operations ------------------------------------------------------------------
    def extend(self) -> None:
        """Renew for another ``lock_at_most``. Raises :class:`LeaseLost` if refused."""
        if self.is_lost:
            raise self._lost_error()
        sent = self.clock.monotonic_us()
        record = self._renew_in_store()
        if record is None:
            self._declare_lost("the store refused the renewal (expired or taken over)")
            raise self._lost_error()
        with self._cond:
            if self.is_lost:
                raise self._lost_error()
            self._renewed(record, sent)
            self._cond.notify_all()

    def _renew_in_store(self) -> LeaseRecord | None:
        """One renewal request; ``None`` when refused. (A slot's lease renews its run.)"""
        terms = self.terms
        return self._store.run(
            self._store.ops.lease_extend(
                terms.namespace, terms.name, self.holder, self.fence, terms.lock_at_most_us
            )
        )

    def _release_in_store(self) -> bool:
        """One release request; whether the store still knew the lease as ours."""
        terms = self.terms
        return self._store.run(
            self._store.ops.lease_release(terms.namespace, terms.name, self.holder, self.fence)
        )

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or past its local deadline."""
        if self.is_lost:
            raise self._lost_error()
        if self.remaining_us() <= 0:
            self._declare_lost("the local deadline passed")
            raise self._lost_error()

    def release(self) -> bool:
        """Give the lease back (it stays held until ``lock_at_least``). Idempotent.

        Returns whether the store still knew the lease as ours.
        """
        with self._cond:
            if self._released:
                return False
            self._released = True
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        released = self._release_in_store()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "released %s (fence %d)",
                self.name,
                self.fence,
                extra={"action": "lock_released", "lock": self.name, "fence": self.fence},
            )
        return released

    def __enter__(self) -> Self:
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
        with self._cond:
            self._inside = False
            if self._interrupted and self._owner_thread is not None:
                _clear_pending(self._owner_thread)  # not delivered yet: we raise below instead
        lost = self.is_lost
        try:
            self.release()
        except FleetcronError as error:
            log.warning(
                "releasing %s failed: %s (it expires at the end of its lease)",
                self.name,
                error,
                extra={"action": "lock_release_failed", "lock": self.name},
            )
        if lost and (exc is None or isinstance(exc, LeaseLost)):
            raise self._lost_error() from exc


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


class AsyncLease(_LeaseBase):
    """A held lease (asyncio). Use with ``async with`` to release on exit."""

    def __init__(
        self,
        store: AsyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
    ) -> None:
        super().__init__(terms, record, sent_us=sent_us, clock=clock)
        self._store = store
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._owner: asyncio.Task[object] | None = None
        self._on_lost: list[Callable[[AsyncLease], None]] = []
        self._cancelled_owner = False

    def on_lost(self, callback: Callable[[AsyncLease], None]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is)."""
        self._on_lost.append(callback)
        if self.is_lost:
            callback(self)

    def start_keepalive(self) -> None:
        """Start the renewal task on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._keepalive(), name=f"fleetcron-keepalive:{self.name}"
            )
            self._task.add_done_callback(self._keepalive_ended)

    def _keepalive_ended(self, task: asyncio.Task[None]) -> None:
        """A keepalive that died of an unexpected error renews nothing: the lease is lost."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self._declare_lost(f"the keepalive failed: {describe_failure(error)}")

    async def _keepalive(self) -> None:
        interval = renew_interval_s(self.terms.lock_at_most_us)
        while not self._released:
            await asyncio.sleep(min(interval, max(self.remaining_us() / 1e6, 0)))
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
                interval = self._renewal_failed(exc, interval)

    def _declare_lost(self, reason: str) -> None:
        if self.is_lost or self._released:
            return
        self._lost_reason = reason
        self.lost.set()
        self._announce_loss(self._on_lost)
        if self._owner is not None and not self._owner.done():
            self._cancelled_owner = True
            self._owner.cancel(f"lease on {self.name!r} lost")

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
        self._renewed(record, sent)

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

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or past its local deadline."""
        if self.is_lost:
            raise self._lost_error()
        if self.remaining_us() <= 0:
            self._declare_lost("the local deadline passed")
            raise self._lost_error()

    async def release(self) -> bool:
        """Give the lease back (held until ``lock_at_least``). Idempotent."""
        if self._released:
            return False
        self._released = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        return await self._release_in_store()

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
            log.warning(
                "releasing %s failed: %s (it expires at the end of its lease)",
                self.name,
                error,
                extra={"action": "lock_release_failed", "lock": self.name},
            )
        if lost:
            task = asyncio.current_task()
            if self._cancelled_owner and task is not None:
                task.uncancel()
            if exc is None or isinstance(exc, LeaseLost | asyncio.CancelledError):
                raise self._lost_error() from exc
