"""Recovery: the runs a replica claims again, because the ledger says so.

- a retry of a failed attempt, when its back-off has passed (known locally to the replica
  that recorded the failure, and in the ledger for every other replica);
- an attempt whose holder vanished (``running`` with an expired lease);
- a ``queued`` run asked for by ``fleetcron trigger`` or ``backfill``.

Replicas poll the ledger every :data:`RECOVERY_EVERY_S` for their own jobs only, so rows of
jobs a replica does not define never fill its limit and starve its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from fleetcron.jobspec import JobSpec
from fleetcron.models import SlotClaim
from fleetcron.scheduling.planning import claim_for
from fleetcron.stores.base import AsyncStore

__all__ = ["DUE_LIMIT", "RECOVERY_EVERY_S", "Recovery"]

RECOVERY_EVERY_S = 2.0
DUE_LIMIT = 200  # ledger rows to claim again, per poll


class Recovery:
    """The retries this replica scheduled, and the poll of the ledger for the rest."""

    def __init__(self, store: AsyncStore, namespace: str, specs: Mapping[str, JobSpec]) -> None:
        self.store = store
        self.namespace = namespace
        self.specs = specs
        self.retries: dict[tuple[str, int], tuple[int, int]] = {}  # → (due µs, attempt)

    def schedule_retry(self, job: str, slot_us: int, due_us: int, attempt: int) -> None:
        """Claim the slot again once the store's clock reaches ``due_us``."""
        self.retries[(job, slot_us)] = (due_us, attempt)

    def due_retries(self, now_us: int) -> list[SlotClaim]:
        """The retries whose time has come (they are forgotten here once handed out)."""
        claims = []
        for key, (due, _attempt) in list(self.retries.items()):
            if due <= now_us:
                del self.retries[key]
                spec = self.specs.get(key[0])
                if spec is not None:
                    claims.append(claim_for(spec, key[1], "schedule"))
        return claims

    async def poll(self, known: Collection[tuple[str, int]]) -> list[SlotClaim]:
        """Rows the ledger says are due again, oldest first, except the ``known`` slots
        (waiting, running or retried here already)."""
        rows = await self.store.run(
            self.store.ops.run_due(self.namespace, DUE_LIMIT, list(self.specs))
        )
        claims = []
        for row in rows:
            spec = self.specs.get(row.job)
            key = (row.job, row.slot_us)
            if spec is None or key in known or key in self.retries:
                continue
            claims.append(claim_for(spec, row.slot_us, row.trigger))
        return claims
