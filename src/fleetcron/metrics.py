"""Prometheus metrics of a replica (``prometheus_client``), in its own registry.

Counters and histograms are this replica's own (what it claimed, skipped, ran, and how its
store answered); sum them over replicas. The job gauges (overdue, failing, stuck, paused,
last success) are the fleet's verdict read from the store's ledger (:mod:`fleetcron.health`)
by whichever replica holds the monitor lease at the time; the other replicas do not export
them, so alert on ``max by (job)``. docs/operations.md lists each metric with an alert rule.

The metrics labelled by job are kept by :class:`JobMetrics`, a collector that holds plain
numbers per job and builds the samples when scraped: a ``prometheus_client`` child per job
and metric costs 0.6 KB (a histogram's 4.4 KB), which at 100,000 jobs would be most of a
replica's memory. The job gauges are read from the monitor's last watch at that moment.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fleetcron.errors import StoreError
from fleetcron.health import JobHealth
from fleetcron.models import ClaimResult
from fleetcron.queue_models import QueueStats
from fleetcron.stores.base import AsyncStore, Operation
from fleetcron.stores.wrapped import WrappedStore

if TYPE_CHECKING:
    from fleetcron.status import FleetStatus

__all__ = ["DURATION_BUCKETS", "InstrumentedStore", "JobMetrics", "Metrics"]

T = TypeVar("T")

# Seconds: from a quick job to a long batch (lock_at_most defaults to 10 minutes).
DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class JobMetrics:
    """The metrics labelled by job, as a ``prometheus_client`` collector.

    Counts are plain numbers in dictionaries, a job's run durations one array of bucket
    counts, and the fleet's verdict the tuple of the monitor's last watch: nothing per job
    beyond the numbers themselves. The scheduler's thread writes, a scrape (another
    thread) reads a copy of each dictionary, taken in one step."""

    _HELP: ClassVar[Mapping[str, str]] = {
        "slots_claimed": "Slots this replica claimed (attempts started).",
        "slots_skipped": "Slots this replica recorded skipped, by reason (previous_running, "
        "paused, abandoned, superseded).",
        "slots_missed": "Slots recorded missed (not started by their deadline).",
        "runs": "Runs this replica finished, by outcome.",
        "run_duration_seconds": "Duration of this replica's runs.",
        "job_lock_at_most_seconds": "The job's lock_at_most: compare the duration histogram "
        "against it.",
        "job_last_success_timestamp_seconds": "When a run of the job last succeeded (store "
        "clock, Unix seconds).",
        "job_overdue": "1 when no run succeeded since the slot whose grace passed.",
        "job_failing": "1 when the latest outcome is a failure.",
        "job_stuck": "1 when a run holds its slot far longer than usual.",
        "job_paused": "1 when the job is paused.",
    }

    def __init__(self, buckets: Iterable[float] = DURATION_BUCKETS) -> None:
        self.buckets = tuple(float(bound) for bound in buckets)
        self.claimed: dict[str, float] = {}
        self.missed: dict[str, float] = {}
        self.skipped: dict[tuple[str, str], float] = {}
        self.runs: dict[tuple[str, str], float] = {}
        # Per job: the count of each bucket (not cumulative), then +Inf's, then the sum.
        self.durations: dict[str, array[float]] = {}
        self.lock_at_most: dict[str, float] = {}
        self.health: tuple[JobHealth, ...] = ()
        self._values: dict[float, float] = {}  # one float object per distinct value

    def observe(self, job: str, seconds: float) -> None:
        """Count a run of ``job`` that lasted ``seconds``."""
        counts = self.durations.get(job)
        if counts is None:
            counts = self.durations[job] = array("d", bytes(8 * (len(self.buckets) + 2)))
        counts[bisect.bisect_left(self.buckets, seconds)] += 1
        counts[-1] += seconds

    def define(self, job: str, lock_at_most_s: float) -> None:
        """Record the job's ``lock_at_most``."""
        self.lock_at_most[job] = self._values.setdefault(lock_at_most_s, lock_at_most_s)

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (the registry checks their names once)."""
        return self._families()

    def collect(self) -> Iterator[Metric]:
        """Every family with its samples, built now."""
        return self._families(samples=True)

    def _families(self, *, samples: bool = False) -> Iterator[Metric]:
        prefix, help_ = "fleetcron_", self._HELP
        yield self._counter("slots_claimed", self.claimed if samples else {})
        yield self._counter("slots_skipped", self.skipped if samples else {}, "reason")
        yield self._counter("slots_missed", self.missed if samples else {})
        yield self._counter("runs", self.runs if samples else {}, "outcome")
        histogram = HistogramMetricFamily(
            prefix + "run_duration_seconds", help_["run_duration_seconds"], labels=["job"]
        )
        bounds = [repr(bound) for bound in self.buckets] + ["+Inf"]  # as prometheus_client
        for job, counts in self.durations.copy().items() if samples else ():
            counts = counts[:]  # one step: a run ending meanwhile changes the original
            cumulative, total = [], 0.0
            for bound, count in zip(bounds, counts, strict=False):
                total += count
                cumulative.append((bound, total))
            histogram.add_metric([job], cumulative, counts[-1])
        yield histogram
        lock = GaugeMetricFamily(
            prefix + "job_lock_at_most_seconds", help_["job_lock_at_most_seconds"], labels=["job"]
        )
        for job, seconds in self.lock_at_most.copy().items() if samples else ():
            lock.add_metric([job], seconds)
        yield lock
        yield from self._verdict(self.health if samples else ())

    def _counter(
        self, name: str, values: dict[str, float] | dict[tuple[str, str], float], *by: str
    ) -> Metric:
        counter = CounterMetricFamily("fleetcron_" + name, self._HELP[name], labels=["job", *by])
        for key, value in values.copy().items():
            counter.add_metric([key] if isinstance(key, str) else list(key), value)
        return counter

    def _verdict(self, health: tuple[JobHealth, ...]) -> Iterator[Metric]:
        prefix, help_ = "fleetcron_", self._HELP
        names = ("job_overdue", "job_failing", "job_stuck", "job_paused")
        gauges = [GaugeMetricFamily(prefix + name, help_[name], labels=["job"]) for name in names]
        last = GaugeMetricFamily(
            prefix + "job_last_success_timestamp_seconds",
            help_["job_last_success_timestamp_seconds"],
            labels=["job"],
        )
        for job in health:
            verdict = (job.overdue, job.failing, job.stuck, job.paused)
            for gauge, value in zip(gauges, verdict, strict=True):
                gauge.add_metric([job.job], int(value))
            if job.last_success_us is not None:
                last.add_metric([job.job], job.last_success_us / 1e6)
        yield from gauges
        yield last


class Metrics:
    """Every metric of one replica. ``registry`` is created when not given; expose it
    with ``prometheus_client`` (``--metrics HOST:PORT``, ``fleet.metrics_app()``). The
    metrics labelled by job are in :attr:`jobs` (:class:`JobMetrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.jobs = JobMetrics()
        r.register(self.jobs)
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
        jobs = self.jobs
        for answer in answers:
            if answer.run is not None:
                jobs.claimed[answer.job] = jobs.claimed.get(answer.job, 0.0) + 1
            elif answer.status == "missed":
                jobs.missed[answer.job] = jobs.missed.get(answer.job, 0.0) + 1

    def skipped(self, job: str, reason: str) -> None:
        skipped = self.jobs.skipped
        skipped[job, reason] = skipped.get((job, reason), 0.0) + 1

    def missed(self, job: str, count: int = 1) -> None:
        self.jobs.missed[job] = self.jobs.missed.get(job, 0.0) + count

    def finished(self, job: str, outcome: str, duration_s: float | None) -> None:
        runs = self.jobs.runs
        runs[job, outcome] = runs.get((job, outcome), 0.0) + 1
        if duration_s is not None:
            self.jobs.observe(job, duration_s)

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
        self.jobs.define(job, lock_at_most_us / 1e6)

    def watched(self, status: FleetStatus) -> None:
        """Publish what the monitor read (:mod:`fleetcron.scheduling.monitor`)."""
        self.health(status.jobs)

    def health(self, jobs: Iterable[JobHealth]) -> None:
        """Publish the fleet's verdict on each job (see the module docstring): these jobs'
        gauges replace the previous verdict's."""
        self.jobs.health = tuple(jobs)


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
