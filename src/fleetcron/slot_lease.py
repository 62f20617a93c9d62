"""The lease of one claimed slot: for ``fleetcron exec --schedule`` (:class:`SlotLease`)
and for every run of the scheduler (:class:`AsyncSlotLease`).

It behaves like a lease of the lock API — the same keepalive, local deadline and loss
report (:mod:`fleetcron.keepalive`) — but renewing it renews the slot's ledger row and
the job's lease together, and giving it back records the run's outcome, refused if the
fence is no longer current.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fleetcron.clock import Clock
from fleetcron.errors import StoreError
from fleetcron.keepalive import backoff_s
from fleetcron.lease import AsyncLease, Lease, LeaseTerms
from fleetcron.models import LeaseRecord, RunOutcome, RunRecord
from fleetcron.stores.base import AsyncStore, SyncStore
from fleetcron.stores.threaded import ThreadedAsyncStore, run_inline

__all__ = ["AsyncSlotLease", "SlotLease"]

_CANCEL_REASON = "another run asked this one to stop (overlap = cancel_other)"


def _slot_record(run: RunRecord, terms: LeaseTerms) -> LeaseRecord:
    """The lease a claim granted, as the lock API describes leases."""
    started = run.started_us if run.started_us is not None else run.now_us
    return LeaseRecord(
        namespace=run.namespace,
        name=run.job,
        holder=run.holder,
        fence=run.fence,
        acquired_us=started,
        expires_us=run.expires_us if run.expires_us is not None else started,
        min_until_us=started + terms.lock_at_least_us,
        now_us=run.now_us,
    )


def _renewed_record(record: LeaseRecord, run: RunRecord) -> LeaseRecord:
    expires = run.expires_us if run.expires_us is not None else run.now_us
    return replace(record, expires_us=expires, now_us=run.now_us)


class AsyncSlotLease(AsyncLease):
    """A claimed slot held like a lease (asyncio): one run of the scheduler.

    :meth:`finish` records the outcome and ends the keepalive. A cancellation asked for by
    another run (``overlap = cancel_other``) is not a loss — the attempt still holds its
    fence and records its outcome — so it is reported to ``on_cancel`` instead.
    """

    def __init__(
        self,
        store: AsyncStore,
        terms: LeaseTerms,
        run: RunRecord,
        *,
        sent_us: int,
        clock: Clock,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(store, terms, _slot_record(run, terms), sent_us=sent_us, clock=clock)
        self.run = run
        self.outcome = RunOutcome(state="cancelled", error="ended without an outcome")
        self.cancel_requested = False
        self.cancel_ends_lease = False
        """A cancellation asked for by another run ends the lease like a loss."""
        self._on_cancel = on_cancel
        self._ledger = store.ops

    async def _renew_in_store(self) -> LeaseRecord | None:
        run = await self._store.run(
            self._ledger.run_extend(
                self.namespace,
                self.run.job,
                self.run.slot_us,
                self.fence,
                self.terms.lock_at_most_us,
            )
        )
        if run is None:
            return None
        if run.cancel_requested and not self.cancel_requested:
            self.cancel_requested = True
            if self._on_cancel is not None:
                self._on_cancel()
            if self.cancel_ends_lease:
                self._declare_lost(_CANCEL_REASON)
        return _renewed_record(self.record, run)

    async def _release_in_store(self) -> bool:
        return await self._store.run(
            self._ledger.run_finish(
                self.namespace, self.run.job, self.run.slot_us, self.fence, self.outcome
            )
        )

    async def finish(
        self,
        outcome: RunOutcome,
        on_retry: Callable[[StoreError], None] | None = None,
    ) -> bool:
        """Stop the keepalive and record ``outcome``; ``False`` when the store refused it
        (the fence is no longer current).

        A store that fails (down, disk full) is tried again, with back-off, for as long as
        the fence can still be current: until the lease's local deadline. ``on_retry`` is
        called once, at the first failure. Past the deadline the last ``StoreError`` is
        raised: the attempt is then recovered by the ledger like one whose holder vanished.
        """
        self.outcome = outcome
        try:
            return await self.release()
        except StoreError as first:
            error = first
        if on_retry is not None:
            on_retry(error)
        attempt = 0
        while (left_s := self.remaining_us() / 1e6) > 0:
            await asyncio.sleep(min(left_s, backoff_s(attempt)))
            if self.remaining_us() <= 0:
                break
            try:
                return await self._release_in_store()
            except StoreError as exc:
                error, attempt = exc, attempt + 1
        raise error


class SlotLease(Lease):
    """A claimed slot held like a lease (sync): the face of an :class:`AsyncSlotLease`.
    Set :attr:`outcome` before :meth:`release`; :attr:`accepted` then says whether the
    store took it.

    A cancellation asked for by another run (``overlap = cancel_other``) ends the lease
    like a loss: the command is stopped.
    """

    def __init__(
        self,
        store: SyncStore,
        terms: LeaseTerms,
        run: RunRecord,
        *,
        sent_us: int,
        clock: Clock,
    ) -> None:
        self._run = run
        super().__init__(
            store,
            terms,
            _slot_record(run, terms),
            sent_us=sent_us,
            clock=clock,
            interrupt_thread=False,
        )
        self.accepted: bool | None = None

    def _make_core(
        self, store: ThreadedAsyncStore, terms: LeaseTerms, record: LeaseRecord, **kw: Any
    ) -> AsyncSlotLease:
        core = AsyncSlotLease(store, terms, self._run, **kw)
        core.cancel_ends_lease = True
        return core

    @property
    def slot(self) -> AsyncSlotLease:
        """The core: the claimed run, its outcome, whether a cancellation was asked."""
        assert isinstance(self._core, AsyncSlotLease)
        return self._core

    @property
    def run(self) -> RunRecord:
        return self.slot.run

    @property
    def cancel_requested(self) -> bool:
        return self.slot.cancel_requested

    @property
    def outcome(self) -> RunOutcome:
        return self.slot.outcome

    @outcome.setter
    def outcome(self, outcome: RunOutcome) -> None:
        self.slot.outcome = outcome

    def release(self) -> bool:
        self.accepted = super().release()
        return self.accepted

    def finish(
        self,
        outcome: RunOutcome,
        on_retry: Callable[[StoreError], None] | None = None,
    ) -> bool:
        """Sync :meth:`AsyncSlotLease.finish`: record ``outcome``, trying a failing store
        again with back-off until the lease's local deadline; past it, raise."""
        self.outcome = outcome
        try:
            return self.release()
        except StoreError as first:
            error = first
        if on_retry is not None:
            on_retry(error)
        attempt = 0
        while (left_s := self.remaining_us() / 1e6) > 0:
            time.sleep(min(left_s, backoff_s(attempt)))
            if self.remaining_us() <= 0:
                break
            try:
                self.accepted = run_inline(self.slot._release_in_store())
                return self.accepted
            except StoreError as exc:
                error, attempt = exc, attempt + 1
        raise error
