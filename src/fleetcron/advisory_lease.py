"""Lock mode ``advisory`` (PostgreSQL): a lease whose holder also holds a session advisory
lock on a connection of its own, so that the lock is free again the moment the holder's
process or connection dies — not ``lock_at_most`` later.

Acquire (:func:`grant_advisory`): open the holder's session and try the advisory lock of
the name (:class:`~fleetcron.stores.sql.advisory.AdvisorySessionLike`); when another session
has it, the lock is held (unless that session's holder is frozen past its lease's expiry:
then its session is ended). With it, write the lease row on that session (fence
strictly greater than every one before, expiry ``lock_at_most``), taking over at once a
row another advisory holder left live: its session has ended, or this one would not have
the advisory lock. A plain holder's row (lock mode ``lease``) is respected until it
expires, so the two modes never give one name two holders; mixing them only loses the
fast takeover. The rules and their limits: docs/design/leases.md, "Lock mode advisory".

Hold (:class:`AdvisoryLease`): the row is renewed as any lease's, through the store; the
session stays open and idle, watched on the event loop (its socket becomes readable when
the server terminates it or the connection breaks). A session that ends is a lost lease
(``on_lost``, cancellation, exec's kill): the server has released the advisory lock, and
another holder may have it now. A stale holder is refused by its fence, as always: the
row's fence has moved, so its renewals are refused and :func:`fleetcron.fencing.check`
refuses its writes.

Release: the row as any lease's (``lock_at_least`` is kept: a contender does not take a
row over before its ``min_until``), then the advisory lock, and the session is closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fleetcron.bridge import ThreadedAsyncStore, run_blocking
from fleetcron.clock import Clock
from fleetcron.errors import ConfigurationError
from fleetcron.lease import AsyncLease, Lease, LeaseTerms, PortalSource, new_holder
from fleetcron.models import AdvisoryHold, LeaseRecord
from fleetcron.stores.advisory_api import AdvisorySessionLike, advisory_locks_of
from fleetcron.stores.base import AsyncStore, SyncStore

__all__ = [
    "AdvisoryLease",
    "SyncAdvisoryLease",
    "advisory_holds",
    "advisory_refusal",
    "grant_advisory",
]


def advisory_refusal(store: str) -> ConfigurationError:
    """The error of lock mode ``advisory`` asked of a store that is not PostgreSQL
    (``store``: its redacted URL)."""
    return ConfigurationError(
        f"lock mode 'advisory' needs a PostgreSQL store (it holds a session advisory "
        f"lock), and this one is {store}: use lock mode 'lease' there"
    )


async def advisory_holds(
    store: AsyncStore,
    namespace: str,
    names: Sequence[str] | Callable[[], Awaitable[Sequence[str]]],
) -> list[AdvisoryHold]:
    """The session advisory locks held now on the keys of ``names`` (or of the names
    ``names()`` reads), by name, then session; none on a store without advisory locks,
    where nothing is read."""
    locks = advisory_locks_of(store)
    if locks is None:
        return []
    listed = await names() if callable(names) else names
    return await store.run(locks.held(namespace, listed))


async def grant_advisory(
    store: AsyncStore, terms: LeaseTerms, clock: Clock
) -> tuple[LeaseRecord, int, AdvisorySessionLike] | None:
    """One advisory acquisition: the lease granted, when its row's request was sent (its
    local deadline counts from then) and the session holding the advisory lock; ``None``
    when another holder has the name. Over a sync store under
    :func:`~fleetcron.bridge.run_inline` it never suspends."""
    locks = advisory_locks_of(store)
    if locks is None:
        raise advisory_refusal(store.url)
    session = await run_blocking(locks.open, terms.namespace, terms.name)
    if session is None:
        return None
    try:
        sent = clock.monotonic_us()
        record = await run_blocking(
            session.acquire,
            terms.namespace,
            terms.name,
            locks.mark(new_holder()),
            terms.lock_at_most_us,
            terms.lock_at_least_us,
        )
    except BaseException:
        await run_blocking(session.close)
        raise
    if record is None:  # a plain holder's lease, or lock_at_least, still holds the row
        await run_blocking(session.close)
        return None
    return record, sent, session


_UNWATCH_WAIT_S = 10.0


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class AdvisoryLease(AsyncLease):
    """A held lease in lock mode ``advisory`` (asyncio): an :class:`AsyncLease` whose
    ``session`` holds the advisory lock and is watched while the lease is held."""

    def __init__(
        self,
        store: AsyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
        session: AdvisorySessionLike,
    ) -> None:
        super().__init__(store, terms, record, sent_us=sent_us, clock=clock)
        self.session = session
        """The connection that holds the advisory lock."""
        self._watching: asyncio.AbstractEventLoop | None = None

    def start_keepalive(self) -> None:
        """Watch the session (always: a session that ends loses the lease, keepalive or
        not) and renew the row when the terms ask for it. Idempotent; on the loop the
        lease lives on."""
        if self._watching is None and not (self.is_released or self.is_lost):
            loop = asyncio.get_running_loop()
            loop.add_reader(self.session.fd, self._readable)
            self._watching = loop
            self._readable()  # it may have ended already
        if self.terms.keepalive:
            super().start_keepalive()

    def _readable(self) -> None:
        reason = self.session.ended()
        if reason is None:
            return
        self._unwatch()
        self._declare_lost(
            f"the session holding its advisory lock ended ({reason}); the server released "
            "the lock, and another holder may have it now"
        )

    def _unwatch(self) -> None:
        loop, self._watching = self._watching, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.session.fd)

    def _stop_watching(self) -> None:
        """Stop watching from any thread, waiting until it has stopped: the session's
        socket is closed next, and must not be in the loop's selector then."""
        loop = self._watching
        if loop is None:
            return
        if _on(loop) or loop.is_closed() or not loop.is_running():
            self._unwatch()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def unwatch() -> None:
            self._unwatch()
            done.set_result(None)

        loop.call_soon_threadsafe(unwatch)
        # A loop stopped meanwhile (its portal closed) never runs it; its selector is gone.
        with contextlib.suppress(concurrent.futures.TimeoutError):
            done.result(timeout=_UNWATCH_WAIT_S)

    def cancel_keepalive(self) -> None:
        super().cancel_keepalive()
        loop = self._watching
        if loop is not None and _on(loop):
            self._unwatch()

    async def stop_keepalive(self) -> None:
        self._stop_watching()
        await super().stop_keepalive()

    async def release(self) -> bool:
        """Give the lease back (the row kept until ``lock_at_least``), then the advisory
        lock, and close the session. Idempotent."""
        if self.is_released:
            return False
        try:
            return await super().release()
        finally:
            self._stop_watching()
            await run_blocking(self.session.close)


class SyncAdvisoryLease(Lease):
    """A held lease in lock mode ``advisory`` (sync): the face of an
    :class:`AdvisoryLease`, watched on the keepalive portal."""

    def __init__(
        self,
        store: SyncStore,
        terms: LeaseTerms,
        record: LeaseRecord,
        *,
        sent_us: int,
        clock: Clock,
        session: AdvisorySessionLike,
        interrupt_thread: bool = True,
        portal: PortalSource | None = None,
    ) -> None:
        self._session = session
        super().__init__(
            store,
            terms,
            record,
            sent_us=sent_us,
            clock=clock,
            interrupt_thread=interrupt_thread,
            portal=portal,
        )

    def _make_core(
        self, store: ThreadedAsyncStore, terms: LeaseTerms, record: LeaseRecord, **kw: Any
    ) -> AsyncLease:
        return AdvisoryLease(store, terms, record, session=self._session, **kw)

    @property
    def session(self) -> AdvisorySessionLike:
        """The connection that holds the advisory lock."""
        return self._session

    def __repr__(self) -> str:
        return repr(self._core).replace("AdvisoryLease", "SyncAdvisoryLease", 1)
