"""The scheduler: turns schedules into claimed slots and runs them.

Every replica runs the same loop (claim mode): compute the slots that are due by the
*store's* clock (estimated locally, enforced by the store), claim them in one round trip
— no more than this replica has room to run — and run what it won. A slot another replica
won is left alone; a slot refused because the job is still running follows the job's
``overlap`` policy; slots missed while every replica was down follow ``catchup``. In
leader mode only the holder of the leader lease runs the loop.

This module is the loop and the claims; the rooms it ties together are in
:mod:`fleetcron.scheduling`: planning (the due heap, catch-up), recovery (runs to claim
again), supervision (running an attempt under its slot lease), leadership (the elector)
and definitions (which definition of a job governs when replicas disagree).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from fleetcron._log import log
from fleetcron.alerts import AlertSender
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.errors import StoreError, StoreReplaced
from fleetcron.jobspec import JobSpec
from fleetcron.lease import new_holder
from fleetcron.metrics import InstrumentedStore, Metrics
from fleetcron.models import (
    ClaimResult,
    DefinitionConflict,
    JobRecord,
    RunRecord,
    SlotClaim,
)
from fleetcron.scheduling.claiming import (
    RECORD_BATCH,
    pick_batch,
    record_missed,
    send_claims,
    sift,
)
from fleetcron.scheduling.definitions import Definitions
from fleetcron.scheduling.handover import Handover
from fleetcron.scheduling.heartbeat import (
    Heartbeat,
    jobs_fingerprint,
    replica_info,
)
from fleetcron.scheduling.leadership import LEADER_LEASE, Elector, follow_leader
from fleetcron.scheduling.monitor import DEFAULT_MONITOR_S, Monitor
from fleetcron.scheduling.options import SchedulerOptions
from fleetcron.scheduling.outage import StoreOutage, first_of, wait_any
from fleetcron.scheduling.overlap import OverlapPolicy
from fleetcron.scheduling.ownership import Ring
from fleetcron.scheduling.planning import MISSED_RECORD_LIMIT as _MISSED_RECORD_LIMIT
from fleetcron.scheduling.planning import (
    DueHeap,
    Plan,
    PlannedJob,
    claim_for,
    plan_slots,
)
from fleetcron.scheduling.queues import QueueSpec, QueueWorkers
from fleetcron.scheduling.recovery import RECOVERY_EVERY_S, Recovery
from fleetcron.scheduling.registration import first_cursor, register
from fleetcron.scheduling.reload import Reload
from fleetcron.scheduling.replacement import ReplacedWatch
from fleetcron.scheduling.store_clock import StoreClock
from fleetcron.scheduling.supervision import ABANDONED_REASON, Supervisor, SupervisorOptions
from fleetcron.stores.base import AsyncStore

__all__ = [
    "ABANDONED_REASON",
    "LEADER_LEASE",
    "AsyncScheduler",
    "DefinitionConflict",
    "Reload",
    "SchedulerOptions",
    "StoreOutage",
]

_COLLECT_LATER_US = 100_000  # slots other replicas own are collected at most this often


@dataclass
class _Signals:
    """Events tests (and embedders) can wait on instead of sleeping."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    leader: asyncio.Event = field(default_factory=asyncio.Event)
    ticked: asyncio.Condition = field(default_factory=asyncio.Condition)


