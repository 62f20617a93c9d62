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
import itertools
import json
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from fleetcron._log import log
from fleetcron.alerts import AlertSender
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.errors import ConfigurationError, StoreError, StoreReplaced
from fleetcron.jobspec import JobSpec
from fleetcron.keepalive import backoff_s
from fleetcron.lease import new_holder
from fleetcron.metrics import InstrumentedStore, Metrics
from fleetcron.models import (
    ClaimResult,
    DefinitionConflict,
    JobRecord,
    RunNote,
    RunRecord,
    SlotClaim,
)
from fleetcron.pings import check_ping_url
from fleetcron.schedules import AtSchedule, iso_utc
from fleetcron.scheduling.definitions import Definitions
from fleetcron.scheduling.heartbeat import (
    DEFAULT_HEARTBEAT_S,
    Heartbeat,
    jobs_fingerprint,
    replica_info,
)
from fleetcron.scheduling.leadership import LEADER_LEASE, Elector
from fleetcron.scheduling.monitor import DEFAULT_MONITOR_S, Monitor
from fleetcron.scheduling.ownership import HANDOVER_US, Ring
from fleetcron.scheduling.planning import MISSED_RECORD_LIMIT as _MISSED_RECORD_LIMIT
from fleetcron.scheduling.planning import (
    DueHeap,
    Plan,
    PlannedJob,
    claim_for,
    deadline,
    plan_slots,
)
from fleetcron.scheduling.queues import QueueSpec, QueueWorkers
from fleetcron.scheduling.recovery import RECOVERY_EVERY_S, Recovery
from fleetcron.scheduling.replacement import ReplacedWatch
from fleetcron.scheduling.retention import DEFAULT_RETENTION_S
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

