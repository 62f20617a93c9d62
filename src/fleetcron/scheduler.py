"""The scheduler: turns schedules into claimed slots and runs them.

Every replica runs the same loop (claim mode): compute the slots that are due by the
*store's* clock (estimated locally, enforced by the store), claim them in one round trip
— no more than this replica has room to run — and run what it won. A slot another replica
won is left alone; a slot refused because the job is still running follows the job's
``overlap`` policy; slots missed while every replica was down follow ``catchup``. In
leader mode only the holder of the leader lease runs the loop.

Each run holds its slot like a lease (:class:`~fleetcron.slot_lease.AsyncSlotLease`, the
rules of :mod:`fleetcron.keepalive`): renewed every ``lock_at_most / 3`` from the time the
request was sent; a grace before its local deadline the run is asked to stop (SIGTERM to a
process group, cancellation of Python code) and by the deadline a process group is killed,
so nothing of it is alive once the store could grant the slot again. Its late completion is
refused by its fence. A sync function that does not return when cancelled is abandoned,
and this replica starts no other run of its job until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetcron._log import log
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.context import RunContext
from fleetcron.errors import ConfigurationError, FleetcronError, StoreError
from fleetcron.executor import Cancellation, StopPolicy, execute
from fleetcron.jobsfile import JobSpec
from fleetcron.keepalive import effective_grace_us
from fleetcron.lease import AsyncLease, LeaseTerms, new_holder
from fleetcron.models import ClaimResult, JobRecord, RunOutcome, RunRecord, SlotClaim
from fleetcron.schedules import jitter_us
from fleetcron.slot_lease import AsyncSlotLease
from fleetcron.stores.base import AsyncStore

__all__ = ["LEADER_LEASE", "Scheduler", "SchedulerOptions"]

LEADER_LEASE = "fleetcron:leader"
_LATE_TOLERANCE_US = 5_000_000  # a slot this late is still "on time" (catchup = skip)
_RECOVERY_EVERY_S = 2.0
_MISSED_RECORD_LIMIT = 1_000
_DUE_LIMIT = 200  # ledger rows to claim again, per recovery poll
_REGISTER_BATCH = 500  # job definitions per registration round trip
_SIFT_AT_LEAST = 512  # waiting slots looked at per sift, whatever the room
ABANDONED_REASON = "an abandoned run of this job still runs on this replica"


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """How one replica runs. ``concurrency`` caps the runs in flight on this replica."""

    namespace: str
    mode: str = "claim"
    concurrency: int = 16
    tick_s: float = 1.0
    shutdown_grace_s: float = 30.0
    kill_grace_s: float = 5.0
    leader_ttl_us: int = 15_000_000
    echo: bool = True
    backend_url: str | None = None


@dataclass(eq=False)
class _Job:
    spec: JobSpec
    cursor_us: int
    buffered: int | None = None  # buffer_one / cancel_other: the newest waiting slot


@dataclass(eq=False)
class _Running:
    spec: JobSpec
    record: RunRecord
    cancellation: Cancellation
    task: asyncio.Task[None] | None = None
    lease: AsyncSlotLease | None = None


@dataclass
class _Signals:
    """Events tests (and embedders) can wait on instead of sleeping."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    leader: asyncio.Event = field(default_factory=asyncio.Event)
    ticked: asyncio.Condition = field(default_factory=asyncio.Condition)


