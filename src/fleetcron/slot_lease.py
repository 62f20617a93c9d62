"""The lease of one claimed slot, for ``fleetcron exec --schedule``.

It behaves like a :class:`~fleetcron.lease.Lease` (keepalive, local deadline, loss
callbacks), but renewing it renews the slot's ledger row and the job's lease together,
and giving it back records the run's outcome — refused if the fence is no longer current.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from fleetcron.clock import Clock
from fleetcron.lease import Lease, LeaseTerms
from fleetcron.models import LeaseRecord, RunOutcome, RunRecord
from fleetcron.stores.base import LedgerOperations, SyncStore

__all__ = ["SlotLease"]


class SlotLease(Lease):
    """A claimed slot held like a lease. Set :attr:`outcome` before :meth:`release`."""

    def __init__(
        self,
        store: SyncStore,
        terms: LeaseTerms,
        run: RunRecord,
        *,
        sent_us: int,
        clock: Clock,
    ) -> None:
        started = run.started_us if run.started_us is not None else run.now_us
        record = LeaseRecord(
            namespace=run.namespace,
            name=run.job,
            holder=run.holder,
            fence=run.fence,
            acquired_us=started,
            expires_us=run.expires_us if run.expires_us is not None else started,
            min_until_us=started + terms.lock_at_least_us,
            now_us=run.now_us,
        )
        super().__init__(store, terms, record, sent_us=sent_us, clock=clock, interrupt_thread=False)
        self.run = run
        self.outcome = RunOutcome(state="cancelled", error="ended without an outcome")
        self.accepted: bool | None = None
        self.cancel_requested = False
        self._ledger = cast(LedgerOperations, store.ops)

    def _renew_in_store(self) -> LeaseRecord | None:
        run = self._store.run(
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
            self._declare_lost("another run asked this one to stop (overlap = cancel_other)")
        expires = run.expires_us if run.expires_us is not None else run.now_us
        return replace(self.record, expires_us=expires, now_us=run.now_us)

    def _release_in_store(self) -> bool:
        self.accepted = self._store.run(
            self._ledger.run_finish(
                self.namespace, self.run.job, self.run.slot_us, self.fence, self.outcome
            )
        )
        return self.accepted
