"""The lease of one claimed slot: for ``fleetcron exec --schedule`` (:class:`SlotLease`)
and for every run of the scheduler (:class:`AsyncSlotLease`).

It behaves like a lease of the lock API — the same keepalive, local deadline and loss
report (:mod:`fleetcron.keepalive`) — but renewing it renews the slot's ledger row and
the job's lease together, and giving it back records the run's outcome, refused if the
fence is no longer current.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from fleetcron.bridge import ThreadedAsyncStore, run_inline
from fleetcron.clock import Clock
from fleetcron.errors import SchemaError, StoreError, StoreRefused, StoreUnavailable
from fleetcron.keepalive import finish_retry_pause_us, safety_margin_us
from fleetcron.lease import AsyncLease, Lease, LeaseTerms
from fleetcron.models import LeaseRecord, RunFinish, RunOutcome, RunRecord
from fleetcron.stores.base import AsyncStore, SyncStore

__all__ = [
    "CANCEL_NOTE_PREFIX",
    "CANCEL_REQUESTED",
    "CANCEL_WATCH_S",
    "AsyncSlotLease",
    "Recorder",
    "SlotLease",
    "cancel_reason",
]

_CANCEL_REASON = "another run asked this one to stop (overlap = cancel_other)"
CANCEL_WATCH_S = 1.0
"""How often a held slot's row is read for cancel requests."""


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


Recorder = Callable[[RunFinish], Awaitable[bool]]
"""Records one outcome in the store; whether the store took it (its fence current)."""


CANCEL_REQUESTED = "cancel requested"
"""The reason a cancelled attempt is recorded with when the request names nobody
(``overlap = "cancel_other"``)."""
CANCEL_NOTE_PREFIX = "cancelled by "
"""How a cancel request's note names who asked (``cancelled by alice@host``)."""


def cancel_reason(row: RunRecord) -> str:
    """The reason a cancelled attempt is recorded with: who asked, when the request said
    so (``cancelled by alice@host``, kept in the row's ``error`` until the outcome
    replaces it), else :data:`CANCEL_REQUESTED`."""
    note = row.error
    return note if note is not None and note.startswith(CANCEL_NOTE_PREFIX) else CANCEL_REQUESTED