class AsyncScheduler:
    """One replica's scheduler over an :class:`~fleetcron.stores.base.AsyncStore`."""

    def __init__(
        self,
        store: AsyncStore,
        jobs: Sequence[JobSpec],
        options: SchedulerOptions,
        *,
        clock: Clock = SYSTEM_CLOCK,
        metrics: Metrics | None = None,
        queues: Sequence[QueueSpec] = (),
    ) -> None:
        self.metrics = metrics
        if metrics is not None:
            store = InstrumentedStore(store, metrics)
            for spec in jobs:
                metrics.job_defined(spec.name, spec.lock_at_most_us)
        # Every part of the replica calls the store through it: a store replaced under
        # the replica stops the whole replica, whichever part meets it first.
        self._replacement = ReplacedWatch(store, on_replaced=self.stop)
        store = self._replacement
        self.store = store
        self.ops = store.ops
        self.specs = {spec.name: spec for spec in jobs}
        self.options = options
        self.clock = clock
        self.holder = new_holder()
        self.signals = _Signals()
        self._jobs: dict[str, PlannedJob] = {}
        self._pending: deque[SlotClaim] = deque()
        self._due = DueHeap(delay=lambda job, slot: self.handover.collect_delay_us(job, slot))
        self._later_at_us = 0  # the next collection of slots other replicas own
        self._catching_up: set[tuple[str, int]] = set()
        self._after_outage = False  # the pass under way is the first after an outage
        self.store_clock = StoreClock(store, clock, metrics)
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # a run finished: waiting slots may be claimable now
        self._reloading = asyncio.Lock()  # a reload never lands in the middle of a pass
        self.outage = StoreOutage()
        self.definitions = Definitions({spec.name: spec.fingerprint() for spec in jobs})
        self.recovery = Recovery(store, options.namespace, self.specs)
        self.supervisor = Supervisor(
            store,
            self.specs,
            SupervisorOptions(
                namespace=options.namespace,
                kill_grace_s=options.kill_grace_s,
                shutdown_grace_s=options.shutdown_grace_s,
                backend_url=options.backend_url,
                echo=options.echo,
            ),
            clock=clock,
            recovery=self.recovery,
            store_now=self._now,
            on_done=self._wake.set,
            metrics=metrics,
        )
        self.elector = Elector(
            store,
            namespace=options.namespace,
            holder=self.holder,
            ttl_us=options.leader_ttl_us,
            clock=clock,
        )
        self.overlap = OverlapPolicy(
            store,
            options.namespace,
            self.specs,
            self._jobs,
            pending=self._pending,
            catching_up=self._catching_up,
            conflicts=self.definitions.conflicts,
            now=self._now,
            metrics=metrics,
        )
        self._last_recovery = 0.0
        self._contended = False  # the last claims found slots other replicas had taken
        self.heartbeat = Heartbeat(
            store,
            options.namespace,
            replica_info(options.mode, self.definitions.local),
            every_s=options.heartbeat_s,
        )
        self.handover = Handover(
            store,
            options.namespace,
            Ring(self.heartbeat.info.replica_id, self.heartbeat.info.jobs_fingerprint),
            claiming=options.mode == "claim",
            ring_every_s=options.heartbeat_s,
            clock=clock,
        )
        # The webhooks of the monitor's alerts: a job's own, else the file's global one.
        self.alerts = AlertSender(
            self.supervisor.pings,
            options.namespace,
            lambda: self.heartbeat.info.replica_id,
            self.specs,
            options.alert_webhook,
        )
        self.queue_workers = QueueWorkers(
            store,
            options.namespace,
            queues,
            observe=metrics.queue_handled if metrics is not None else None,
            on_stats=metrics.queue_stats if metrics is not None else None,
        )
        self.monitor = Monitor(
            store,
            options.namespace,
            self.holder,
            every_s=options.monitor_s or DEFAULT_MONITOR_S,
            on_status=metrics.watched if metrics is not None else None,
            on_alert=self.alerts,
            specs=self.specs,
            retention_s=options.retention_s,
            clock=clock,
        )

    # -- public control ----------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_grace_s`` to finish."""
        self._stop.set()

    @property
    def replica_id(self) -> str:
        """This replica's id in the replica table (``host:pid:<random>``)."""
        return self.heartbeat.info.replica_id

    @property
    def running(self) -> list[RunRecord]:
        """Attempts in flight on this replica."""
        # One C-level copy of the values: safe while the loop's thread changes the dict.
        return [entry.record for entry in list(self.supervisor.running.values())]

    @property
    def conflicts(self) -> Mapping[str, DefinitionConflict]:
        """The jobs this replica does not run because the store holds another definition of
        them — registered by a replica that started later, which governs — by name;
        ``other_fingerprint`` is the stored one. A job leaves once the definitions agree
        again. Learnt from the claims' answers, so a job shows here from its first slot
        claimed after the other definition was registered."""
        return dict(self.definitions.conflicts)  # a copy: safe from another thread

    @property
    def replaced(self) -> Mapping[str, DefinitionConflict]:
        """The other definitions this replica replaced in the store when it registered its
        own, by job name; ``other_fingerprint`` is the replaced one. This replica's
        definition governs: it runs those jobs, and a replica still defining one of them
        the other way does not (that replica lists it in its :attr:`conflicts`)."""
        return dict(self.definitions.replaced)

    async def run(self) -> None:
        """Run until :meth:`stop`; then drain and return.

        Raises :class:`~fleetcron.errors.StoreReplaced` when the store turned out to be
        replaced under the replica (a SQLite file deleted or replaced): the replica has
        stopped claiming at once and drained its runs in flight, as on :meth:`stop`."""
        await self._register()
        await self.heartbeat.beat()  # up in the replica table by the time it has started
        if self.options.mode == "claim":
            await self.heartbeat.announce()  # the others read the table again
        self.heartbeat.start()
        if self.options.monitor_s > 0:
            self.monitor.start()
        self.queue_workers.start()
        self.signals.started.set()
        try:
            if self.options.mode == "leader":
                await self._lead()
            else:
                await self._loop(self._stop)
        finally:
            try:
                try:
                    await self.monitor.stop()
                finally:
                    # Whatever stopped the monitor, the runs in flight and the batches in
                    # hand get their grace, side by side.
                    await asyncio.gather(
                        self.supervisor.drain(),
                        self.queue_workers.stop(self.options.shutdown_grace_s),
                    )
            finally:
                await self.heartbeat.leave()
        if self._replacement.error is not None:
            raise StoreReplaced(self._replacement.error.message)

    async def reload(self, jobs: Sequence[JobSpec]) -> Reload:
        """Take a new set of job definitions while running (``fleetcron run`` on SIGHUP).

        Added jobs are registered and planned; changed ones are registered again (their
        progress is the store's, so no slot runs twice) and planned with the new
        definition; removed ones are no longer claimed — their runs in progress finish.
        Applied between two scheduling passes; the store errors of the registration
        propagate, leaving the previous set in place for the jobs not yet registered."""
        new = {spec.name: spec for spec in jobs}
        fingerprints = {name: spec.fingerprint() for name, spec in new.items()}
        local = self.definitions.local
        async with self._reloading:
            # Under the lock: a second reload compares with what the first one applied.
            change = Reload.between(self.specs, local, fingerprints)
            for name in change.removed:
                del self.specs[name]
                self._jobs.pop(name, None)
                local.pop(name, None)
                self.definitions.conflicts.pop(name, None)
                self.definitions.replaced.pop(name, None)
            kept = [c for c in self._pending if c.job in new]
            self._pending.clear()
            self._pending.extend(kept)
            self.overlap.forget(lambda job: job in new)
            self.handover.forget(lambda job: job in new)
            fresh = [new[name] for name in (*change.added, *change.changed)]
            for spec in fresh:
                self.specs[spec.name] = spec
                local[spec.name] = fingerprints[spec.name]
                if self.metrics is not None:
                    self.metrics.job_defined(spec.name, spec.lock_at_most_us)
            if fresh:
                await self._register(fresh)
            self.heartbeat.info = replace(
                self.heartbeat.info, jobs_fingerprint=jobs_fingerprint(local)
            )
            # Its peers are now the replicas running the new set.
            self.handover.replace_ring(
                Ring(self.handover.ring.me, self.heartbeat.info.jobs_fingerprint)
            )
        change.log()
        return change

    # -- set-up --------------------------------------------------------------------------
    def _now(self) -> int:
        """The store's clock estimated between readings (:class:`StoreClock`)."""
        return self.store_clock.now()

    async def _register(self, specs: list[JobSpec] | None = None) -> None:
        """Write this replica's definitions (all, or ``specs``) and plan each job."""
        await register(
            self.store,
            self.options.namespace,
            list(self.specs.values()) if specs is None else specs,
            self.definitions.local,
            store_now=await self.store_clock.read(),
            planned=self._add_job,
        )

    def _add_job(self, spec: JobSpec, before: JobRecord | None, store_now: int) -> None:
        # The row as it was: another definition is reported, and this one now governs.
        self.definitions.registered(spec.name, before, store_now)
        high_water = before.high_water_us if before is not None else None
        cursor = first_cursor(spec, high_water, store_now)
        self._jobs[spec.name] = PlannedJob(
            spec=spec, cursor_us=cursor, resumed=high_water is not None
        )
        self._due.push(self._jobs[spec.name])

    # -- leader mode -----------------------------------------------------------------------
    async def _lead(self) -> None:
        while not self._stop.is_set():
            term = await self.elector.campaign()
            if term is None:
                await follow_leader(
                    self.store, self.options.namespace, self._jobs, self.definitions
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.options.leader_ttl_us / 3e6)
                continue
            self.signals.leader.set()
            if self.metrics is not None:
                self.metrics.leader.set(1)
            until = asyncio.Event()
            watcher = asyncio.create_task(first_of(until, self._stop, term.lost))
            try:
                await self._loop(until)
                if term.is_lost:
                    self.supervisor.cancel_all("leader lease lost")
                    await self.supervisor.wait_runs(self.options.kill_grace_s + 1)
            finally:
                watcher.cancel()
                self.signals.leader.clear()
                if self.metrics is not None:
                    self.metrics.leader.set(0)
                await self.elector.resign(term)

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self, until: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not until.is_set() and not self._stop.is_set():
            try:
                async with self._reloading:
                    await self._tick(loop.time())
                self.outage.ended(loop.time())
            except StoreReplaced:
                pass  # not an outage: said once by the watch, which stopped the loop
            except StoreError as exc:
                self.outage.failed(exc, loop.time())
                self.store_clock.doubt()  # the first pass after an outage reads the clock
            except Exception:
                # A bug must not stop the replica silently or at once: say so, go on.
                log.exception("scheduling pass failed", extra={"action": "tick_failed"})
            if self.metrics is not None:
                self.metrics.store_up.set(0 if self.outage.active else 1)
                self.metrics.store_down_seconds.set(self.outage.lasted_s(loop.time()))
            async with self.signals.ticked:
                self.signals.ticked.notify_all()
            if self.outage.active:
                # Back off while the store is down: a finished run must not wake the loop
                # into another failing pass.
                await wait_any((until,), self.outage.delay_s())
            else:
                await wait_any((until, self._wake), self._sleep_s())
            self._wake.clear()

    def _sleep_s(self) -> float:
        now = self._now()
        soonest = now + round(self.options.tick_s * 1e6)
        due = self._due.soonest()
        if due is not None:
            soonest = min(soonest, due)
        later = self._due.soonest_later()
        if later is not None:
            soonest = min(soonest, max(later, self._later_at_us))
        look = self.handover.next_look_us()
        if look is not None and self._may_adopt():
            soonest = min(soonest, look)
        retry = self.overlap.next_retry_us()
        if retry is not None:
            soonest = min(soonest, retry)
        # A few random milliseconds past the slot: replicas wake in a different order each
        # time, so the runs of a single job spread over them instead of going to one.
        spread = random.uniform(0.002, 0.03)
        return max(0.005, (soonest - now) / 1e6 + spread)

    async def _tick(self, loop_time: float) -> None:
        # Due, late and missed are judged by the store's clock read now — never by this
        # host's clock, which may be wrong (a replica whose clock ran ahead must not record
        # future slots as missed or skipped for the whole fleet).
        now = await self.store_clock.for_pass()
        self._after_outage = self.outage.active
        if self.outage.active:
            # The store answers again: the outcomes waiting for a try go before any claim.
            self.supervisor.store_answered()
            self.overlap.store_back(now)
        # A job can be in the heap twice after a reload changed it, or no longer planned
        # after one removed it: each planned job is collected once.
        names = dict.fromkeys(self._due.pop_due(now))
        later: set[str] = set()
        if now >= self._later_at_us:
            # The jobs whose next slot another replica owns, collected together at most
            # every _COLLECT_LATER_US, once their hand-over delay has passed.
            later.update(self._due.pop_later(now))
            if later:
                self._later_at_us = now + _COLLECT_LATER_US
            names.update(dict.fromkeys(later))
        due = [self._jobs[name] for name in names if name in self._jobs]
        # Every replica collects the same slots at the same moment: each one queues the
        # jobs in its own random order (a job's slots stay in order), so their first
        # claims land on different jobs instead of all queueing on the same job leases.
        random.shuffle(due)
        if await self.handover.read_ring():
            # The members changed: the slots of those that left have new owners and
            # backups, and nobody else looks at a slot.
            self.handover.look_again(now)
        try:
            # Planned in groups of about RECORD_BATCH missed slots: after a long outage a
            # group's plans, not every job's, are held at once, and each group's missed
            # slots are recorded in one round trip before its jobs move on.
            group: list[tuple[PlannedJob, Plan]] = []
            noted = 0
            for job in due:
                plan = plan_slots(job, now)
                group.append((job, plan))
                noted += min(len(plan.missed), _MISSED_RECORD_LIMIT)
                if noted >= RECORD_BATCH:
                    await self._take(group, now, later)
                    group, noted = [], 0
            await self._take(group, now, later)
        finally:
            # Every popped job goes back in the heap, collected or not (a store error
            # leaves its cursor where it was: the next tick collects it again).
            for job in due:
                self._due.push(job)
        self._pending.extend(self.recovery.due_retries(now))
        if loop_time - self._last_recovery >= RECOVERY_EVERY_S:
            self._last_recovery = loop_time
            known = {(c.job, c.slot_us) for c in self._pending}
            known.update(self.supervisor.running)
            self._pending.extend(await self.recovery.poll(known))
        await self._adopt(now)
        self.overlap.requeue_due(now)
        await self._claim()

    async def _take(
        self, plans: Sequence[tuple[PlannedJob, Plan]], now: int, later: set[str]
    ) -> None:
        """Record the missed slots of ``plans``, then queue their slots: this replica's to
        claim, another replica's to look at after its hand-over delay (at once for the
        ``later`` jobs, collected after that delay already)."""
        await record_missed(
            self.store,
            self.options.namespace,
            plans,
            conflicts=self.definitions.conflicts,
            metrics=self.metrics,
            after_outage=self._after_outage,
        )
        for job, plan in plans:
            spec = job.spec
            local = self.definitions.local.get(spec.name)
            for slot in self._collect(job, plan):
                shared, slot_deadline = self.handover.slot_facts(job, slot)
                if shared:
                    ripe = spec.name in later
                    if not self.handover.wait_for_owner(
                        spec.name, slot, slot_deadline, now, ripe=ripe
                    ):
                        # Parked: never claimed here unless the members change.
                        self._catching_up.discard((spec.name, slot))
                else:
                    # Signed now, as it is sent unless the definition changes meanwhile.
                    self._pending.append(
                        claim_for(
                            spec,
                            slot,
                            "schedule",
                            deadline_us=slot_deadline,
                            fingerprint=local,
                        )
                    )

    def _shared(self, job: str, slot_us: int) -> bool:
        """Whether the slot is one another replica owns (claim mode only)."""
        return self.handover.shared(job, slot_us)

    def _may_adopt(self) -> bool:
        """Whether this replica has room and none of its own slots waiting."""
        return not self._pending and len(self.supervisor.running) < self.options.concurrency

    async def _adopt(self, now: int) -> None:
        """Take on the slots of other replicas still free after their hand-over delay
        (:meth:`Handover.adopt <fleetcron.scheduling.handover.Handover.adopt>`); only a
        replica with room and none of its own slots waiting adopts."""
        if not self._may_adopt():
            return
        free, settled = await self.handover.adopt(now, self._jobs)
        self._catching_up -= settled
        self._pending.extend(free)

    def _collect(self, job: PlannedJob, plan: Plan) -> list[int]:
        """The job's slots to claim by ``plan``, its cursor moved past them (called once
        the plan's missed slots are recorded: a store error retries the lot)."""
        if not plan.ready:
            return []
        job.cursor_us = plan.ready[-1]
        job.resumed = False
        # Caught-up slots run one after another, not "skipped while the previous runs";
        # so do the slots that come due while such a backlog is worked through.
        draining = job.draining
        if draining is not None and plan.ready[-1] - draining > job.spec.catchup_window_us:
            # A replica that never claims the job's slots hears of no later claim: the
            # backlog is over by now all the same.
            job.draining = None
        joining = plan.caught_up or (plan.take if job.draining is not None else [])
        if plan.caught_up:
            job.draining = plan.caught_up[-1]
        self._catching_up.update((job.spec.name, slot) for slot in joining)
        return plan.take

    async def _claim(self) -> None:
        # A claim refused because another replica already has the slot frees its place in
        # the batch for the job's next waiting slot: go round until nothing moves.
        for _ in range(20):
            if not await self._claim_batch():
                return

    async def _claim_batch(self) -> bool:
        """Claim one batch; whether some slot turned out taken elsewhere."""
        room = self.options.concurrency - len(self.supervisor.running)
        if room <= 0 or not (self._pending or self.overlap.buffered):
            return False
        if self._contended and self._pending:
            await sift(self.store, self.options.namespace, self._pending, room, self._catching_up)
        # A job whose last run has ended but whose outcome is not recorded yet is still
        # running in the store: its next exclusive slot waits for that outcome (sent first,
        # then the run's end wakes the loop) instead of being refused and skipped.
        finishing = self.supervisor.finishing
        await self.overlap.supersede_buffered()
        claims, blocked = self.overlap.take_buffered(
            room, finishing=finishing, abandoned=self.supervisor.abandoned
        )
        pick_batch(
            self._pending,
            claims,
            blocked,
            room,
            abandoned=self.supervisor.abandoned,
            finishing=finishing,
        )
        await self.overlap.refuse_blocked(blocked, ABANDONED_REASON)
        ttl_by_job = {c.job: self.specs[c.job].lock_at_most_us for c in claims}
        answers: list[tuple[SlotClaim, ClaimResult]] = []
        sent = self.clock.monotonic_us()
        try:
            await send_claims(
                self.store,
                self.options.namespace,
                self.holder,
                claims,
                ttl_by_job=ttl_by_job,
                fingerprints=self.definitions.local,
                answers=answers,
                metrics=self.metrics,
            )
        finally:
            # Claims without an answer (the store failed) wait for the next tick. One
            # that did land before the failure answers "taken" then, and its attempt is
            # recovered after its lease expires.
            answered = {(c.job, c.slot_us) for c, _ in answers}
            self._pending.extendleft(
                reversed([c for c in claims if (c.job, c.slot_us) not in answered])
            )
        self.store_clock.learn(answers, sent, self.clock.monotonic_us())
        if any(
            answer.status == "taken"
            and claim.deadline_us is not None
            and not self._shared(claim.job, claim.slot_us)
            for claim, answer in answers
        ):
            self.handover.stale = True  # another replica thinks this slot its own
        if answers:  # a quarter or more taken by others: sift the queue before claiming
            taken = sum(1 for _, answer in answers if answer.status == "taken")
            self._contended = 4 * taken >= len(answers)
        store_now = self._now()
        for _, answer in answers:
            self.definitions.answered(answer, store_now)
        # Start every won slot before anything that may fail: a claimed attempt that is
        # not started would hold its job's lease, and its slot, for nothing.
        for claim, answer in answers:
            if answer.status in ("claimed", "taken", "missed", "conflict"):
                self._catching_up.discard((claim.job, claim.slot_us))
                job = self._jobs.get(claim.job)
                if job is not None and job.draining is not None and claim.slot_us > job.draining:
                    # A slot after the backlog got the job's lease: the backlog is done.
                    job.draining = None
            self.overlap.answered(claim, answer.status)
            if answer.run is not None:
                self.supervisor.start(answer.run, sent)
        refused = [(claim, answer.status) for claim, answer in answers if answer.run is None]
        freed = False
        try:
            for index, (claim, status) in enumerate(refused):
                try:
                    freed |= await self.overlap.refused(claim, status)
                except StoreError:
                    # Recording a skip failed: this slot and the ones not looked at yet
                    # are claimed again next tick (the store answers for them again).
                    self._pending.extendleft(reversed([c for c, _ in refused[index:]]))
                    raise
        finally:
            self.overlap.say_missed()
        return freed and bool(self._pending)
