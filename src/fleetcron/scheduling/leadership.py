"""Leadership: one replica of a namespace holds the leader lease and runs every job.

A term is one acquisition of the lease ``fleetcron:leader`` — its fence identifies it, and
the store issued it, so two terms are never confused. The elector renews the lease like any
other (:mod:`fleetcron.keepalive`): every ``ttl / 3`` from the send time, trusted until the
send time + ttl − margin. A term ends when the lease is lost (a renewal refused, or the
local deadline passed: :attr:`ElectorSignals.lost`) or when the leader resigns (it
releases the lease, so a standby takes over at once instead of after the ttl).

Local time only *shortens* trust; the store's clock decides who leads. A brief double
leader cannot run a slot twice: claims still go through the ledger, which refuses a slot
that has a row.

Tests wait on :class:`ElectorSignals` instead of sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetcron._log import log
from fleetcron.clock import Clock
from fleetcron.errors import FleetcronError, StoreError
from fleetcron.lease import AsyncLease, LeaseTerms
from fleetcron.models import LEADER_LEASE
from fleetcron.scheduling.definitions import Definitions
from fleetcron.scheduling.planning import PlannedJob
from fleetcron.stores.base import AsyncStore
from fleetcron.stores.job_pages import job_pages

__all__ = ["LEADER_LEASE", "Elector", "ElectorSignals", "follow_leader"]


@dataclass
class ElectorSignals:
    """``elected`` is set while this replica leads; ``lost`` once a term ended by losing
    the lease (not by resigning)."""

    elected: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Elector:
    """Campaigns for, holds and resigns the leader lease of one namespace."""

    def __init__(
        self,
        store: AsyncStore,
        *,
        namespace: str,
        holder: str,
        ttl_us: int,
        clock: Clock,
    ) -> None:
        self.store = store
        self.holder = holder + ":leader"
        self.clock = clock
        self.terms = LeaseTerms(
            namespace=namespace,
            name=LEADER_LEASE,
            lock_at_most_us=ttl_us,
            lock_at_least_us=0,
            keepalive=True,
        )
        self.signals = ElectorSignals()

    async def campaign(self) -> AsyncLease | None:
        """One attempt: the new term's lease (renewed until lost or resigned), or ``None``
        when another replica leads or the store could not be reached."""
        terms = self.terms
        sent = self.clock.monotonic_us()
        try:
            record = await self.store.run(
                self.store.ops.lease_acquire(
                    terms.namespace, terms.name, self.holder, terms.lock_at_most_us, 0
                )
            )
        except StoreError as exc:
            log.warning("leader election failed: %s", exc, extra={"action": "lock_failed"})
            return None
        if record is None:
            return None
        lease = AsyncLease(self.store, terms, record, sent_us=sent, clock=self.clock)
        log.info(
            "leading %s (fence %d)",
            terms.namespace,
            lease.fence,
            extra={"action": "leader_elected", "fence": lease.fence},
        )
        lease.on_lost(self._term_lost)
        lease.start_keepalive()
        self.signals.lost.clear()
        self.signals.elected.set()
        return lease

    def _term_lost(self, lease: AsyncLease) -> None:
        log.error(
            "lost the leader lease; stepping down",
            extra={"action": "leader_lost", "fence": lease.fence},
        )
        self.signals.elected.clear()
        self.signals.lost.set()

    async def resign(self, lease: AsyncLease) -> None:
        """End the term: stop renewing and release the lease (a standby takes over at once);
        a release that fails is logged, and the lease expires by itself."""
        self.signals.elected.clear()
        try:
            await lease.release()
        except FleetcronError as exc:
            log.warning(
                "releasing the leader lease failed (it expires by itself): %s",
                exc,
                extra={"action": "lock_release_failed", "lock": LEADER_LEASE},
            )


async def follow_leader(
    store: AsyncStore,
    namespace: str,
    jobs: Mapping[str, PlannedJob],
    definitions: Definitions,
) -> None:
    """A standby keeps up with the leader's progress (each job's high-water mark), so it
    takes over where the leader stopped instead of walking every slot since it started."""
    try:
        # A page at a time, without the definitions: the fingerprints and progress suffice.
        async for rows in job_pages(store, namespace):
            for row in rows:
                job = jobs.get(row.job)
                if job is None:
                    continue
                definitions.stored(row.job, row.fingerprint, row.now_us)
                if row.high_water_us is not None:
                    job.cursor_us = max(job.cursor_us, row.high_water_us)
    except StoreError as exc:
        log.warning(
            "reading the leader's progress failed: %s",
            exc,
            extra={"action": "store_unavailable"},
        )
