"""Prometheus metrics of a replica (``prometheus_client``), in its own registry.

Counters and histograms are this replica's own (what it claimed, skipped, ran, and how its
store answered); sum them over replicas. The job gauges (overdue, failing, stuck, paused,
last success) are the fleet's verdict read from the store's ledger (:mod:`fleetcron.health`)
by whichever replica holds the monitor lease at the time; the other replicas do not export
them, so alert on ``max by (job)``. docs/operations.md lists each metric with an alert rule.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetcron.errors import StoreError
from fleetcron.health import JobHealth
from fleetcron.models import ClaimResult
from fleetcron.queue_models import QueueStats
from fleetcron.stores.base import AsyncStore, Operation
from fleetcron.stores.wrapped import WrappedStore

if TYPE_CHECKING:
    from fleetcron.status import FleetStatus

__all__ = ["DURATION_BUCKETS", "InstrumentedStore", "Metrics"]

T = TypeVar("T")

# Seconds: from a quick job to a long batch (lock_at_most defaults to 10 minutes).
DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """Every metric of one replica. ``registry`` is created when not given; expose it
    with ``prometheus_client`` (``--metrics HOST:PORT``, ``fleet.metrics_app()``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._published: dict[str, JobHealth] = {}  # the verdict each job's gauges show
        r = self.registry
        self.slots_claimed = Counter(
            "fleetcron_slots_claimed", "Slots this replica claimed (attempts started).",
            ["job"], registry=r,
        )  # fmt: skip
        self.slots_skipped = Counter(
            "fleetcron_slots_skipped",
            "Slots this replica recorded skipped, by reason (previous_running, paused, "
            "abandoned, superseded).",
            ["job", "reason"],
            registry=r,
        )
        self.slots_missed = Counter(
            "fleetcron_slots_missed", "Slots recorded missed (not started by their deadline).",
            ["job"], registry=r,
        )  # fmt: skip
        self.runs = Counter(
            "fleetcron_runs", "Runs this replica finished, by outcome.",
            ["job", "outcome"], registry=r,
        )  # fmt: skip
        self.run_duration = Histogram(
            "fleetcron_run_duration_seconds", "Duration of this replica's runs.",
            ["job"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.lock_at_most = Gauge(
            "fleetcron_job_lock_at_most_seconds",
            "The job's lock_at_most: compare the duration histogram against it.",
            ["job"], registry=r,
        )  # fmt: skip
        self.last_success = Gauge(
            "fleetcron_job_last_success_timestamp_seconds",
            "When a run of the job last succeeded (store clock, Unix seconds).",
            ["job"], registry=r,
        )  # fmt: skip
        self.overdue = Gauge(
            "fleetcron_job_overdue", "1 when no run succeeded since the slot whose grace passed.",
            ["job"], registry=r,
        )  # fmt: skip
        self.failing = Gauge(
            "fleetcron_job_failing", "1 when the latest outcome is a failure.",
            ["job"], registry=r,
        )  # fmt: skip
        self.stuck = Gauge(
            "fleetcron_job_stuck", "1 when a run holds its slot far longer than usual.",
            ["job"], registry=r,
        )  # fmt: skip
        self.paused = Gauge(
            "fleetcron_job_paused", "1 when the job is paused.", ["job"], registry=r
        )
        self.conflict = Gauge(
            "fleetcron_job_definition_conflict",
            "1 while this replica's definition of the job differs from the stored one.",
            ["job"], registry=r,
        )  # fmt: skip
        self.leader = Gauge(
            "fleetcron_leader", "1 while this replica is the leader (leader mode).", registry=r
        )
        self.in_flight = Gauge(
            "fleetcron_runs_in_flight", "Runs in progress on this replica.", registry=r
        )
        self.store_seconds = Histogram(
            "fleetcron_store_operation_seconds", "Store operations, by operation.",
            ["operation"], buckets=_STORE_BUCKETS, registry=r,
        )  # fmt: skip
        self.store_errors = Counter(
            "fleetcron_store_errors", "Store operations that failed, by operation and error.",
            ["operation", "error"], registry=r,
        )  # fmt: skip
        self.store_up = Gauge(
            "fleetcron_store_up", "0 while this replica cannot reach the store.", registry=r
        )
        self.store_up.set(1)
        self.store_down_seconds = Gauge(
            "fleetcron_store_unavailable_seconds",
            "How long the current store outage has lasted on this replica (0 when none).",
            registry=r,
        )
        self.clock_offset = Gauge(
            "fleetcron_store_clock_offset_seconds",
            "The store's clock minus this host's wall clock.",
            registry=r,
        )
        self.queue_items = Counter(
            "fleetcron_queue_items",
            "Queue items this replica's workers claimed, and how they ended, by outcome "
            "(claimed, acked, failed: given back to be retried, dead, lost: its claim "
            "expired before it was acknowledged).",
            ["queue", "outcome"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "fleetcron_queue_items_waiting",
            "Items of a queue by state (ready: claimable now, scheduled, claimed, dead), read "
            "from the store by each replica that works the queue.",
            ["queue", "state"],
            registry=r,
        )
        self.queue_oldest = Gauge(
            "fleetcron_queue_oldest_age_seconds",
            "How long the queue's longest-waiting claimable item has waited (0: none).",
            ["queue"],
            registry=r,
        )

    # -- what the scheduler reports --------------------------------------------------------
    def claimed(self, answers: Iterable[ClaimResult]) -> None:
        """Count the answers of a claim round trip."""
        for answer in answers:
            if answer.run is not None:
                self.slots_claimed.labels(answer.job).inc()
            elif answer.status == "missed":
                self.slots_missed.labels(answer.job).inc()

    def skipped(self, job: str, reason: str) -> None:
        self.slots_skipped.labels(job, reason).inc()

    def missed(self, job: str, count: int = 1) -> None:
        self.slots_missed.labels(job).inc(count)

    def finished(self, job: str, outcome: str, duration_s: float | None) -> None:
        self.runs.labels(job, outcome).inc()
        if duration_s is not None:
            self.run_duration.labels(job).observe(duration_s)

    def queue_handled(self, queue: str, outcome: str, count: int) -> None:
        """Count what a queue worker's batch came to (:meth:`AsyncQueue.work`'s observe)."""
        self.queue_items.labels(queue, outcome).inc(count)

    def queue_stats(self, stats: Iterable[QueueStats]) -> None:
        """Publish how each queue stands."""
        for queue in stats:
            for state in ("ready", "scheduled", "claimed", "dead"):
                self.queue_depth.labels(queue.queue, state).set(getattr(queue, state))
            self.queue_oldest.labels(queue.queue).set(queue.oldest_age_us / 1e6)

    def job_defined(self, job: str, lock_at_most_us: int) -> None:
        self.lock_at_most.labels(job).set(lock_at_most_us / 1e6)

    def watched(self, status: FleetStatus) -> None:
        """Publish what the monitor read (:mod:`fleetcron.scheduling.monitor`)."""
        self.health(status.jobs)

    def health(self, jobs: Iterable[JobHealth]) -> None:
        """Publish the fleet's verdict on each job (see the module docstring). A verdict
        published already (the monitor keeps a job's health while its rows do not change)
        is not set again: five gauges a job add up over 10,000 jobs."""
        published = self._published
        for job in jobs:
            if published.get(job.job) is job:
                continue
            published[job.job] = job
            self.overdue.labels(job.job).set(int(job.overdue))
            self.failing.labels(job.job).set(int(job.failing))
            self.stuck.labels(job.job).set(int(job.stuck))
            self.paused.labels(job.job).set(int(job.paused))
            if job.last_success_us is not None:
                self.last_success.labels(job.job).set(job.last_success_us / 1e6)


class InstrumentedStore(WrappedStore):
    """An :class:`AsyncStore` that times each operation and counts its failures."""

    def __init__(self, store: AsyncStore, metrics: Metrics) -> None:
        super().__init__(store)
        self._metrics = metrics

    async def run(self, operation: Operation[T]) -> T:
        name = getattr(operation, "__name__", "operation")
        started = time.perf_counter()
        try:
            return await self._store.run(operation)
        except StoreError as exc:
            self._metrics.store_errors.labels(name, type(exc).__name__).inc()
            raise
        finally:
            self._metrics.store_seconds.labels(name).observe(time.perf_counter() - started)
