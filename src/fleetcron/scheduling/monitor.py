"""The fleet's dead man's switch, watched by one replica at a time.

Every ``every_s`` each replica tries to take (or keep) the namespace's monitor lease; the
one holding it reads every job's health from the store (:mod:`fleetcron.health`), says
once when a job becomes overdue, stuck or failing — a log record (``job_overdue``,
``job_stuck``, ``job_failing``) and an alert for the webhooks — and once when it is
healthy again (``job_recovered``), and publishes the verdict as metrics. An overdue job is
alerted again for each later slot that also passes its grace without a success.

One replica watching means one alert per event across the fleet. When the watching replica
changes (it stopped or lost the store for longer than the lease), the next one starts with
no memory: a job still unhealthy is alerted once more, and a recovery the previous one would
have reported is only logged if the new one saw the job unhealthy itself.

The watching replica also keeps the run ledger bounded: every ``retention_s`` it applies
the retention rule of each job it defines (:mod:`fleetcron.scheduling.retention`), in a
task of its own so the watches keep their pace, stopping when the lease is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fleetcron._log import log
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.health import JobHealth
from fleetcron.jobspec import JobSpec
from fleetcron.models import LeaseRecord
from fleetcron.scheduling.retention import DEFAULT_RETENTION_S, PassResult, Pruner
from fleetcron.status import FleetStatus, read_status
from fleetcron.stores.base import AsyncStore

__all__ = ["DEFAULT_MONITOR_S", "MONITOR_LEASE", "Alert", "Monitor"]

MONITOR_LEASE = "fleetcron:monitor"
DEFAULT_MONITOR_S = 15.0
_TTL_PERIODS = 3  # the lease outlives two missed periods


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One change of a job's health, said once by the watching replica."""

    job: str
    event: str  # "overdue", "stuck", "failing" or "recovered"
    health: JobHealth
    slot_us: int | None  # the overdue slot, for "overdue"


class Monitor:
    """Watches the jobs of a namespace while it holds the monitor lease.

    ``jobs``: the names to watch (``None``: every job of the namespace). ``on_status`` and
    ``on_alert`` receive what each watch found (metrics, webhooks); they must not block.
    ``specs``: the jobs this replica defines, whose retention rules it applies every
    ``retention_s`` while it watches (``None`` or ``0``: no retention from this replica);
    ``clock`` times those passes.
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
        self._said: dict[str, tuple[str, int | None]] = {}  # job -> (event, overdue slot)
        self._task: asyncio.Task[None] | None = None
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
                self._said.clear()  # a new watch: nothing said yet by this replica
                if self.pruner is not None:
                    self.pruner.new_watch()
        return self.lease is not None

    async def watch(self) -> FleetStatus | None:
        """One watch: hold the lease, read the health, say what changed. ``None`` when
        another replica watches or the store could not be reached."""
        try:
            if not await self._hold():
                return None
            status = await self.store.run(read_status(self.store.ops, self.namespace, self.jobs))
        except StoreError as exc:
            log.debug("monitor: %s", exc, extra={"action": "monitor_failed"})
            return None
        finally:
            self.watched.set()
        self.last = status
        if self.on_status is not None:
            self.on_status(status)
        for health in status.jobs:
            self._compare(health)
        return status

    def _compare(self, health: JobHealth) -> None:
        event = "overdue" if health.overdue else "stuck" if health.stuck else None
        if event is None and health.failing:
            event = "failing"
        slot = health.expected_slot_us if event == "overdue" else None
        before = self._said.get(health.job)
        if event is None:
            if before is not None:
                del self._said[health.job]
                self._say(Alert(job=health.job, event="recovered", health=health, slot_us=None))
            return
        if before == (event, slot):
            return
        self._said[health.job] = (event, slot)
        self._say(Alert(job=health.job, event=event, health=health, slot_us=slot))

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
        lease, self.lease = self.lease, None
        if lease is not None:
            with contextlib.suppress(StoreError):
                await self.store.run(
                    self.store.ops.lease_release(
                        self.namespace, MONITOR_LEASE, self.holder, lease.fence
                    )
                )
