"""The metrics labelled by job hold numbers, not a ``prometheus_client`` object per job and
metric (a histogram child alone is 4.4 KB: 440 MB at 100,000 jobs), and expose the same
samples as those objects did."""

from __future__ import annotations

import gc
import tracemalloc

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetcron.metrics import DURATION_BUCKETS, Metrics
from fleetcron.models import ClaimResult, RunRecord

JOBS = 2_000


def run_of(job: str) -> RunRecord:
    return RunRecord(
        namespace="ns",
        job=job,
        slot_us=1,
        state="running",
        attempt=1,
        fence=1,
        holder="h",
        run_id="r",
        trigger="schedule",
        started_us=1,
        finished_us=None,
        expires_us=2,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=None,
        output=None,
        now_us=1,
    )


def test_a_job_costs_its_metrics_a_few_hundred_bytes() -> None:
    metrics = Metrics()
    names = [f"job-{i:05d}" for i in range(JOBS)]
    claims = [
        ClaimResult(job=name, slot_us=1, status="claimed", run=run_of(name)) for name in names
    ]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for name in names:
            metrics.job_defined(name, 600_000_000)
        metrics.claimed(claims)
        for name in names:
            metrics.finished(name, "succeeded", 1.5)
            metrics.skipped(name, "paused")
        per_job = (tracemalloc.get_traced_memory()[0] - before) / JOBS
    finally:
        tracemalloc.stop()

    assert per_job < 1_200, f"{per_job:.0f} bytes of metrics per job"


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exposed = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
    }


def test_the_job_metrics_expose_counts_and_a_histogram_per_job() -> None:
    metrics = Metrics()
    metrics.job_defined("a", 30_000_000)
    metrics.claimed([ClaimResult(job="a", slot_us=1, status="claimed", run=run_of("a"))])
    metrics.claimed([ClaimResult(job="b", slot_us=1, status="missed")])
    metrics.missed("b", 3)
    metrics.skipped("a", "previous_running")
    for seconds in (0.05, 0.5, 2.0, 100_000.0):
        metrics.finished("a", "succeeded", seconds)
    metrics.finished("a", "lost", None)

    found = samples(metrics)

    assert found["fleetcron_job_lock_at_most_seconds", (("job", "a"),)] == 30
    assert found["fleetcron_slots_claimed_total", (("job", "a"),)] == 1
    assert found["fleetcron_slots_missed_total", (("job", "b"),)] == 4
    assert (
        found["fleetcron_slots_skipped_total", (("job", "a"), ("reason", "previous_running"))] == 1
    )
    assert found["fleetcron_runs_total", (("job", "a"), ("outcome", "succeeded"))] == 4
    assert found["fleetcron_runs_total", (("job", "a"), ("outcome", "lost"))] == 1
    buckets = {
        labels[1][1]: value
        for (name, labels), value in found.items()
        if name == "fleetcron_run_duration_seconds_bucket"
    }
    assert len(buckets) == len(DURATION_BUCKETS) + 1
    cumulative = [buckets[bound] for bound in ("0.1", "0.5", "1.0", "2.5", "21600.0", "+Inf")]
    assert cumulative == [1, 2, 2, 3, 3, 4]
    assert found["fleetcron_run_duration_seconds_count", (("job", "a"),)] == 4
    assert found["fleetcron_run_duration_seconds_sum", (("job", "a"),)] == 100_002.55
