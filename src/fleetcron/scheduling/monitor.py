"""The fleet's dead man's switch, watched by one replica at a time.

Every ``every_s`` each replica tries to take (or keep) the namespace's monitor lease; the
one holding it reads every job's health from the store (:mod:`fleetcron.health`), says
once when a job becomes overdue, stuck or failing — a log record (``job_overdue``,
``job_stuck``, ``job_failing``) and an alert for the webhooks — and once when it is
healthy again (``job_recovered``), and publishes the verdict as metrics. An overdue job is
alerted again for each later slot that also passes its grace without a success.

What was said is remembered in the store, not by the watching replica, so each alert is
said once across the fleet even when the watch moves to another replica (the watcher
stopped, or lost the store for longer than the lease): a job's *alert marker*, the lease
row ``fleetcron:alert:<job>``, records the last alert said of it — the monitor term (the
fence of the monitor lease) it was said in, the event and its key (the overdue slot, the
stuck run's fence) — in its holder. The markers come with the lease list each watch
reads anyway; an alert costs a round trip or two, only when one is due:

- the marker is replaced as compare-and-set: a held row is released by the exact
  (holder, fence) this watch read, then the new record is acquired, which only one
  replica can do; the replica whose writes succeed says the alert, any other says nothing.
  A marker written in a later term than the watcher's own is left alone (that watcher's
  view is stale). The marker's fence names the alert (:attr:`Alert.idempotency_key`).
- a new watcher that finds a healthy job whose marker records an unhealthy event says the
  recovery, under the same rule.
- a store failure says nothing: the next watch tries again. An alert can be delayed by an
  outage, never doubled. When the store took the marker but its answer was lost, the
  watcher remembers what it tried and says it at the next watch that finds its marker
  there; only if the watch moves to another replica before that is the alert lost.

A marker is held (:data:`MARKER_TTL_US`, a year; a week once the job recovered) so
``fleetcron prune`` never deletes a live one; there is one row per job ever alerted, and
the marker of a job whose row is gone is released. Listings never show markers
(:func:`fleetcron.status.is_alert_marker`).

A watch judges again only the jobs whose rows changed since the watch before, or whose
health may have changed with time (:mod:`fleetcron.health_cache`); an idle namespace
costs two reads and no assessment, and every job is judged afresh at least every
:data:`~fleetcron.health_cache.FULL_EVERY_US` and whenever the watch moves to this replica.

The watching replica also keeps the run ledger bounded: every ``retention_s`` it applies
the retention rule of each job it defines (:mod:`fleetcron.scheduling.retention`), in a
task of its own so the watches keep their pace, stopping when the lease is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fleetcron._log import log
from fleetcron.alerts import Alert
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.health import JobHealth
from fleetcron.health_cache import HealthCache
from fleetcron.jobspec import JobSpec
from fleetcron.models import LeaseRecord, display_holder
from fleetcron.scheduling.retention import DEFAULT_RETENTION_S, PassResult, Pruner
from fleetcron.status import ALERT_MARKER_PREFIX, FleetStatus, read_status_in_turns
from fleetcron.stores.base import AsyncStore

__all__ = [
    "DEFAULT_MONITOR_S",
    "MARKER_TTL_US",
    "MONITOR_LEASE",
    "RECOVERED_TTL_US",
    "Monitor",
    "alert_marker",
]

MONITOR_LEASE = "fleetcron:monitor"
DEFAULT_MONITOR_S = 15.0
_TTL_PERIODS = 3  # the lease outlives two missed periods
_DAY_US = 86_400_000_000
MARKER_TTL_US = 365 * _DAY_US
"""How long an alert marker of an unhealthy job is held: far longer than any episode, so
``fleetcron prune`` (which deletes only rows not held) does not delete one still owed a
recovery. Expiry alone changes nothing (the row still records what was said); a job
unhealthy for longer than this may be alerted once more after a prune."""
RECOVERED_TTL_US = 7 * _DAY_US
"""How long the marker of a recovered job is held; then ``fleetcron prune`` may delete it
(a job without a marker has nothing owed)."""
_MAX_MARKER_BYTES = 800  # the narrowest lease name column (MySQL VARBINARY(800))
_EVENTS = frozenset({"overdue", "stuck", "failing", "recovered"})


def alert_marker(job: str) -> str:
    """The lease row that records the last alert said of ``job``: ``fleetcron:alert:<job>``,
    or a digest of the job's name where the name would not fit a lease name."""
    name = ALERT_MARKER_PREFIX + job
    if len(name.encode()) <= _MAX_MARKER_BYTES:
        return name
    return ALERT_MARKER_PREFIX + "#" + hashlib.sha256(job.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class _Said:
    """What a marker records: the last alert said of a job (``key``: the overdue slot,
    the stuck run's fence, else ``None``) and the monitor term it was said in."""

    term: int
    event: str
    key: int | None

    def encode(self) -> str:
        return f"{self.term}.{self.event}.{'-' if self.key is None else self.key}"

    @staticmethod
    def decode(holder: str) -> _Said | None:
        """The record in a marker's holder (``host:pid:<term>.<event>.<key>``); ``None``
        when the row is not one the monitor wrote."""
        parts = holder.rpartition(":")[2].split(".")
        if len(parts) != 3 or parts[1] not in _EVENTS:
            return None
        try:
            return _Said(int(parts[0]), parts[1], None if parts[2] == "-" else int(parts[2]))
        except ValueError:
            return None


def _verdict(health: JobHealth) -> tuple[str, int | None] | None:
    """The unhealthy event of ``health`` and its key, or ``None`` when it is healthy."""
    if health.overdue:
        return "overdue", health.expected_slot_us
    if health.stuck:
        return "stuck", health.running.fence if health.running is not None else None
    if health.failing:
        return "failing", None
    return None


class Monitor:
    """Watches the jobs of a namespace while it holds the monitor lease.

    ``jobs``: the names to watch (``None``: every job of the namespace). ``on_status`` and
    ``on_alert`` receive what each watch found (metrics, webhooks); they must not block.
    Each alert is said once across the fleet: the job's alert marker in the store records
    it (see the module's documentation). ``specs``: the jobs this replica defines, whose
    retention rules it applies every ``retention_s`` while it watches (``None`` or ``0``:
    no retention from this replica); ``clock`` times those passes.
    """

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        holder: str,
        *,
        every_s: float = DEFAULT_MONITOR_S,
        jobs: Sequence[str] | None = None,
        on_status: Callable[[FleetStatus], None] | None = None,
        on_alert: Callable[[Alert], None] | None = None,
        specs: Mapping[str, JobSpec] | None = None,
        retention_s: float = DEFAULT_RETENTION_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not retention_s >= 0:
            raise ConfigurationError(f"retention_s must not be negative: {retention_s!r}")
        self.store = store
        self.namespace = namespace
        self.holder = holder
        self.every_s = every_s
        self.jobs = list(jobs) if jobs is not None else None
        self.on_status = on_status
        self.on_alert = on_alert
        self.lease: LeaseRecord | None = None
        self.last: FleetStatus | None = None
        # Markers this replica tried to take when the store's answer was lost: marker ->
        # (the holder written, the alert). Said at the next watch that finds that holder.
        self._unsure: dict[str, tuple[str, Alert]] = {}
        self._task: asyncio.Task[None] | None = None
        self.cache = HealthCache()
        # What the last watch settled of each job (its health, its marker, the term):
        # a job found the same way again needs nothing said.
        self._settled: dict[str, tuple[JobHealth, tuple[str, int] | None, int]] = {}
        self.watched = asyncio.Event()  # set after each watch (tests wait on it)
        self.retention_s = retention_s
        self.clock = clock
        self.pruner = (
            Pruner(store, namespace, specs) if specs is not None and retention_s > 0 else None
        )
        self.pruned = asyncio.Event()  # set after each retention pass (tests wait on it)
        self.last_pass: PassResult | None = None
        self._pruned_at: int | None = None  # monotonic µs of the last pass's start
        self._pruning: asyncio.Task[PassResult | None] | None = None

    @property
    def watching(self) -> bool:
        """Whether this replica held the monitor lease at its last try."""
        return self.lease is not None

    async def _hold(self) -> bool:
        ops, ttl = self.store.ops, round(_TTL_PERIODS * self.every_s * 1e6)
        if self.lease is not None:
            self.lease = await self.store.run(
                ops.lease_extend(self.namespace, MONITOR_LEASE, self.holder, self.lease.fence, ttl)
            )
        if self.lease is None:
            self.lease = await self.store.run(
                ops.lease_acquire(self.namespace, MONITOR_LEASE, self.holder, ttl, 0)
            )
            if self.lease is not None:
                # A new term: what this replica judged before may be long out of date.
                self.cache.clear()
                self._settled.clear()
                if self.pruner is not None:
                    self.pruner.new_watch()
        return self.lease is not None

    async def watch(self) -> FleetStatus | None:
        """One watch: hold the lease, read the health, say what changed. ``None`` when
        another replica watches or the store could not be reached."""
        try:
            return await self._watch()
        finally:
            self.watched.set()

    async def _watch(self) -> FleetStatus | None:
        try:
            if not await self._hold():
                return None
            # In turns: the scheduling that shares this store is not held up for the read.
            status = await read_status_in_turns(
                self.store, self.namespace, self.jobs, queues=False, cache=self.cache
            )
        except StoreError as exc:
            log.debug("monitor: %s", exc, extra={"action": "monitor_failed"})
            return None
        assert self.lease is not None
        term = self.lease.fence
        self.last = status
        if self.on_status is not None:
            self.on_status(status)
        markers = {marker.name: marker for marker in status.markers}
        self._say_unsure(markers)
        job = None
        try:
            settled = self._settled
            for health in status.jobs:
                job = health.job
                marker = markers.get(alert_marker(job))
                seen = (health, (marker.holder, marker.fence) if marker else None, term)
                last = settled.get(job)
                if last is None or last[0] is not health or last[1:] != seen[1:]:
                    await self._settle(health, marker, term, status.now_us)
                    settled[job] = seen
            job = None
            if len(settled) > len(status.jobs):
                shown = {health.job for health in status.jobs}
                self._settled = {name: seen for name, seen in settled.items() if name in shown}
            if self.jobs is None:
                await self._forget_gone(status)
        except StoreError as exc:
            # Nothing is said without its marker: the next watch tries again.
            log.warning(
                "%salert delayed: %s; the next watch tries again",
                f"{job}: " if job is not None else "",
                exc,
                extra={"action": "alert_delayed", **({"job": job} if job is not None else {})},
            )
        return status

    async def _settle(
        self, health: JobHealth, marker: LeaseRecord | None, term: int, now_us: int | None = None
    ) -> None:
        """Say the alert ``health`` calls for, unless the job's ``marker`` records it
        (``now_us``: the store's time of the watch, when later than the health's)."""
        said = _Said.decode(marker.holder) if marker is not None else None
        verdict = _verdict(health)
        if verdict is None:
            if said is None or said.event == "recovered":
                return  # healthy, and nothing owed
            event, key = "recovered", None
        else:
            event, key = verdict
            if said is not None and (said.event, said.key) == (event, key):
                return  # said already, by this replica or another
        if said is not None and said.term > term:
            return  # said in a later term: this watch is stale (its lease has moved on)
        now = _Said(term, event, key)
        alert = Alert(
            job=health.job,
            event=event,
            # A kept health was judged at an earlier watch: the alert is of this one.
            health=health
            if now_us is None or health.now_us == now_us
            else dataclasses.replace(health, now_us=now_us),
            slot_us=key if event == "overdue" else None,
        )
        name = alert_marker(health.job)
        taken = await self._replace(name, marker, now, alert)
        if taken is not None:
            self._say(self._keyed(alert, name, taken.fence))

    async def _replace(
        self, name: str, marker: LeaseRecord | None, said: _Said, alert: Alert
    ) -> LeaseRecord | None:
        """Compare-and-set the marker ``name`` from ``marker`` (as this watch read it) to
        ``said``; the new row when this replica set it, ``None`` when another replica
        changed the marker since (it says the alert, or already did)."""
        ops = self.store.ops
        if marker is not None and marker.held:
            released = await self.store.run(
                ops.lease_release(self.namespace, name, marker.holder, marker.fence)
            )
            if not released:
                return None
        # The holder shows who said it (host:pid, never the secret token) and records what.
        holder = f"{display_holder(self.holder)}:{said.encode()}"
        ttl = RECOVERED_TTL_US if said.event == "recovered" else MARKER_TTL_US
        try:
            return await self.store.run(ops.lease_acquire(self.namespace, name, holder, ttl, 0))
        except StoreError:
            self._unsure[name] = (holder, alert)  # the store may have taken it
            raise

    def _say_unsure(self, markers: Mapping[str, LeaseRecord]) -> None:
        """Say each alert whose marker this replica took while the answer was lost: the
        marker holds what it wrote, so nobody else said it."""
        unsure, self._unsure = self._unsure, {}
        for name, (holder, alert) in unsure.items():
            marker = markers.get(name)
            if marker is not None and marker.holder == holder:
                self._say(self._keyed(alert, name, marker.fence))

    def _keyed(self, alert: Alert, name: str, fence: int) -> Alert:
        digest = hashlib.sha256(f"{self.namespace}\0{name}\0{fence}".encode()).hexdigest()
        return dataclasses.replace(alert, idempotency_key=digest[:32])

    async def _forget_gone(self, status: FleetStatus) -> None:
        """Release the markers of jobs the store no longer has, so ``fleetcron prune``
        may delete them (nothing is said: the job is gone)."""
        if not any(marker.held for marker in status.markers):
            return
        known = {alert_marker(health.job) for health in status.jobs}
        for marker in status.markers:
            if marker.name not in known and marker.held:
                await self.store.run(
                    self.store.ops.lease_release(
                        self.namespace, marker.name, marker.holder, marker.fence
                    )
                )

    def _say(self, alert: Alert) -> None:
        health = alert.health
        if alert.event == "recovered":
            log.warning(
                "%s: healthy again (%s)",
                alert.job,
                health.state,
                extra={"action": "job_recovered", "job": alert.job},
            )
        else:
            log.error(
                "%s: %s: %s",
                alert.job,
                alert.event,
                "; ".join(health.reasons),
                extra={
                    "action": f"job_{alert.event}",
                    "job": alert.job,
                    **({"slot_us": alert.slot_us} if alert.slot_us is not None else {}),
                },
            )
        if self.on_alert is not None:
            self.on_alert(alert)

    # -- retention ---------------------------------------------------------------------
    async def prune(self) -> PassResult | None:
        """One retention pass over this replica's jobs, if it watches (held the lease at
        its last watch); ``None`` when it does not, has no jobs to prune, or the store
        failed (the next pass tries again)."""
        if self.pruner is None or not self.watching:
            return None
        try:
            result = await self.pruner.prune(lambda: self.watching)
        except StoreError as exc:
            log.warning(
                "retention: %s; the next pass tries again",
                exc,
                extra={"action": "runs_prune_failed"},
            )
            return None
        except Exception:
            # A defect must not end retention without a word (the task's error would
            # only surface at shutdown).
            log.exception("retention pass failed", extra={"action": "runs_prune_failed"})
            return None
        finally:
            self.pruned.set()
        self.last_pass = result
        # Rows deleted: those jobs are judged afresh at the next watch.
        self.cache.forget(result.pruned)
        return result

    def _prune_if_due(self) -> None:
        if self.pruner is None or not self.watching:
            return
        if self._pruning is not None and not self._pruning.done():
            return
        now = self.clock.monotonic_us()
        if self._pruned_at is not None and now - self._pruned_at < self.retention_s * 1e6:
            return
        self._pruned_at = now
        self._pruning = asyncio.create_task(self.prune(), name="fleetcron-retention")

    # -- the periodic task -------------------------------------------------------------
    def start(self) -> None:
        """Watch every ``every_s`` until :meth:`stop`, and prune every ``retention_s``
        while watching."""
        if self._task is None:
            self._task = asyncio.create_task(self._watch_forever(), name="fleetcron-monitor")

    async def _watch_forever(self) -> None:
        while True:
            try:
                await self.watch()
                self._prune_if_due()
            except Exception:
                # A defect (a callback, an unreadable row) must not stop the dead man's
                # switch silently: say so and watch again next period.
                log.exception("monitor: watch failed", extra={"action": "monitor_failed"})
            await asyncio.sleep(self.every_s)

    async def stop(self) -> None:
        """Stop watching and hand the lease back, so another replica takes over at once."""
        for task in (self._task, self._pruning):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._pruning = None
        self._unsure.clear()
        self.cache.clear()
        self._settled.clear()
        lease, self.lease = self.lease, None
        if lease is not None:
            with contextlib.suppress(StoreError):
                await self.store.run(
                    self.store.ops.lease_release(
                        self.namespace, MONITOR_LEASE, self.holder, lease.fence
                    )
                )