_REGISTER_BATCH = 500  # job definitions per registration round trip
_RECORD_BATCH = 1000  # missed slots recorded per round trip
_SIFT_AT_LEAST = 512  # waiting slots looked at per sift, whatever the room
_ADOPT_EVERY_US = (250_000, 1_000_000)  # how often others' waiting slots are looked at
_ADOPT_BATCH = 2000  # others' slots looked at per read
_COLLECT_LATER_US = 100_000  # slots other replicas own are collected at most this often
_RING_RESYNC_US = 1_000_000  # the ring is read again at most this often when it is stale
_CLOCK_RESYNC_US = 1_000_000  # the store's clock is read again at most this often
# A claim's answer whose store time is further than this from the estimate (beyond the
# round trip) makes the next pass read the store's clock again.
_CLOCK_TOLERANCE_US = 20_000
BUSY_GRACE_US = 1_000_000
"""Right after a store outage (within :data:`AFTER_OUTAGE_US` of this replica finding the
store back), how long a slot refused because its job's previous attempt still holds the
lease is asked again before it is skipped (``overlap = "skip"``). The outage held the
outcomes of runs that ended during it, on every replica; each replica sends them within
half a second of the store answering it, and a slot skipped behind a run that is over is
a slot lost. Outside that window a busy slot is skipped at once, as the policy says."""
AFTER_OUTAGE_US = 5_000_000
_BUSY_RETRY_US = 150_000  # how often such a slot is asked again during its grace


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """How one replica runs. ``concurrency`` caps the runs in flight on this replica;
    ``heartbeat_s`` is how often it records its heartbeat (docs/design/replicas.md);
    ``monitor_s`` how often the replica that watches the namespace's jobs reads their
    health (:mod:`fleetcron.scheduling.monitor`; 0 turns watching off on this replica);
    ``retention_s`` how often, while it watches, it deletes its jobs' runs past their
    retention (:mod:`fleetcron.scheduling.retention`; 0: never from this replica)."""

    namespace: str
    mode: str = "claim"
    concurrency: int = 16
    tick_s: float = 1.0
    shutdown_grace_s: float = 30.0
    kill_grace_s: float = 5.0
    leader_ttl_us: int = 15_000_000
    echo: bool = True
    backend_url: str | None = None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    monitor_s: float = DEFAULT_MONITOR_S
    retention_s: float = DEFAULT_RETENTION_S
    alert_webhook: str | None = None

    def __post_init__(self) -> None:
        """Every problem is a :class:`ConfigurationError` naming the option."""
        if self.mode not in ("claim", "leader"):
            raise ConfigurationError(f"mode must be claim or leader, not {self.mode!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise ConfigurationError(f"concurrency must be an integer, got {self.concurrency!r}")
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        # (name, value, whether 0 is allowed): 0 turns the monitor or retention off.
        for name, zero_ok in (
            ("tick_s", False),
            ("shutdown_grace_s", True),
            ("kill_grace_s", True),
            ("heartbeat_s", False),
            ("monitor_s", True),
            ("retention_s", True),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number of seconds, not {value!r}")
            if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
                wanted = "must not be negative" if zero_ok else "must be positive"
                raise ConfigurationError(f"{name} {wanted}, not {value!r}")
        if self.alert_webhook is not None:
            check_ping_url(self.alert_webhook)


@dataclass(frozen=True, slots=True)
class _SlotFacts:
    """What a pass needs of one slot of a job, worked out under one definition of the job
    (``spec``) and one version of the ring."""

    spec: JobSpec
    slot_us: int
    ring_version: int
    shared: bool
    deadline_us: int


@dataclass(frozen=True, slots=True)
class Reload:
    """What :meth:`AsyncScheduler.reload` changed, by job name."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]


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
        self._buffered: set[str] = set()  # jobs with a slot waiting for their running attempt
        self._due = DueHeap(delay=self._collect_delay)
        self._later_at_us = 0  # the next collection of slots other replicas own
        self._catching_up: set[tuple[str, int]] = set()
        # Slots refused ``busy`` and asked again during their grace: when first refused
        # (store time), and when the next such claim is due.
        self._busy_since: dict[tuple[str, int], int] = {}
        self._busy_wait: list[SlotClaim] = []
        self._busy_retry_at_us: int | None = None
        self._store_back_us: int | None = None  # store time this replica found it back
        self._offset_us = 0
        self._synced_us: int | None = None  # monotonic µs of the last clock reading
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
        self._last_recovery = 0.0
        self._contended = False  # the last claims found slots other replicas had taken
        # Other replicas' slots waiting for a look: (look at, job, slot, deadline; the
        # store's clock). No
        # claim is made for them (a run id each) unless one is adopted.
        self._foreign: deque[tuple[int, str, int, int | None]] = deque()
        self._adopt_every_us = _ADOPT_EVERY_US[0]
        self._adopt_at_us = 0
        self._adopt_cap_us = _ADOPT_EVERY_US[1]  # spacing cap: half the shortest window
        self._ring_read_us: int | None = None  # monotonic µs of the last ring reading
        self._ring_stale = True
        self.heartbeat = Heartbeat(
            store,
            options.namespace,
            replica_info(options.mode, self.definitions.local),
            every_s=options.heartbeat_s,
        )
        self.ring = Ring(self.heartbeat.info.replica_id, self.heartbeat.info.jobs_fingerprint)
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
            change = Reload(
                added=tuple(sorted(set(new) - set(self.specs))),
                changed=tuple(
                    sorted(n for n in new if n in self.specs and fingerprints[n] != local[n])
                ),
                removed=tuple(sorted(set(self.specs) - set(new))),
            )
            for name in change.removed:
                del self.specs[name]
                self._jobs.pop(name, None)
                local.pop(name, None)
                self.definitions.conflicts.pop(name, None)
                self.definitions.replaced.pop(name, None)
            self._pending = deque(c for c in self._pending if c.job in new)
            self._busy_wait = [c for c in self._busy_wait if c.job in new]
            self._busy_since = {k: v for k, v in self._busy_since.items() if k[0] in new}
            self._foreign = deque(f for f in self._foreign if f[1] in new)
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
            self.ring = Ring(self.ring.me, self.heartbeat.info.jobs_fingerprint)
            self._ring_stale = True
        log.warning(
            "jobs reloaded: %d added, %d changed, %d removed",
            len(change.added),
            len(change.changed),
            len(change.removed),
            extra={
                "action": "jobs_reloaded",
                "added": ",".join(change.added),
                "changed": ",".join(change.changed),
                "removed": ",".join(change.removed),
            },
        )
        return change

    # -- set-up --------------------------------------------------------------------------
    async def _sync_clock(self) -> int:
        """Read the store's clock; every decision of a tick is made on that reading."""
        sent = self.clock.monotonic_us()
        store_now = await self.store.run(self.ops.store_now())
        received = self.clock.monotonic_us()
        self._offset_us = store_now - (sent + received) // 2
        self._synced_us = received
        if self.metrics is not None:
            self.metrics.clock_offset.set((store_now - self.clock.wall_us()) / 1e6)
        return store_now

    async def _store_clock(self) -> int:
        """The store's now for a pass: read from the store at most once a
        :data:`_CLOCK_RESYNC_US`, estimated from the last reading in between. The store
        enforces every time rule itself (a claim before its slot is refused ``not_due``,
        one past its deadline ``missed``); the estimate only decides what to ask for, and a
        claim's answer that disagrees with it (:meth:`_check_estimate`) forces a reading."""
        synced = self._synced_us
        if synced is None or self.clock.monotonic_us() - synced >= _CLOCK_RESYNC_US:
            return await self._sync_clock()
        return self._now()

    def _check_estimate(self, store_now_us: int, sent_us: int, received_us: int) -> None:
        """A store time seen during the round trip ``sent_us``..``received_us`` (monotonic):
        outside the estimate by more than :data:`_CLOCK_TOLERANCE_US`, the next pass reads
        the clock (a stepped store clock, a suspended host)."""
        low = sent_us + self._offset_us - _CLOCK_TOLERANCE_US
        high = received_us + self._offset_us + _CLOCK_TOLERANCE_US
        if not low <= store_now_us <= high:
            self._synced_us = None

    def _now(self) -> int:
        """The store's clock estimated between readings, for timing sleeps only. It rides
        the monotonic clock, so a step of this host's wall clock cannot move it."""
        return self.clock.monotonic_us() + self._offset_us

    async def _register(self, specs: list[JobSpec] | None = None) -> None:
        ns = self.options.namespace
        store_now = await self._sync_clock()
        specs = list(self.specs.values()) if specs is None else specs
        # Each replica registers in its own order, in batches (one round trip each), so
        # replicas starting together do not queue on the same job rows.
        random.shuffle(specs)
        fingerprints = self.definitions.local
        many = len(specs) > _REGISTER_BATCH
        if many:
            # Many jobs: one read of what the store holds, and only the definitions it does
            # not hold are written (a restart, or the twentieth replica of a fleet, writes
            # nothing). The jobs whose definition is already stored are planned from it.
            specs = await self._unheld(specs, store_now)
        while specs:
            chunk, specs = specs[:_REGISTER_BATCH], specs[_REGISTER_BATCH:]
            befores = await self.store.run(
                self.ops.job_register(
                    ns,
                    [
                        (
                            spec.name,
                            json.dumps(spec.definition(), sort_keys=True),
                            fingerprints[spec.name],
                        )
                        for spec in chunk
                    ],
                )
            )
            for spec, before in zip(chunk, befores, strict=True):
                self._add_job(spec, before, store_now)
            written = sum(
                1
                for spec, before in zip(chunk, befores, strict=True)
                if before is not None and before.fingerprint == fingerprints[spec.name]
            )
            if many and specs and 4 * written >= len(chunk):
                # Other replicas are registering the same definitions right now (a fleet
                # starting together): read again what they wrote rather than queue on
                # their rows to write it once more.
                specs = await self._unheld(specs, store_now)

    async def _unheld(self, specs: list[JobSpec], store_now: int) -> list[JobSpec]:
        """Of ``specs``, the ones whose definition the store does not hold (one read); the
        others are planned from their stored row."""
        rows = await self.store.run(self.ops.job_list(self.options.namespace))
        stored = {row.job: row for row in rows}
        fingerprints = self.definitions.local
        unheld = []
        for spec in specs:
            row = stored.get(spec.name)
            if row is not None and row.fingerprint == fingerprints[spec.name]:
                self._add_job(spec, row, store_now)
            else:
                unheld.append(spec)
        return unheld

    def _add_job(self, spec: JobSpec, before: JobRecord | None, store_now: int) -> None:
        # The row as it was: another definition is reported, and this one now governs.
        self.definitions.registered(spec.name, before, store_now)
        high_water = before.high_water_us if before is not None else None
        # A job new to the fleet starts now; a known one resumes after its last slot,
        # so slots missed while every replica was down meet the catch-up policy.
        cursor = high_water if high_water is not None else store_now
        if (
            isinstance(spec.schedule, AtSchedule)
            and high_water is None
            and spec.schedule.moment_us <= store_now
        ):
            # Said, not silently dropped: the job's one slot passed before any replica
            # planned it, and a job new to the fleet starts now.
            log.warning(
                "%s: its one time (at = %s) had passed when it was first scheduled (store "
                "time %s); it will not run — set a future time, or trigger it by hand",
                spec.name,
                iso_utc(spec.schedule.moment_us),
                iso_utc(store_now),
                extra={"action": "job_at_in_past", "job": spec.name},
            )
        self._jobs[spec.name] = PlannedJob(spec=spec, cursor_us=cursor)
        self._due.push(self._jobs[spec.name])

    # -- leader mode -----------------------------------------------------------------------
    async def _lead(self) -> None:
        while not self._stop.is_set():
            term = await self.elector.campaign()
            if term is None:
                await self._follow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.options.leader_ttl_us / 3e6)
                continue
            self.signals.leader.set()
            if self.metrics is not None:
                self.metrics.leader.set(1)
            until = asyncio.Event()
            watcher = asyncio.create_task(_first_of(until, self._stop, term.lost))
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
            if job is None:
                continue
            self.definitions.stored(row.job, row.fingerprint, row.now_us)
            if row.high_water_us is not None:
                job.cursor_us = max(job.cursor_us, row.high_water_us)

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
                self._synced_us = None  # the first pass after an outage reads the clock
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
                await _wait_any((until,), self.outage.delay_s())
            else:
                await _wait_any((until, self._wake), self._sleep_s())
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
        if self._foreign and self._may_adopt():
            soonest = min(soonest, max(self._foreign[0][0], self._adopt_at_us))
        if self._busy_retry_at_us is not None:
            soonest = min(soonest, self._busy_retry_at_us)
        # A few random milliseconds past the slot: replicas wake in a different order each
        # time, so the runs of a single job spread over them instead of going to one.
        spread = random.uniform(0.002, 0.03)
        return max(0.005, (soonest - now) / 1e6 + spread)

    async def _tick(self, loop_time: float) -> None:
        # Due, late and missed are judged by the store's clock read now — never by this
        # host's clock, which may be wrong (a replica whose clock ran ahead must not record
        # future slots as missed or skipped for the whole fleet).
        now = await self._store_clock()
        if self.outage.active:
            # The store answers again: the outcomes waiting for a try go before any claim.
            self.supervisor.store_answered()
            self._store_back_us = now
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
        await self._read_ring()
        try:
            # Planned in groups of about _RECORD_BATCH missed slots: after a long outage a
            # group's plans, not every job's, are held at once, and each group's missed
            # slots are recorded in one round trip before its jobs move on.
            group: list[tuple[PlannedJob, Plan]] = []
            noted = 0
            for job in due:
                plan = plan_slots(job, now)
                group.append((job, plan))
                noted += min(len(plan.missed), _MISSED_RECORD_LIMIT)
                if noted >= _RECORD_BATCH:
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
        if self._busy_wait and self._busy_retry_at_us is not None and now >= self._busy_retry_at_us:
            self._pending.extend(self._busy_wait)
            self._busy_wait.clear()
            self._busy_retry_at_us = None
        await self._claim()

    async def _take(
        self, plans: Sequence[tuple[PlannedJob, Plan]], now: int, later: set[str]
    ) -> None:
        """Record the missed slots of ``plans``, then queue their slots: this replica's to
        claim, another replica's to look at after its hand-over delay (at once for the
        ``later`` jobs, collected after that delay already)."""
        await self._record_missed(plans)
        for job, plan in plans:
            spec = job.spec
            local = self.definitions.local.get(spec.name)
            for slot in self._collect(job, plan):
                shared, slot_deadline = self._slot_facts(job, slot)
                if shared:
                    ripe = spec.name in later
                    self._wait_for_owner(spec.name, slot, slot_deadline, now, ripe=ripe)
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
        return self.options.mode == "claim" and not self.ring.owns(job, slot_us)

    def _slot_facts(self, job: PlannedJob, slot_us: int) -> tuple[bool, int]:
        """Whether another replica owns the slot, and its deadline: worked out once per
        slot, when the job went in the heap for it (:meth:`_collect_delay`), unless the
        job's definition or the ring has changed since."""
        spec, known, version = job.spec, job.next, self.ring.version
        if (
            isinstance(known, _SlotFacts)
            and known.spec is spec
            and known.slot_us == slot_us
            and known.ring_version == version
        ):
            return known.shared, known.deadline_us
        shared = self._shared(spec.name, slot_us)
        slot_deadline = deadline(spec, slot_us)
        job.next = _SlotFacts(spec, slot_us, version, shared, slot_deadline)
        return shared, slot_deadline

    def _collect_delay(self, job: PlannedJob, slot_us: int) -> int:
        """How long after its fire time a slot is collected: at once when this replica owns
        it (or runs alone, or leads), else after its hand-over wait (:meth:`_handover`)."""
        shared, slot_deadline = self._slot_facts(job, slot_us)
        if not shared:
            return 0
        return self._handover(slot_deadline, slot_us)

    @staticmethod
    def _handover(deadline_us: int | None, slot_us: int) -> int:
        """A quarter of the time the slot's catch-up policy gives it, at most
        :data:`HANDOVER_US` (at least 1 µs: another's slot always waits)."""
        if deadline_us is None:
            return HANDOVER_US
        return max(1, min(HANDOVER_US, (deadline_us - slot_us) // 4))

    def _wait_for_owner(
        self, job: str, slot_us: int, deadline_us: int | None, now: int, *, ripe: bool = False
    ) -> None:
        """Queue another replica's slot for adoption: looked at after a quarter of the time
        its catch-up policy gives it (at most :data:`HANDOVER_US`; at once when ``ripe``,
        collected after that wait already), and the reads are spaced so that it is looked
        at again before half of that time has passed."""
        window = None if deadline_us is None else deadline_us - slot_us
        wait = 0 if ripe else self._handover(deadline_us, slot_us)
        if window is not None:
            self._adopt_cap_us = min(self._adopt_cap_us, max(window // 2, 1))
            # Reads spaced out while owners kept up must not pass this slot's deadline.
            self._adopt_at_us = min(self._adopt_at_us, now + wait + window // 2)
        self._foreign.append((now + wait, job, slot_us, deadline_us))

    async def _read_ring(self) -> None:
        """Read the ring's members every heartbeat interval, and at most once a second
        while it is stale (an owned slot was found taken: the members changed)."""
        if self.options.mode != "claim":
            return
        now = self.clock.monotonic_us()
        last = self._ring_read_us
        if not (
            last is None
            or now - last >= self.options.heartbeat_s * 1e6
            or (self._ring_stale and now - last >= _RING_RESYNC_US)
        ):
            return
        self._ring_read_us = now
        try:
            rows = await self.store.run(self.ops.replica_list(self.options.namespace, 0))
        except BaseException:
            self._ring_stale = True  # tried again within a second, not a heartbeat later
            raise
        self._ring_stale = False
        self.ring.update(rows)

    def _may_adopt(self) -> bool:
        """Whether this replica has room and none of its own slots waiting."""
        return not self._pending and len(self.supervisor.running) < self.options.concurrency

    async def _adopt(self, now: int) -> None:
        """Take on the slots of other replicas that are still free after their hand-over
        delay (their owner is down, frozen or behind): one read for up to
        :data:`_ADOPT_BATCH` of them; those the store has settled are dropped. While the
        owners keep up (nothing left to adopt) the reads space out to once a second. Only a
        replica with room and none of its own slots waiting adopts: in a burst every replica
        first drains its own share, then takes over what is left of the others'."""
        if not self._foreign or self._foreign[0][0] > now or now < self._adopt_at_us:
            return
        if not self._may_adopt():
            return
        ripe: list[tuple[int, str, int, int | None]] = []
        while self._foreign and self._foreign[0][0] <= now and len(ripe) < _ADOPT_BATCH:
            ripe.append(self._foreign.popleft())
        asked = [(job, slot) for _, job, slot, _ in ripe]
        try:
            settled = await self.store.run(self.ops.run_settled(self.options.namespace, asked))
        except BaseException:
            self._foreign.extendleft(
                (now, job, slot, slot_deadline) for _, job, slot, slot_deadline in reversed(ripe)
            )
            raise
        free = [
            claim_for(self._jobs[job].spec, slot, "schedule", deadline_us=slot_deadline)
            for _, job, slot, slot_deadline in ripe
            if (job, slot) not in settled and job in self._jobs
        ]
        self._catching_up -= settled
        self._pending.extend(free)
        low, high = _ADOPT_EVERY_US
        spacing = low if free else 2 * self._adopt_every_us
        self._adopt_every_us = min(spacing, high, self._adopt_cap_us)
        self._adopt_at_us = now + self._adopt_every_us
        if not self._foreign:
            self._adopt_cap_us = high

    async def _record_missed(self, plans: Sequence[tuple[PlannedJob, Plan]]) -> None:
        """Record ``missed`` the slots catch-up gives up, for every job of a pass together:
        one round trip per :data:`_RECORD_BATCH` slots, not one per slot (a replica that
        fell behind must not fall further behind recording it)."""
        notes: list[RunNote] = []
        counted: list[tuple[JobSpec, int]] = []
        for job, plan in plans:
            spec = job.spec
            # A superseded definition's slots are not the job's: nothing is recorded for
            # them (a row would keep the governing replica from a slot both schedules have).
            if not plan.missed or spec.name in self.definitions.conflicts:
                continue
            why = f"missed (catchup = {spec.catchup})"
            notes += (
                RunNote(spec.name, slot, "missed", why, "schedule")
                for slot in plan.missed[-_MISSED_RECORD_LIMIT:]
            )
            counted.append((spec, len(plan.missed)))
        for start in range(0, len(notes), _RECORD_BATCH):
            chunk = notes[start : start + _RECORD_BATCH]
            await self.store.run(self.ops.run_record_many(self.options.namespace, chunk))
        for spec, count in counted:
            if self.metrics is not None:
                self.metrics.missed(spec.name, count)
            log.warning(
                "%s: %d slot(s) missed (catchup = %s)",
                spec.name,
                count,
                spec.catchup,
                extra={"action": "slot_missed", "job": spec.name, "count": count},
            )

    def _collect(self, job: PlannedJob, plan: Plan) -> list[int]:
        """The job's slots to claim by ``plan``, its cursor moved past them (called once
        the plan's missed slots are recorded: a store error retries the lot)."""
        if not plan.ready:
            return []
        job.cursor_us = plan.ready[-1]
        # Caught-up slots run one after another, not "skipped while the previous runs".
        self._catching_up.update((job.spec.name, slot) for slot in plan.caught_up)
        return plan.take

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
        room = self.options.concurrency - len(self.supervisor.running)
        if room <= 0 or not (self._pending or self._buffered):
            return False
        if self._contended and self._pending:
            await self._sift(room)
        claims: list[SlotClaim] = []
        blocked: list[SlotClaim] = []
        # A job whose last run has ended but whose outcome is not recorded yet is still
        # running in the store: its next exclusive slot waits for that outcome (sent first,
        # then the run's end wakes the loop) instead of being refused and skipped.
        finishing = self.supervisor.finishing
        # The jobs holding a buffered slot, not every job: a pass costs what is due.
        for name in list(self._buffered):
            job = self._jobs.get(name)
            if job is None or job.buffered is None:
                self._buffered.discard(name)
                continue
            if name in finishing:
                continue
            if len(claims) < room:
                self._buffered.discard(name)
                claim = claim_for(job.spec, job.buffered, "schedule")
                (blocked if job.spec.name in self.supervisor.abandoned else claims).append(claim)
                job.buffered = None
        # At most one exclusive claim per job per batch: the others would only find the
        # job's lease taken by the first. They wait, in order, for the next tick.
        exclusive = {c.job for c in claims if c.exclusive}
        waiting: list[SlotClaim] = []
        while self._pending and len(claims) < room:
            claim = self._pending.popleft()
            if claim.job in self.supervisor.abandoned:
                blocked.append(claim)
                continue
            if claim.exclusive and (claim.job in exclusive or claim.job in finishing):
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
                # Each claim is sent with this replica's definition of its job: the store
                # refuses it while the registered definition is another (conflict).
                local = self.definitions.local
                signed = [
                    c if c.fingerprint == local[c.job] else replace(c, fingerprint=local[c.job])
                    for c in batch
                ]
                results = await self.store.run(
                    self.ops.run_claim(self.options.namespace, signed, self.holder, ttl)
                )
                answers += zip(batch, results, strict=True)
                if self.metrics is not None:
                    self.metrics.claimed(results)
        finally:
            # Claims without an answer (the store failed) wait for the next tick. One
            # that did land before the failure answers "taken" then, and its attempt is
            # recovered after its lease expires.
            answered = {(c.job, c.slot_us) for c, _ in answers}
            self._pending.extendleft(
                reversed([c for c in claims if (c.job, c.slot_us) not in answered])
            )
        received = self.clock.monotonic_us()
        estimate = received + self._offset_us
        for claim, answer in answers:
            if answer.run is not None:
                self._check_estimate(answer.run.now_us, sent, received)
            elif answer.status == "not_due" or (
                # Refused past a deadline the estimate had not reached: it runs behind.
                answer.status == "missed"
                and claim.deadline_us is not None
                and claim.deadline_us > estimate + _CLOCK_TOLERANCE_US
            ):
                self._synced_us = None
        if any(
            answer.status == "taken"
            and claim.deadline_us is not None
            and not self._shared(claim.job, claim.slot_us)
            for claim, answer in answers
        ):
            self._ring_stale = True  # another replica thinks this slot its own
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
            if answer.status != "busy" and self._busy_since:
                self._busy_since.pop((claim.job, claim.slot_us), None)
            if answer.run is not None:
                self.supervisor.start(answer.run, sent)
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
            if claim.job in self.definitions.conflicts:
                continue  # not the job's slot: nothing is recorded for it
            try:
                await self._skip(claim, ABANDONED_REASON, "abandoned")
            except StoreError:
                self._pending.extendleft(reversed(blocked[index:]))
                raise

    async def _not_claimed(self, claim: SlotClaim, status: str) -> bool:
        """Apply the policy to a claim the store refused with ``status``. Returns whether
        the slot is settled elsewhere (taken, or final), freeing its place in the batch."""
        if status == "taken":
            return True  # another replica has it, or it is final: exactly once, nothing to do
        if status == "conflict":
            return True  # the stored definition governs: its replicas run the job
        if status == "missed":
            log.warning(
                "%s: slot %s missed: not started by its deadline (catchup = %s)",
                claim.job,
                iso_utc(claim.slot_us),
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
            await self._skip(claim, "job paused", "paused")
            return False
        ns = self.options.namespace
        overlap = job.spec.overlap
        if overlap in ("buffer_one", "cancel_other"):
            if job.buffered is not None and job.buffered != claim.slot_us:
                await self._skip(
                    SlotClaim(job=claim.job, slot_us=min(job.buffered, claim.slot_us), run_id=""),
                    "superseded by a newer slot while the job was running",
                    "superseded",
                )
            job.buffered = max(claim.slot_us, job.buffered or 0)
            self._buffered.add(claim.job)
            if overlap == "cancel_other":
                asked = await self.store.run(self.ops.run_cancel(ns, claim.job))
                log.info(
                    "%s: asked %d running attempt(s) to stop (overlap = cancel_other)",
                    claim.job,
                    asked,
                    extra={"action": "run_cancel_requested", "job": claim.job},
                )
            return False
        key = (claim.job, claim.slot_us)
        now = self._now()
        back = self._store_back_us
        since = self._busy_since.setdefault(key, now)
        if back is not None and since - back < AFTER_OUTAGE_US and now - since < BUSY_GRACE_US:
            # The previous run may be over with its outcome on the way: ask again shortly.
            self._busy_wait.append(claim)
            if self._busy_retry_at_us is None:
                self._busy_retry_at_us = now + _BUSY_RETRY_US
            return False
        del self._busy_since[key]
        await self._skip(claim, "previous run still running (overlap = skip)", "previous_running")
        return False

    async def _skip(self, claim: SlotClaim, why: str, reason: str) -> None:
        """Record ``claim``'s slot skipped with ``why``; ``reason``: its metric label."""
        await self.store.run(
            self.ops.run_record(
                self.options.namespace, claim.job, claim.slot_us, "skipped", why, "schedule"
            )
        )
        if self.metrics is not None:
            self.metrics.skipped(claim.job, reason)
        log.info(
            "%s: slot %s skipped: %s",
            claim.job,
            iso_utc(claim.slot_us),
            why,
            extra={"action": "slot_skipped", "job": claim.job, "slot_us": claim.slot_us},
        )

    # -- running -------------------------------------------------------------------------


class StoreOutage:
    """The store as the loop sees it: an outage is logged once when it starts and once when
    it ends (with how long it lasted and how many passes failed), never once per pass; while
    it lasts, passes are spaced by a jittered back-off (100 ms doubling to 1 s: the store
    is found back within a second, well inside a lease, at the cost of one failed
    connection attempt a second per replica while it is down)."""

    FIRST_S = 0.1
    MOST_S = 1.0

    def __init__(self) -> None:
        self.active = False
        self.failures = 0  # failed passes of the current outage
        self.total_failures = 0  # failed passes since the replica started
        self._since = 0.0

    def failed(self, error: StoreError, now_s: float) -> None:
        self.failures += 1
        self.total_failures += 1
        if self.active:
            log.debug("store still unavailable: %s", error, extra={"action": "store_unavailable"})
            return
        self.active, self._since = True, now_s
        log.error(
            "store unavailable: %s; retrying with back-off (logged again when it is back)",
            error,
            extra={"action": "store_unavailable"},
        )

    def ended(self, now_s: float) -> None:
        if not self.active:
            return
        log.warning(
            "store available again after %.1f s (%d failed pass(es))",
            now_s - self._since,
            self.failures,
            extra={"action": "store_recovered", "failures": self.failures},
        )
        self.active, self.failures = False, 0

    def lasted_s(self, now_s: float) -> float:
        """How long the current outage has lasted (0 when the store is up)."""
        return now_s - self._since if self.active else 0.0

    def delay_s(self) -> float:
        """How long to wait before the next pass during the outage (jittered)."""
        return backoff_s(self.failures - 1, first_s=self.FIRST_S, most_s=self.MOST_S)


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


async def _first_of(target: asyncio.Event, *events: asyncio.Event) -> None:
    """Set ``target`` as soon as any of ``events`` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        target.set()
