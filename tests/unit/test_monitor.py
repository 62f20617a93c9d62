"""The monitor: one replica watches the namespace's jobs and says each change once."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetcron.alerts import Alert
from fleetcron.metrics import Metrics
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.monitor import Monitor
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock
from passes import until_signalled
from unit.test_scheduler import spec

NS = "mon"
MIN = 60_000_000
T0 = 1_800_000_000_000_000  # on a minute boundary


def _fleet() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(wall_us=T0)
    store = MemoryStore(clock=clock)
    definition = {"schedule": {"kind": "every", "every_us": 5 * MIN}, "timezone": "UTC"}
    store.run(store.ops.job_register(NS, [("report", json.dumps(definition), "f" * 32)]))
    return store, clock


def _actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "action", "")) for r in caplog.records if r.name == "fleetcron"]


async def test_an_overdue_job_is_said_once_per_slot_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = _fleet()
    alerts: list[Alert] = []
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:secret", on_alert=alerts.append)
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        assert (await monitor.watch()) is not None
        assert alerts == []
        clock.advance(11 * 60)  # the slot T0+5m had until T0+10m
        await monitor.watch()
        await monitor.watch()  # nothing new: said once
        clock.advance(5 * 60)  # the next slot passes its grace too: said again
        await monitor.watch()
        store.run(store.ops.job_set_paused(NS, "report", True))
        await monitor.watch()
    assert [a.event for a in alerts] == ["overdue", "overdue", "recovered"]
    assert [a.slot_us for a in alerts[:2]] == [T0 + 5 * MIN, T0 + 10 * MIN]
    assert _actions(caplog) == ["job_overdue", "job_overdue", "job_recovered"]


async def test_a_job_registered_just_now_and_backfilled_raises_no_alert() -> None:
    clock = FakeClock(wall_us=T0 + 22 * MIN)  # 22 minutes past an hour
    store = MemoryStore(clock=clock)
    hourly = {"schedule": {"kind": "every", "every_us": 60 * MIN}, "grace_us": 10 * MIN}
    store.run(store.ops.job_register(NS, [("hourly", json.dumps(hourly), "f" * 32)]))
    days_ago = [T0 - k * 60 * MIN for k in range(72, 47, -1)]
    assert store.run(store.ops.run_backfill(NS, "hourly", days_ago)) == len(days_ago)
    alerts: list[Alert] = []
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:secret", on_alert=alerts.append)
    status = await monitor.watch()
    assert status is not None
    assert [(h.job, h.state) for h in status.jobs] == [("hourly", "ok")]
    assert alerts == []
    clock.advance(60 * 60)  # the slot T0+1h passes its grace with no success: now it is
    await monitor.watch()
    assert [(a.event, a.slot_us) for a in alerts] == [("overdue", T0 + 60 * MIN)]


async def test_what_was_said_survives_a_change_of_watcher() -> None:
    store, clock = _fleet()
    said: list[tuple[str, str, int | None]] = []

    def watcher(name: str) -> Monitor:
        return Monitor(
            AsyncMemoryStore(store),
            NS,
            f"{name}:1:token",
            on_alert=lambda alert: said.append((name, alert.event, alert.slot_us)),
        )

    first = watcher("a")
    clock.advance(11 * 60)
    await first.watch()
    await first.stop()
    second = watcher("b")  # another replica, or the same one restarted
    await second.watch()  # the slot T0+5m was said already: nothing
    clock.advance(5 * 60)
    await second.watch()  # a later slot is a new alert
    clock.advance(60)  # the second stops without a word: its lease (45 s) expires
    third = watcher("c")
    await third.watch()
    store.run(store.ops.job_set_paused(NS, "report", True))
    await third.watch()
    await third.watch()
    assert said == [
        ("a", "overdue", T0 + 5 * MIN),
        ("b", "overdue", T0 + 10 * MIN),
        ("c", "recovered", None),
    ]
    assert await second.watch() is None, "the third one watches now"


async def test_only_the_replica_holding_the_monitor_lease_watches() -> None:
    store, _clock = _fleet()
    first = Monitor(AsyncMemoryStore(store), NS, "host:1:a")
    second = Monitor(AsyncMemoryStore(store), NS, "host:2:b")
    assert await first.watch() is not None
    assert await second.watch() is None
    assert first.watching
    assert not second.watching
    await first.stop()  # hands the lease back: the other one takes over at once
    assert await second.watch() is not None


async def test_the_watch_is_published_as_metrics() -> None:
    store, clock = _fleet()
    metrics = Metrics()
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:a", on_status=metrics.watched)
    clock.advance(11 * 60)
    await monitor.watch()
    exposed = generate_latest(metrics.registry).decode()
    samples = {
        (sample.name, sample.labels.get("job")): sample.value
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
    }
    assert samples[("fleetcron_job_overdue", "report")] == 1
    assert samples[("fleetcron_job_failing", "report")] == 0
    assert samples[("fleetcron_job_paused", "report")] == 0


async def test_a_running_scheduler_counts_its_claims_runs_and_store_operations() -> None:
    store = MemoryStore()
    metrics = Metrics()
    failing = spec("boom", lambda ctx: 1 / 0)
    fine = spec("fine", lambda ctx: None)
    options = SchedulerOptions(namespace=NS, shutdown_grace_s=1.0, kill_grace_s=0.5)
    scheduler = AsyncScheduler(AsyncMemoryStore(store), [failing, fine], options, metrics=metrics)

    def value(name: str, **labels: str) -> float:
        found = metrics.registry.get_sample_value(name, labels)
        return found if found is not None else 0.0

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled(
            [scheduler],
            lambda: (
                value("fleetcron_runs_total", job="fine", outcome="succeeded") >= 2
                and value("fleetcron_runs_total", job="boom", outcome="failed") >= 2
            ),
        )
    finally:
        scheduler.stop()
        await task
    assert value("fleetcron_slots_claimed_total", job="fine") >= 2
    assert value("fleetcron_run_duration_seconds_count", job="fine") >= 2
    assert value("fleetcron_job_lock_at_most_seconds", job="fine") == 600
    assert value("fleetcron_store_operation_seconds_count", operation="run_claim") >= 1
    assert value("fleetcron_runs_in_flight") == 0
    assert value("fleetcron_store_up") == 1