class Scheduler:
    """One replica's scheduler over an :class:`~fleetcron.stores.base.AsyncStore`."""

    def __init__(
        self,
        store: AsyncStore,
        jobs: Sequence[JobSpec],
        options: SchedulerOptions,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if options.mode not in ("claim", "leader"):
            raise ConfigurationError(f"mode must be claim or leader, not {options.mode!r}")
        if options.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        self.store = store
        self.ops = store.ops
        self.specs = {spec.name: spec for spec in jobs}
        self.options = options
        self.clock = clock
        self.holder = new_holder()
        self.signals = _Signals()
        self._jobs: dict[str, _Job] = {}
        self._running: dict[tuple[str, int], _Running] = {}
        self._pending: deque[SlotClaim] = deque()
        # Each job's next fire time (slot + jitter) in a heap: a tick looks at the due jobs
        # only, so its cost follows the work due, not the number of jobs defined.
        self._due: list[tuple[int, str]] = []
        self._catching_up: set[tuple[str, int]] = set()
        self._retries: dict[tuple[str, int], tuple[int, int]] = {}  # → (due µs, attempt)
        # Jobs whose sync function was abandoned after its cancellation and still runs.
        self._abandoned: dict[str, asyncio.Future[object]] = {}
        self._offset_us = 0
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # a run finished: waiting slots may be claimable now
        self._last_recovery = 0.0
        self._contended = False  # the last claims found slots other replicas had taken

    # -- public control ----------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_grace_s`` to finish."""
        self._stop.set()

    @property
    def running(self) -> list[RunRecord]:
        """Attempts in flight on this replica."""
        return [entry.record for entry in self._running.values()]

    async def run(self) -> None:
        """Run until :meth:`stop`; then drain and return."""
        await self._register()
        self.signals.started.set()
        try:
            if self.options.mode == "leader":
                await self._lead()
            else:
                await self._loop(self._stop)
        finally:
            await self._drain()

    # -- set-up --------------------------------------------------------------------------
    async def _sync_clock(self) -> int:
        """Read the store's clock; every decision of a tick is made on that reading."""
        sent = self.clock.monotonic_us()
        store_now = await self.store.run(self.ops.store_now())
        received = self.clock.monotonic_us()
        self._offset_us = store_now - (sent + received) // 2
        return store_now

    def _now(self) -> int:
        """The store's clock estimated between readings, for timing sleeps only. It rides
        the monotonic clock, so a step of this host's wall clock cannot move it."""
        return self.clock.monotonic_us() + self._offset_us

    async def _register(self) -> None:
        ns = self.options.namespace
        store_now = await self._sync_clock()
        specs = list(self.specs.values())
        # Each replica registers in its own order, in batches (one round trip each), so
        # replicas starting together do not queue on the same job rows.
        random.shuffle(specs)
        for start in range(0, len(specs), _REGISTER_BATCH):
            chunk = specs[start : start + _REGISTER_BATCH]
            fingerprints = [spec.fingerprint() for spec in chunk]
            befores = await self.store.run(
                self.ops.job_register(
                    ns,
                    [
                        (spec.name, json.dumps(spec.definition(), sort_keys=True), fp)
                        for spec, fp in zip(chunk, fingerprints, strict=True)
                    ],
                )
            )
            for spec, fingerprint, before in zip(chunk, fingerprints, befores, strict=True):
                self._add_job(spec, fingerprint, before, store_now)

    def _add_job(
        self, spec: JobSpec, fingerprint: str, before: JobRecord | None, store_now: int
    ) -> None:
        if before is not None and before.fingerprint not in ("", fingerprint):
            log.warning(
                "job %s is defined differently by another replica (fingerprint %s, "
                "here %s); the last registration wins for status displays",
                spec.name,
                before.fingerprint,
                fingerprint,
                extra={"action": "job_definition_conflict", "job": spec.name},
            )
        high_water = before.high_water_us if before is not None else None
        # A job new to the fleet starts now; a known one resumes after its last slot,
        # so slots missed while every replica was down meet the catch-up policy.
        cursor = high_water if high_water is not None else store_now
        self._jobs[spec.name] = _Job(spec=spec, cursor_us=cursor)
        self._schedule_next(self._jobs[spec.name])

    # -- leader mode -----------------------------------------------------------------------
    async def _lead(self) -> None:
        terms = LeaseTerms(
            namespace=self.options.namespace,
            name=LEADER_LEASE,
            lock_at_most_us=self.options.leader_ttl_us,
            lock_at_least_us=0,
            keepalive=True,
        )
        while not self._stop.is_set():
            lease = await self._try_lead(terms)
            if lease is None:
                await self._follow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.options.leader_ttl_us / 3e6)
                continue
            log.info(
                "leading %s (fence %d)",
                self.options.namespace,
                lease.fence,
                extra={"action": "leader_elected", "fence": lease.fence},
            )
            self.signals.leader.set()
            stepped_down = asyncio.Event()
            lease.on_lost(_setter(stepped_down))
            lease.start_keepalive()
            until = asyncio.Event()
            watcher = asyncio.create_task(_first_of(until, self._stop, stepped_down))
            try:
                await self._loop(until)
                if stepped_down.is_set():
                    log.error(
                        "lost the leader lease; stepping down",
                        extra={"action": "leader_lost", "fence": lease.fence},
                    )
                    self._cancel_all("leader lease lost")
                    await self._wait_runs(self.options.kill_grace_s + 1)
            finally:
                watcher.cancel()
                self.signals.leader.clear()
                try:
                    await lease.release()  # also stops its keepalive
                except FleetcronError as exc:
                    log.warning(
                        "releasing the leader lease failed (it expires by itself): %s",
                        exc,
                        extra={"action": "lock_release_failed", "lock": LEADER_LEASE},
                    )

    async def _follow(self) -> None:
        """A standby keeps up with the leader's progress, so it takes over where the
        leader stopped instead of walking every slot since it started."""
        try:
            rows = await self.store.run(self.ops.job_list(self.options.namespace))
        except StoreError as exc:
            log.warning(
                "reading the leader's progress failed: %s",
                exc,
                extra={"action": "store_unavailable"},
            )
            return
        for row in rows:
            job = self._jobs.get(row.job)
            if job is not None and row.high_water_us is not None:
                job.cursor_us = max(job.cursor_us, row.high_water_us)

    async def _try_lead(self, terms: LeaseTerms) -> AsyncLease | None:
        sent = self.clock.monotonic_us()
        try:
            record = await self.store.run(
                self.store.ops.lease_acquire(
                    terms.namespace, terms.name, self.holder + ":leader", terms.lock_at_most_us, 0
                )
            )
        except StoreError as exc:
            log.warning("leader election failed: %s", exc, extra={"action": "lock_failed"})
            return None
        if record is None:
            return None
        return AsyncLease(self.store, terms, record, sent_us=sent, clock=self.clock)

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self, until: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not until.is_set() and not self._stop.is_set():
            try:
                await self._tick(loop.time())
            except StoreError as exc:
                log.error("store unavailable: %s", exc, extra={"action": "store_unavailable"})
            except Exception:
                # A bug must not stop the replica silently or at once: say so, go on.
                log.exception("scheduling pass failed", extra={"action": "tick_failed"})
            async with self.signals.ticked:
                self.signals.ticked.notify_all()
            await _wait_any((until, self._wake), self._sleep_s())
            self._wake.clear()

    def _sleep_s(self) -> float:
        now = self._now()
        soonest = now + round(self.options.tick_s * 1e6)
        if self._due:
            soonest = min(soonest, self._due[0][0])
        # A few random milliseconds past the slot: replicas wake in a different order each
        # time, so the runs of a single job spread over them instead of going to one.
        spread = random.uniform(0.002, 0.03)
        return max(0.005, (soonest - now) / 1e6 + spread)

    async def _tick(self, loop_time: float) -> None:
        # Due, late and missed are judged by the store's clock read now — never by this
        # host's clock, which may be wrong (a replica whose clock ran ahead must not record
        # future slots as missed or skipped for the whole fleet).
        now = await self._sync_clock()
        due: list[_Job] = []
        while self._due and self._due[0][0] <= now:
            due.append(self._jobs[heapq.heappop(self._due)[1]])
        # Every replica collects the same slots at the same moment: each one queues the
        # jobs in its own random order (a job's slots stay in order), so their first
        # claims land on different jobs instead of all queueing on the same job leases.
        random.shuffle(due)
        try:
            for job in due:
                self._pending.extend(await self._collect(job, now))
        finally:
            # Every popped job goes back in the heap, collected or not (a store error
            # leaves its cursor where it was: the next tick collects it again).
            for job in due:
                self._schedule_next(job)
        self._collect_retries(now)
        if loop_time - self._last_recovery >= _RECOVERY_EVERY_S:
            self._last_recovery = loop_time
            await self._recover()
        await self._claim()

    def _schedule_next(self, job: _Job) -> None:
        """Put the job's next slot after its cursor, with its jitter, in the due heap."""
        spec = job.spec
        following = spec.schedule.next_after(job.cursor_us)
        if following is not None:
            fire = following + jitter_us(spec.name, following, spec.jitter_us)
            heapq.heappush(self._due, (fire, spec.name))

    async def _collect(self, job: _Job, now: int) -> list[SlotClaim]:
        """The job's due slots to claim; the ones catch-up gives up are recorded
        ``missed``."""
        spec = job.spec
        due = spec.schedule.slots_between(job.cursor_us, now, limit=100_000)
        ready = [s for s in due if s + jitter_us(spec.name, s, spec.jitter_us) <= now]
        if not ready:
            return []
        on_time = [s for s in ready if now - s <= _LATE_TOLERANCE_US + spec.jitter_us]
        late = [s for s in ready if s not in on_time]
        take = list(on_time)
        if late:
            window = [s for s in late if now - s <= spec.catchup_window_us]
            if spec.catchup == "all":
                take = window[-spec.max_catchup :] + on_time
            elif spec.catchup == "latest" and not on_time and window:
                take = [window[-1]]
        missed = [s for s in ready if s not in take]
        for slot in missed[-_MISSED_RECORD_LIMIT:]:
            await self.store.run(
                self.ops.run_record(
                    self.options.namespace,
                    spec.name,
                    slot,
                    "missed",
                    f"missed (catchup = {spec.catchup})",
                    "schedule",
                )
            )
        if missed:
            log.warning(
                "%s: %d slot(s) missed (catchup = %s)",
                spec.name,
                len(missed),
                spec.catchup,
                extra={"action": "slot_missed", "job": spec.name, "count": len(missed)},
            )
        job.cursor_us = ready[-1]  # only once recorded: a store error retries the lot
        # Caught-up slots run one after another, not "skipped while the previous runs".
        self._catching_up.update((spec.name, slot) for slot in take if slot not in on_time)
        return [
            self._claim_for(spec, slot, "schedule", deadline_us=_deadline(spec, slot))
            for slot in take
        ]

    def _claim_for(
        self, spec: JobSpec, slot: int, trigger: str, *, deadline_us: int | None = None
    ) -> SlotClaim:
        return SlotClaim(
            job=spec.name,
            slot_us=slot,
            run_id=str(uuid.uuid4()),
            exclusive=spec.overlap != "allow",
            max_attempts=spec.retries + 1,
            trigger=trigger,
            least_us=spec.lock_at_least_us,
            deadline_us=deadline_us,
        )

    def _collect_retries(self, now: int) -> None:
        for key, (due, _attempt) in list(self._retries.items()):
            if due <= now:
                del self._retries[key]
                spec = self.specs.get(key[0])
                if spec is not None:
                    self._pending.append(self._claim_for(spec, key[1], "schedule"))

    async def _recover(self) -> None:
        """Pick up what the ledger says is due again: attempts whose holder vanished,
        retries another replica left, and queued runs (trigger, backfill) — oldest first."""
        # Only this replica's jobs: rows of jobs it does not define (another replica's,
        # or a job since removed) must not fill the limit and starve its own.
        rows = await self.store.run(
            self.ops.run_due(self.options.namespace, _DUE_LIMIT, list(self.specs))
        )
        waiting = {(c.job, c.slot_us) for c in self._pending}
        for row in rows:
            spec = self.specs.get(row.job)
            key = (row.job, row.slot_us)
            if spec is None or key in waiting or key in self._running or key in self._retries:
                continue
            self._pending.append(self._claim_for(spec, row.slot_us, row.trigger))

    async def _claim(self) -> None:
        # A claim refused because another replica already has the slot frees its place in
        # the batch for the job's next waiting slot: go round until nothing moves.
        for _ in range(20):
            if not await self._claim_batch():
                return

    async def _sift(self, room: int) -> None:
        """Drop waiting slots other replicas already have, learnt in one cheap read, so
        that claims (which lock and write) go to slots still free."""
        head = list(itertools.islice(self._pending, max(4 * room, _SIFT_AT_LEAST)))
        # Fresh slots only (they carry a deadline): a retry or a recovered attempt has a
        # row already, which run_settled counts, but it is still to be claimed.
        asked = [(c.job, c.slot_us) for c in head if c.deadline_us is not None]
        if not asked:
            return
        settled = await self.store.run(self.ops.run_settled(self.options.namespace, asked))
        if not settled:
            return
        for _ in head:  # nothing else touches the queue while this tick awaits
            self._pending.popleft()
        self._pending.extendleft(reversed([c for c in head if (c.job, c.slot_us) not in settled]))
        self._catching_up -= settled

    async def _claim_batch(self) -> bool:
        """Claim one batch; whether some slot turned out taken elsewhere."""
        room = self.options.concurrency - len(self._running)
        if room <= 0 or not (self._pending or any(j.buffered for j in self._jobs.values())):
            return False
        if self._contended and self._pending:
            await self._sift(room)
        claims: list[SlotClaim] = []
        blocked: list[SlotClaim] = []
        for job in self._jobs.values():
            if job.buffered is not None and len(claims) < room:
                claim = self._claim_for(job.spec, job.buffered, "schedule")
                (blocked if job.spec.name in self._abandoned else claims).append(claim)
                job.buffered = None
        # At most one exclusive claim per job per batch: the others would only find the
        # job's lease taken by the first. They wait, in order, for the next tick.
        exclusive = {c.job for c in claims if c.exclusive}
        waiting: list[SlotClaim] = []
        while self._pending and len(claims) < room:
            claim = self._pending.popleft()
            if claim.job in self._abandoned:
                blocked.append(claim)
                continue
            if claim.exclusive and claim.job in exclusive:
                waiting.append(claim)
                continue
            if claim.exclusive:
                exclusive.add(claim.job)
            claims.append(claim)
        self._pending.extendleft(reversed(waiting))
        await self._refuse_blocked(blocked)
        ttl_by_job = {c.job: self.specs[c.job].lock_at_most_us for c in claims}
        # One batch per lease length, usually one batch in all.
        answers: list[tuple[SlotClaim, ClaimResult]] = []
        sent = self.clock.monotonic_us()
        try:
            for ttl in sorted(set(ttl_by_job.values())):
                batch = [c for c in claims if ttl_by_job[c.job] == ttl]
                results = await self.store.run(
                    self.ops.run_claim(self.options.namespace, batch, self.holder, ttl)
                )
                answers += zip(batch, results, strict=True)
        finally:
            # Claims without an answer (the store failed) wait for the next tick. One
            # that did land before the failure answers "taken" then, and its attempt is
            # recovered after its lease expires.
            answered = {(c.job, c.slot_us) for c, _ in answers}
            self._pending.extendleft(
                reversed([c for c in claims if (c.job, c.slot_us) not in answered])
            )
        if answers:  # a quarter or more taken by others: sift the queue before claiming
            taken = sum(1 for _, answer in answers if answer.status == "taken")
            self._contended = 4 * taken >= len(answers)
        # Start every won slot before anything that may fail: a claimed attempt that is
        # not started would hold its job's lease, and its slot, for nothing.
        for claim, answer in answers:
            if answer.status in ("claimed", "taken", "missed"):
                self._catching_up.discard((claim.job, claim.slot_us))
            if answer.run is not None:
                self._start(answer.run, sent)
        refused = [(claim, answer.status) for claim, answer in answers if answer.run is None]
        freed = False
        for index, (claim, status) in enumerate(refused):
            try:
                freed |= await self._not_claimed(claim, status)
            except StoreError:
                # Recording a skip failed: this slot and the ones not looked at yet are
                # claimed again next tick (the store answers for them again).
                self._pending.extendleft(reversed([c for c, _ in refused[index:]]))
                raise
        return freed and bool(self._pending)

    async def _refuse_blocked(self, blocked: list[SlotClaim]) -> None:
        """Slots of jobs whose abandoned run still runs here: a fresh slot is recorded
        ``skipped`` (a slot another replica already has keeps its row); a retry, a
        recovered attempt or a queued run comes back through the ledger later."""
        for index, claim in enumerate(blocked):
            if claim.trigger != "schedule" or claim.deadline_us is None:
                continue
            try:
                await self._skip(claim, ABANDONED_REASON)
            except StoreError:
                self._pending.extendleft(reversed(blocked[index:]))
                raise

    async def _not_claimed(self, claim: SlotClaim, status: str) -> bool:
        """Apply the policy to a claim the store refused with ``status``. Returns whether
        the slot is settled elsewhere (taken, or final), freeing its place in the batch."""
        if status == "taken":
            return True  # another replica has it, or it is final: exactly once, nothing to do
        if status == "missed":
            log.warning(
                "%s: slot %d missed: not started by its deadline (catchup = %s)",
                claim.job,
                claim.slot_us,
                self.specs[claim.job].catchup,
                extra={"action": "slot_missed", "job": claim.job, "slot_us": claim.slot_us},
            )
            return True
        if claim.trigger != "schedule":
            return False  # a trigger or backfill: the ledger's queued row brings it back
        job = self._jobs[claim.job]
        if (claim.job, claim.slot_us) in self._catching_up and status != "paused":
            self._pending.appendleft(claim)  # busy with the previous caught-up slot: wait
            return False
        if status == "not_due":
            self._pending.append(claim)  # not due by the store's clock yet: later
            return False
        if status == "paused":
            await self._skip(claim, "job paused")
            return False
        ns = self.options.namespace
        overlap = job.spec.overlap
        if overlap in ("buffer_one", "cancel_other"):
            if job.buffered is not None and job.buffered != claim.slot_us:
                await self._skip(
                    SlotClaim(job=claim.job, slot_us=min(job.buffered, claim.slot_us), run_id=""),
                    "superseded by a newer slot while the job was running",
                )
            job.buffered = max(claim.slot_us, job.buffered or 0)
            if overlap == "cancel_other":
                asked = await self.store.run(self.ops.run_cancel(ns, claim.job))
                log.info(
                    "%s: asked %d running attempt(s) to stop (overlap = cancel_other)",
                    claim.job,
                    asked,
                    extra={"action": "run_cancel_requested", "job": claim.job},
                )
            return False
        await self._skip(claim, "previous run still running (overlap = skip)")
        return False

    async def _skip(self, claim: SlotClaim, why: str) -> None:
        await self.store.run(
            self.ops.run_record(
                self.options.namespace, claim.job, claim.slot_us, "skipped", why, "schedule"
            )
        )
        log.info(
            "%s: slot %d skipped: %s",
            claim.job,
            claim.slot_us,
            why,
            extra={"action": "slot_skipped", "job": claim.job, "slot_us": claim.slot_us},
        )

    # -- running -------------------------------------------------------------------------
    def _start(self, record: RunRecord, sent_us: int) -> None:
        spec = self.specs[record.job]
        entry = _Running(spec=spec, record=record, cancellation=Cancellation(self.clock))
        self._running[(record.job, record.slot_us)] = entry
        entry.task = asyncio.create_task(
            self._run_one(entry, sent_us), name=f"fleetcron-run:{record.job}"
        )

    def _slot_lease(self, entry: _Running, sent_us: int) -> AsyncSlotLease:
        """The run's lease: renewed (keepalive = true), its loss stops the run."""
        spec, record = entry.spec, entry.record
        terms = LeaseTerms(
            namespace=self.options.namespace,
            name=spec.name,
            lock_at_most_us=spec.lock_at_most_us,
            lock_at_least_us=spec.lock_at_least_us,
            keepalive=spec.keepalive,
        )
        lease = AsyncSlotLease(
            self.store,
            terms,
            record,
            sent_us=sent_us,
            clock=self.clock,
            on_cancel=lambda: entry.cancellation.request("cancel requested"),
        )
        lease.on_lost(lambda _lease: entry.cancellation.request("lease lost"))
        if spec.keepalive:
            lease.start_keepalive()
        return lease

    def _stop_policy(self, spec: JobSpec, lease: AsyncSlotLease) -> StopPolicy:
        return StopPolicy(
            deadline=lambda: lease.deadline_us,
            deadline_reason="lease lost" if spec.keepalive else "lock_at_most elapsed",
            grace_us=effective_grace_us(
                round(self.options.kill_grace_s * 1e6), spec.lock_at_most_us
            ),
            clock=self.clock,
        )

    async def _run_one(self, entry: _Running, sent_us: int) -> None:
        spec, record = entry.spec, entry.record
        ns = self.options.namespace
        adapter = logging.LoggerAdapter(
            logging.getLogger(f"fleetcron.job.{spec.name}"),
            {"job": spec.name, "slot_us": record.slot_us, "fence": record.fence},
        )
        ctx = RunContext(
            job=spec.name,
            namespace=ns,
            slot_us=record.slot_us,
            fence=record.fence,
            attempt=record.attempt,
            run_id=record.run_id,
            trigger=record.trigger,
            logger=adapter,
        )
        log.info(
            "%s: run started (slot %d, attempt %d, fence %d)",
            spec.name,
            record.slot_us,
            record.attempt,
            record.fence,
            extra={"action": "run_started", "job": spec.name, "fence": record.fence},
        )
        lease = entry.lease = self._slot_lease(entry, sent_us)
        timer = None
        if spec.timeout_us is not None:
            timer = asyncio.get_running_loop().call_later(
                spec.timeout_us / 1e6, entry.cancellation.request, "timeout"
            )
        try:
            execution = await execute(
                spec,
                ctx,
                entry.cancellation,
                self._stop_policy(spec, lease),
                backend_url=self.options.backend_url,
                echo=self.options.echo,
            )
            outcome = execution.outcome
            if execution.abandoned is not None:
                self._abandon(spec.name, execution.abandoned)
        except Exception as exc:  # the executor itself failed: still record it
            outcome = RunOutcome(state="failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            if timer is not None:
                timer.cancel()
        try:
            await self._finish(entry, lease, outcome)
        except Exception:
            # Not a store outage (_finish logs those): a bug or an outcome the store cannot
            # take. The row stays running until its lease expires and is recovered.
            log.exception(
                "%s: recording the outcome failed",
                spec.name,
                extra={"action": "run_finish_failed", "job": spec.name},
            )
        finally:
            self._running.pop((record.job, record.slot_us), None)
            self._wake.set()

    def _abandon(self, job: str, work: asyncio.Future[object]) -> None:
        """A sync function did not return when its run was cancelled: it still runs in its
        thread. No other run of the job starts here until it returns."""
        log.error(
            "%s: the function did not return after its run was cancelled; it still runs "
            "in its thread, and no other run of %s starts on this replica until it returns "
            '(check ctx.cancelled, or set isolate = "process")',
            job,
            job,
            extra={"action": "run_abandoned", "job": job},
        )
        self._abandoned[job] = work

        def ended(_: asyncio.Future[object]) -> None:
            if self._abandoned.get(job) is work:
                del self._abandoned[job]
            log.warning(
                "%s: the abandoned run returned; the job runs again",
                job,
                extra={"action": "run_abandoned_ended", "job": job},
            )
            self._wake.set()

        work.add_done_callback(ended)

    async def _finish(self, entry: _Running, lease: AsyncSlotLease, outcome: RunOutcome) -> None:
        spec, record = entry.spec, entry.record
        retry = outcome.state == "failed" and record.attempt <= spec.retries
        if retry:
            outcome = RunOutcome(
                state=outcome.state,
                exit_code=outcome.exit_code,
                error=outcome.error,
                output=outcome.output,
                retry_after_us=spec.retry_backoff_us,
            )
        try:
            accepted = await lease.finish(outcome)
        except StoreError as exc:
            log.error(
                "%s: could not record the outcome: %s",
                spec.name,
                exc,
                extra={"action": "run_finish_failed", "job": spec.name},
            )
            return
        if not accepted:
            log.error(
                "%s: outcome %s refused: fence %d is no longer current (lease lost)",
                spec.name,
                outcome.state,
                record.fence,
                extra={"action": "run_rejected", "job": spec.name, "fence": record.fence},
            )
            return
        if retry:
            due = self._now() + spec.retry_backoff_us
            self._retries[(spec.name, record.slot_us)] = (due, record.attempt + 1)
        level = logging.INFO if outcome.state == "succeeded" else logging.WARNING
        log.log(
            level,
            "%s: run %s%s",
            spec.name,
            outcome.state,
            f" ({outcome.error})" if outcome.error else "",
            extra={
                "action": f"run_{outcome.state}",
                "job": spec.name,
                "fence": record.fence,
                "exit_code": outcome.exit_code,
            },
        )

    def _cancel_all(self, reason: str) -> None:
        for entry in self._running.values():
            entry.cancellation.request(reason)

    async def _wait_runs(self, timeout_s: float) -> None:
        tasks = [e.task for e in self._running.values() if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def _drain(self) -> None:
        if self._running:
            log.info(
                "stopping: waiting up to %.0fs for %d run(s)",
                self.options.shutdown_grace_s,
                len(self._running),
                extra={"action": "scheduler_draining"},
            )
            await self._wait_runs(self.options.shutdown_grace_s)
        if self._running:
            self._cancel_all("replica shutting down")
            await self._wait_runs(self.options.kill_grace_s + 2)
        for entry in list(self._running.values()):
            if entry.task is not None:
                entry.task.cancel()


async def _wait_any(events: Sequence[asyncio.Event], timeout_s: float) -> None:
    """Return when any of ``events`` is set, or after ``timeout_s``."""
    if any(event.is_set() for event in events):
        return
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _setter(event: asyncio.Event) -> Callable[[AsyncLease], None]:
    def set_event(_lease: AsyncLease) -> None:
        event.set()

    return set_event


async def _first_of(target: asyncio.Event, *events: asyncio.Event) -> None:
    """Set ``target`` as soon as any of ``events`` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        target.set()


def _deadline(spec: JobSpec, slot: int) -> int:
    """The store time by which a slot's first attempt must start, else it is recorded as
    ``missed`` at claim time: a replica that fell behind sheds stale slots under the
    job's catch-up policy instead of running them late. ``skip``: while the slot is on
    time; ``all``: within the catch-up window; ``latest``: until the next slot fires (a
    newer slot supersedes it), within the window."""
    on_time = slot + _LATE_TOLERANCE_US + spec.jitter_us
    if spec.catchup == "skip":
        return on_time
    window = slot + spec.catchup_window_us
    if spec.catchup == "latest":
        following = spec.schedule.next_after(slot)
        if following is not None:
            fires = following + jitter_us(spec.name, following, spec.jitter_us)
            # An on-time slot runs whatever the window (a window shorter than the
            # tolerance must not shed it), until the next slot supersedes it.
            return min(max(window, on_time), fires)
    return max(on_time, window)