class AsyncSlotLease(AsyncLease):
    """A claimed slot held like a lease (asyncio): one run of the scheduler.

    :meth:`finish` ends the keepalive and records the outcome: through ``recorder`` when
    one is given (the scheduler's, which groups the outcomes of runs ending together),
    else with the store's ``run_finish``. Releasing a slot *is* recording its outcome.
    :attr:`renewed` is set at each successful renewal (the run's stop points move with
    the deadline). A cancellation asked for by another run (``overlap = cancel_other``) is
    not a loss — the attempt still holds its fence and records its outcome — so it is
    reported to ``on_cancel`` instead.
    """

    def __init__(
        self,
        store: AsyncStore,
        terms: LeaseTerms,
        run: RunRecord,
        *,
        sent_us: int,
        clock: Clock,
        on_cancel: Callable[[str], None] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        super().__init__(store, terms, _slot_record(run, terms), sent_us=sent_us, clock=clock)
        self.run = run
        self.renewed = asyncio.Event()
        """Set at each successful renewal (whoever waits on it clears it)."""
        self._recorder = recorder
        self.outcome = RunOutcome(state="cancelled", error="ended without an outcome")
        self.cancel_requested = False
        self.cancel_reason = CANCEL_REQUESTED
        """Why the attempt was asked to stop (who asked, when the request says so)."""
        self.cancel_ends_lease = False
        """A cancellation asked for by another run ends the lease like a loss."""
        self._on_cancel = on_cancel
        self._ledger = store.ops
        self._cancel_watch: asyncio.Task[None] | None = None

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
        self._saw(run)
        return _renewed_record(self.record, run)

    def _saw(self, run: RunRecord) -> None:
        """The slot's row as the store has it now: act on a cancel request it carries."""
        if run.cancel_requested and not self.cancel_requested:
            self.cancel_requested = True
            reason = self.cancel_reason = cancel_reason(run)
            if self._on_cancel is not None:
                self._on_cancel(reason)
            if self.cancel_ends_lease:
                self._declare_lost(_CANCEL_REASON if reason == CANCEL_REQUESTED else reason)

    def start_cancel_watch(self, every_s: float = CANCEL_WATCH_S) -> None:
        """Read the slot's row every ``every_s`` while it is held, so that a cancel
        request reaches this attempt within about that, not at its next renewal
        (``lock_at_most / 3``). Idempotent. (A scheduler's replica reads the rows of all
        its runs at once instead.)"""
        if self._cancel_watch is None:
            self._cancel_watch = asyncio.get_running_loop().create_task(
                self._watch_cancels(every_s), name=f"fleetcron-cancel-watch:{self.name}"
            )

    async def _watch_cancels(self, every_s: float) -> None:
        ns, job, slot = self.namespace, self.run.job, self.run.slot_us
        while not (self.cancel_requested or self._released or self.is_lost):
            await asyncio.sleep(every_s)
            try:
                run = await self._store.run(self._ledger.run_get(ns, job, slot))
            except StoreError:
                continue  # the keepalive deals with an outage; looked at again
            if run is not None and run.state == "running" and run.fence == self.fence:
                self._saw(run)

    def cancel_keepalive(self) -> None:
        super().cancel_keepalive()
        task = self._cancel_watch
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    async def extend(self) -> None:
        await super().extend()
        self.renewed.set()

    async def _release_in_store(self) -> bool:
        return await self._record()

    async def _record(self) -> bool:
        """One try to record :attr:`outcome`; whether the store took it."""
        if self._recorder is not None:
            return await self._recorder(
                RunFinish(self.run.job, self.run.slot_us, self.fence, self.outcome)
            )
        return await self._store.run(
            self._ledger.run_finish(
                self.namespace, self.run.job, self.run.slot_us, self.fence, self.outcome
            )
        )

    def fence_horizon_us(self) -> int:
        """The lease's nominal end (monotonic µs): its local deadline plus the safety
        margin. The store expires the lease no earlier, so the fence may be current until
        then — an outcome is worth sending until then, never after."""
        return self.deadline_us + safety_margin_us(self.terms.lock_at_most_us)

    def retry_pause_us(self, attempt: int) -> int | None:
        """The wait before the next try to record the outcome, ``None``: no try can be in
        time any more (:func:`~fleetcron.keepalive.finish_retry_pause_us`)."""
        return finish_retry_pause_us(
            attempt,
            now_us=self.clock.monotonic_us(),
            deadline_us=self.deadline_us,
            ttl_us=self.terms.lock_at_most_us,
        )

    async def confirm(self) -> bool:
        """Whether the ledger holds this attempt's outcome: asked when the store refused a
        try after an earlier one whose fate is unknown (its connection broke after the
        request went out), which may have been the one that took it."""
        row = await self._store.run(
            self._ledger.run_get(self.namespace, self.run.job, self.run.slot_us)
        )
        return (
            row is not None
            and row.fence == self.fence
            and row.state == self.outcome.state
            and row.finished_us is not None
        )

    async def finish(
        self,
        outcome: RunOutcome,
        on_retry: Callable[[StoreError], None] | None = None,
        *,
        wake: Callable[[], asyncio.Event] | None = None,
    ) -> bool:
        """Stop the keepalive and record ``outcome``; ``False`` when the store refused it
        (the fence is no longer current).

        A store that fails (down, unreachable, disk full) is tried again for as long as the
        fence can still be current — until :meth:`fence_horizon_us`, with waits of at most
        :data:`~fleetcron.keepalive.FINISH_RETRY_MOST_S` and a try just before the local
        deadline — and each try is given up at that horizon. ``wake()`` gives an event set
        when the store is known to answer again (the next try goes at once). ``on_retry``
        is called once, at the first failure. When no try could be in time, the last
        error is raised (a :class:`~fleetcron.errors.StoreError`): the attempt is then
        recovered by the ledger like one whose holder vanished.
        """
        self.outcome = outcome
        error: StoreError | None = None
        attempt = 0
        while True:
            left_us = self.fence_horizon_us() - self.clock.monotonic_us()
            if attempt > 0 and left_us <= 0:
                break
            try:
                # The first try always goes (it ends the keepalive); none outlives the horizon.
                async with asyncio.timeout(left_us / 1e6 if left_us > 0 else None):
                    if attempt == 0:
                        self._stop_holding()
                    accepted = await self._record()
            except (StoreRefused, SchemaError):
                raise  # trying again will not help
            except StoreError as exc:
                error = exc
            except TimeoutError as exc:
                error = StoreUnavailable("no answer from the store before the lease ended")
                error.__cause__ = exc
            else:
                if accepted or error is None:
                    return accepted
                # Refused after a try whose fate is unknown: that try may have taken it.
                try:
                    async with asyncio.timeout(max(left_us / 1e6, 1.0)):
                        return await self.confirm()
                except TimeoutError as exc:
                    raise StoreUnavailable("no answer from the store to a read") from exc
            if attempt == 0 and on_retry is not None:
                on_retry(error)
            pause = self.retry_pause_us(attempt)
            attempt += 1
            if pause is None:
                break
            event = wake() if wake is not None else None
            if event is None:
                await asyncio.sleep(pause / 1e6)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), pause / 1e6)
        if error is None:
            error = StoreUnavailable("the lease ended before the outcome could be sent")
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

    def start_cancel_watch(self) -> None:
        """Read the slot's row every second on the keepalive's portal (started here if
        need be), so that a cancel request ends the lease within about a second — with
        or without keepalive."""
        self._ensure_portal()
        assert self._portal is not None
        self._portal.call_soon(self.slot.start_cancel_watch)

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
    def cancel_reason(self) -> str:
        """Why the attempt was asked to stop (who asked, when the request says so)."""
        return self.slot.cancel_reason

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
        again while the fence can still be current (each try is bounded by the store's
        ``timeout``); when no try could be in time, raise."""
        self.outcome = outcome
        slot = self.slot
        error: StoreError | None = None
        attempt = 0
        while attempt == 0 or slot.fence_horizon_us() - slot.clock.monotonic_us() > 0:
            try:
                accepted = self.release() if attempt == 0 else run_inline(slot._record())
            except (StoreRefused, SchemaError):
                raise
            except StoreError as exc:
                error = exc
            else:
                if not accepted and error is not None:
                    # Refused after a try whose fate is unknown: that try may have taken it.
                    accepted = run_inline(slot.confirm())
                self.accepted = accepted
                return accepted
            if attempt == 0 and on_retry is not None:
                on_retry(error)
            pause = slot.retry_pause_us(attempt)
            attempt += 1
            if pause is None:
                break
            time.sleep(pause / 1e6)
        if error is None:
            error = StoreUnavailable("the lease ended before the outcome could be sent")
        raise error
