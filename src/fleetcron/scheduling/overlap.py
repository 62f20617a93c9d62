"""Refusals: what a replica does with a slot the store did not give it.

A claim is answered ``taken`` (another replica has the slot, or it is final), ``missed``
(past its deadline: recorded so in the same round trip), ``conflict`` (another definition
of the job governs), ``not_due`` (the store's clock has not reached it), ``paused``, or
``busy``: the job's previous attempt still holds its lease. ``busy`` is where the job's
``overlap`` policy acts:

- ``skip``: the slot is recorded ``skipped`` — except right after a store outage, when the
  previous run may be over with its outcome held by the outage on the replica that ran it:
  the slot is asked again for :data:`BUSY_GRACE_US` first.
- ``buffer_one`` / ``cancel_other``: the newest such slot waits (*buffered*) until the
  running attempt ends, older waiting ones are ``skipped``; ``cancel_other`` also asks the
  running attempt to stop.

A slot of a job whose abandoned sync function still runs on this replica is refused here
too, before any claim (:meth:`OverlapPolicy.refuse_blocked`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping

from fleetcron._log import log
from fleetcron.errors import StoreError
from fleetcron.jobspec import JobSpec
from fleetcron.metrics import Metrics
from fleetcron.models import SlotClaim
from fleetcron.schedules import iso_utc
from fleetcron.scheduling.claiming import missed_line
from fleetcron.scheduling.planning import PlannedJob, claim_for
from fleetcron.stores.base import AsyncStore

__all__ = ["AFTER_OUTAGE_US", "BUSY_GRACE_US", "SUPERSEDED_REASON", "OverlapPolicy"]

SUPERSEDED_REASON = "superseded by a newer slot while the job was running"

BUSY_GRACE_US = 1_000_000
"""Right after a store outage (within :data:`AFTER_OUTAGE_US` of this replica finding the
store back), how long a slot refused because its job's previous attempt still holds the
lease is asked again before it is skipped (``overlap = "skip"``). The outage held the
outcomes of runs that ended during it, on every replica; each replica sends them within
half a second of the store answering it, and a slot skipped behind a run that is over is
a slot lost. Outside that window a busy slot is skipped at once, as the policy says."""
AFTER_OUTAGE_US = 5_000_000
_BUSY_RETRY_US = 150_000  # how often such a slot is asked again during its grace


class OverlapPolicy:
    """The refused claims of one replica. ``pending`` is the replica's queue of claims
    (slots to ask again go back there), ``catching_up`` the caught-up slots that run one
    after another, ``jobs`` the planned jobs (their buffered slot), ``now`` the store's
    clock as the replica estimates it."""

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        specs: Mapping[str, JobSpec],
        jobs: Mapping[str, PlannedJob],
        *,
        pending: deque[SlotClaim],
        catching_up: set[tuple[str, int]],
        conflicts: Collection[str],
        now: Callable[[], int],
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._specs = specs
        self._jobs = jobs
        self._pending = pending
        self._catching_up = catching_up
        self._conflicts = conflicts
        self._now = now
        self._metrics = metrics
        self.buffered: set[str] = set()
        """Jobs with a slot waiting for their running attempt to end."""
        # Slots refused ``busy`` during their grace: when first refused (store time), the
        # ones waiting to be asked again, and when.
        self._busy_since: dict[tuple[str, int], int] = {}
        self._busy_wait: list[SlotClaim] = []
        self._busy_retry_at_us: int | None = None
        self._store_back_us: int | None = None
        self._missed: dict[str, list[int]] = {}

    # -- the replica's state -------------------------------------------------------------
    def store_back(self, now: int) -> None:
        """The store answers again after an outage (store time ``now``)."""
        self._store_back_us = now

    def next_retry_us(self) -> int | None:
        """When slots in their busy grace are to be asked again (store time)."""
        return self._busy_retry_at_us

    def requeue_due(self, now: int) -> None:
        """Put the slots in their busy grace back in the queue once their time has come."""
        retry_at = self._busy_retry_at_us
        if self._busy_wait and retry_at is not None and now >= retry_at:
            self._pending.extend(self._busy_wait)
            self._busy_wait.clear()
            self._busy_retry_at_us = None

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop what is kept for the jobs ``keep`` says no to (removed by a reload)."""
        self._busy_wait = [c for c in self._busy_wait if keep(c.job)]
        self._busy_since = {k: v for k, v in self._busy_since.items() if keep(k[0])}
        self.buffered = {name for name in self.buffered if keep(name)}

    def answered(self, claim: SlotClaim, status: str) -> None:
        """A claim was answered ``status``: a slot no longer busy leaves its grace."""
        if status != "busy" and self._busy_since:
            self._busy_since.pop((claim.job, claim.slot_us), None)

    def take_buffered(
        self, room: int, *, finishing: Collection[str], abandoned: Collection[str]
    ) -> tuple[list[SlotClaim], list[SlotClaim]]:
        """The buffered slots to claim now, at most ``room`` (those of jobs whose last
        outcome is still on its way stay buffered), and those of jobs whose abandoned run
        still runs here (to refuse). Looks only at the jobs holding a buffered slot: a
        pass costs what is due, not every job."""
        claims: list[SlotClaim] = []
        blocked: list[SlotClaim] = []
        for name in list(self.buffered):
            job = self._jobs.get(name)
            if job is None or job.buffered is None:
                self.buffered.discard(name)
                continue
            if name in finishing or len(claims) >= room:
                continue
            self.buffered.discard(name)
            claim = claim_for(job.spec, job.buffered, "schedule")
            (blocked if name in abandoned else claims).append(claim)
            job.buffered = None
        return claims, blocked

    async def supersede_buffered(self) -> None:
        """Skip the buffered slots a newer slot of their job has come after (the job's
        cursor moved past them): the newer one is claimed in their place — refused
        ``busy`` it is buffered instead — so the slot that runs when the running attempt
        ends is always the newest due, here and on every replica."""
        for name in list(self.buffered):
            job = self._jobs.get(name)
            if job is None or job.buffered is None or job.cursor_us <= job.buffered:
                continue
            slot = job.buffered
            await self.skip(
                SlotClaim(job=name, slot_us=slot, run_id=""),
                SUPERSEDED_REASON,
                "superseded",
            )
            if job.buffered == slot:
                job.buffered = None
                self.buffered.discard(name)

    # -- refusals ------------------------------------------------------------------------
    async def refuse_blocked(self, blocked: list[SlotClaim], reason: str) -> None:
        """Slots of jobs whose abandoned run still runs here: a fresh slot is recorded
        ``skipped`` with ``reason`` (a slot another replica already has keeps its row); a
        retry, a recovered attempt or a queued run comes back through the ledger later."""
        for index, claim in enumerate(blocked):
            if claim.trigger != "schedule" or claim.deadline_us is None:
                continue
            if claim.job in self._conflicts:
                continue  # not the job's slot: nothing is recorded for it
            try:
                await self.skip(claim, reason, "abandoned")
            except StoreError:
                self._pending.extendleft(reversed(blocked[index:]))
                raise

    def say_missed(self) -> None:
        """One line per job for the claims the store answered ``missed`` since the last
        call (past their deadline: recorded so by the store)."""
        for job, slots in self._missed.items():
            spec = self._specs.get(job)
            catchup = spec.catchup if spec is not None else "?"
            missed_line(job, sorted(slots), "behind schedule: not started by its deadline", catchup)
        self._missed.clear()

    async def refused(self, claim: SlotClaim, status: str) -> bool:
        """Apply the policy to a claim the store refused with ``status``. Returns whether
        the slot is settled elsewhere (taken, or final), freeing its place in the batch."""
        if status == "taken":
            return True  # another replica has it, or it is final: exactly once, nothing to do
        if status == "conflict":
            return True  # the stored definition governs: its replicas run the job
        if status == "missed":
            # Recorded by the store in the same round trip; said once per job and batch.
            self._missed.setdefault(claim.job, []).append(claim.slot_us)
            return True
        if claim.trigger != "schedule":
            return False  # a trigger or backfill: the ledger's queued row brings it back
        if (claim.job, claim.slot_us) in self._catching_up and status != "paused":
            self._pending.appendleft(claim)  # busy with the previous caught-up slot: wait
            return False
        if status == "not_due":
            self._pending.append(claim)  # not due by the store's clock yet: later
            return False
        if status == "paused":
            await self.skip(claim, "job paused", "paused")
            return False
        job = self._jobs[claim.job]
        if job.spec.overlap in ("buffer_one", "cancel_other"):
            await self._buffer(job, claim)
        else:
            await self._busy(claim)
        return False

    async def _buffer(self, job: PlannedJob, claim: SlotClaim) -> None:
        """``buffer_one`` / ``cancel_other``: the newest refused slot waits for the running
        attempt; an older one waiting is skipped, superseded."""
        if job.buffered is not None and job.buffered != claim.slot_us:
            await self.skip(
                SlotClaim(job=claim.job, slot_us=min(job.buffered, claim.slot_us), run_id=""),
                SUPERSEDED_REASON,
                "superseded",
            )
        newer = job.buffered is None or claim.slot_us > job.buffered
        job.buffered = max(claim.slot_us, job.buffered or 0)
        self.buffered.add(claim.job)
        if job.spec.overlap == "cancel_other" and newer:
            # Asked once per waiting slot: the request stays on the running attempt's row,
            # and the replica running it acts on it within about a second.
            asked = await self._store.run(self._store.ops.run_cancel(self._namespace, claim.job))
            if asked:
                # Said at debug only: every replica holding the slot asks; the replica that
                # runs the attempt says once that it stops it (run_cancel_received).
                log.debug(
                    "%s: slot %s asked %d running attempt(s) to stop (overlap = cancel_other)",
                    claim.job,
                    iso_utc(claim.slot_us),
                    asked,
                    extra={"action": "run_cancel_requested", "job": claim.job},
                )

    async def _busy(self, claim: SlotClaim) -> None:
        """``skip``: the slot is skipped, after its grace right after an outage."""
        key = (claim.job, claim.slot_us)
        now = self._now()
        back = self._store_back_us
        since = self._busy_since.setdefault(key, now)
        if back is not None and since - back < AFTER_OUTAGE_US and now - since < BUSY_GRACE_US:
            # The previous run may be over with its outcome on the way: ask again shortly.
            self._busy_wait.append(claim)
            if self._busy_retry_at_us is None:
                self._busy_retry_at_us = now + _BUSY_RETRY_US
            return
        del self._busy_since[key]
        await self.skip(claim, "previous run still running (overlap = skip)", "previous_running")

    async def skip(self, claim: SlotClaim, why: str, reason: str) -> None:
        """Record ``claim``'s slot skipped with ``why``; ``reason``: its metric label."""
        await self._store.run(
            self._store.ops.run_record(
                self._namespace, claim.job, claim.slot_us, "skipped", why, "schedule"
            )
        )
        if self._metrics is not None:
            self._metrics.skipped(claim.job, reason)
        log.info(
            "%s: slot %s skipped: %s",
            claim.job,
            iso_utc(claim.slot_us),
            why,
            extra={"action": "slot_skipped", "job": claim.job, "slot_us": claim.slot_us},
        )
