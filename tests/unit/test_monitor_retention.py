"""Retention in the background: the replica that watches the namespace deletes each of its
jobs' runs past the job's rule, a bounded number per pass, and reports (never deletes) job
rows no replica seems to define any more."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from fleetcron import Fleet
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.jobspec import DEFAULT_RETENTION, JobSpec, Retention
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.monitor import Monitor
from fleetcron.scheduling.retention import Pruner, store_retention
from fleetcron.stores.etcd.store import ETCD_RETENTION, AsyncEtcdStore, EtcdStore
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock
from unit.fakes import Recorded

NS = "ret"
MIN = 60_000_000
HOUR = 60 * MIN
T0 = 1_800_000_000_000_000


def job(name: str, **options: Any) -> JobSpec:
    return job_spec(name, where="test", every="1m", command=["true"], **options)


def fleet() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(wall_us=T0)
    return MemoryStore(clock=clock), clock


def record(store: MemoryStore, clock: FakeClock, name: str, count: int) -> list[int]:
    """``count`` finished (skipped) runs of ``name``, one a minute, each finished at once."""
    slots = []
    for _ in range(count):
        clock.advance(60)
        slot = clock.wall_us()
        assert store.run(store.ops.run_record(NS, name, slot, "skipped", None, "schedule"))
        slots.append(slot)
    return slots


def slots_of(store: MemoryStore, name: str) -> list[int]:
    return sorted(run.slot_us for run in store.run(store.ops.run_list(NS, name, 1000)))


def actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "action", "")) for r in caplog.records if r.name == "fleetcron"]


async def test_the_watching_replica_prunes_each_job_by_its_own_rule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = fleet()
    specs = {"a": job("a", retention="1h", retention_keep=2), "b": job("b")}
    a = record(store, clock, "a", 5)
    b = record(store, clock, "b", 5)
    clock.advance(2 * 3600)  # older than a's hour, far younger than b's 30 days
    young = record(store, clock, "a", 1)
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x", specs=specs, clock=clock)

    with caplog.at_level(logging.INFO, logger="fleetcron"):
        assert await monitor.watch() is not None
        result = await monitor.prune()

    assert result is not None
    assert result.pruned == {"a": 4}
    assert slots_of(store, "a") == [a[-1], *young], "the young one and the newest old one stay"
    assert slots_of(store, "b") == b
    assert actions(caplog).count("runs_pruned") == 1
    pruned = next(r for r in caplog.records if getattr(r, "action", "") == "runs_pruned")
    assert (pruned.levelno, getattr(pruned, "pruned", None)) == (logging.INFO, 4)


async def test_a_replica_that_does_not_watch_prunes_nothing() -> None:
    store, clock = fleet()
    specs = {"a": job("a", retention="1m", retention_keep=0)}
    record(store, clock, "a", 3)
    clock.advance(3600)
    watching = Monitor(AsyncMemoryStore(store), NS, "host:1:x", specs=specs, clock=clock)
    standby = Monitor(AsyncMemoryStore(store), NS, "host:2:y", specs=specs, clock=clock)
    assert await watching.watch() is not None
    assert await standby.watch() is None

    assert await standby.prune() is None
    assert len(slots_of(store, "a")) == 3
    assert await Monitor(AsyncMemoryStore(store), NS, "host:3:z").prune() is None, "no specs"
    assert len(slots_of(store, "a")) == 3


async def test_a_pass_deletes_a_bounded_number_of_rows_per_job() -> None:
    store, clock = fleet()
    specs = {"a": job("a", retention="1m", retention_keep=0), "b": job("b", retention="1m")}
    record(store, clock, "a", 7)
    record(store, clock, "b", 3)
    clock.advance(3600)
    pruner = Pruner(AsyncMemoryStore(store), NS, specs, limit=2, batches=2)

    first = await pruner.prune()
    assert first.pruned == {"a": 4}, "b keeps its newest 100"
    assert len(slots_of(store, "a")) == 3
    assert (await pruner.prune()).pruned == {"a": 3}
    assert (await pruner.prune()).pruned == {}


class _ShortLived(AsyncMemoryStore):
    """A store whose jobs keep a day and 3 runs unless they say otherwise (as etcd's)."""

    default_retention = Retention(older_than_us=24 * HOUR, keep=3)


async def test_a_job_without_its_own_rule_takes_the_stores_default() -> None:
    store, clock = fleet()
    specs = {"plain": job("plain"), "own": job("own", retention="30d")}
    plain = record(store, clock, "plain", 6)
    own = record(store, clock, "own", 6)
    clock.advance(2 * 24 * 3600)  # two days: past the store's day, within the job's 30
    pruner = Pruner(_ShortLived(store), NS, specs)

    assert store_retention(_ShortLived(store)) == Retention(older_than_us=24 * HOUR, keep=3)
    assert store_retention(AsyncMemoryStore(store)) == DEFAULT_RETENTION
    assert (await pruner.prune()).pruned == {"plain": 3}
    assert slots_of(store, "plain") == plain[-3:]
    assert slots_of(store, "own") == own, "its own 30 days; the store's keep of 3 is not used"


class _ShortLivedSync(MemoryStore):
    default_retention = Retention(older_than_us=24 * HOUR, keep=3)


def test_prune_runs_by_hand_through_a_sync_fleet_takes_the_stores_default() -> None:
    # `fleetcron prune --runs` opens a sync store and a sync Fleet over it: the default
    # must be seen through the async face the Fleet wraps it in.
    clock = FakeClock(wall_us=T0)
    store = _ShortLivedSync(clock=clock)
    store.run(store.ops.job_register(NS, [("plain", "{}", "fp")]))
    plain = record(store, clock, "plain", 6)
    clock.advance(2 * 24 * 3600)

    with Fleet(store, namespace=NS) as fleet:
        assert fleet.prune_runs() == {"plain": 3}
    assert slots_of(store, "plain") == plain[-3:]


def test_etcd_stores_keep_a_day_and_10_runs_unless_a_job_says_otherwise() -> None:
    assert store_retention(EtcdStore) == store_retention(AsyncEtcdStore) == ETCD_RETENTION
    assert ETCD_RETENTION == Retention(older_than_us=24 * HOUR, keep=10)
    assert job("j").retention_with(ETCD_RETENTION) == ETCD_RETENTION
    assert job("j", retention_keep=50).retention_with(ETCD_RETENTION).keep == 50


async def test_a_pass_stops_once_the_lease_is_lost() -> None:
    store, clock = fleet()
    specs = {name: job(name, retention="1m", retention_keep=0) for name in ("a", "b", "c")}
    for name in specs:
        record(store, clock, name, 2)
    clock.advance(3600)
    answers = iter([True, False])

    pruner = Pruner(AsyncMemoryStore(store), NS, specs, jobs_per_round_trip=1)
    result = await pruner.prune(lambda: next(answers, False))

    assert result.pruned == {"a": 2}
    assert not result.complete
    assert [len(slots_of(store, name)) for name in ("a", "b", "c")] == [0, 2, 2]


async def test_an_idle_job_no_replica_here_defines_is_reported_once_per_watch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = fleet()
    ops = store.ops
    store.run(ops.job_register(NS, [("gone", "{}", "fp1"), ("mine", "{}", "fp2")]))
    clock.advance(3 * 86_400)
    store.run(ops.job_register(NS, [("recent", "{}", "fp3")]))
    clock.advance(5 * 86_400)  # gone and mine idle for 8 days, recent for 5
    specs = {"mine": job("mine")}
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x", specs=specs, clock=clock)

    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        await monitor.watch()
        await monitor.prune()
        await monitor.prune()  # said once
        await monitor.stop()  # the next watch is a new session: said again
        await monitor.watch()
        await monitor.prune()

    orphaned = [r for r in caplog.records if getattr(r, "action", "") == "job_orphaned"]
    assert [getattr(r, "job", None) for r in orphaned] == ["gone", "gone"]
    assert orphaned[0].levelno == logging.WARNING
    assert getattr(orphaned[0], "last_seen_us", None) == T0
    assert "8d" in orphaned[0].getMessage()
    names = {row.job for row in store.run(ops.job_list(NS))}
    assert names == {"gone", "mine", "recent"}, "reported, never deleted"


async def test_a_job_that_still_runs_somewhere_is_not_an_orphan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = fleet()
    store.run(store.ops.job_register(NS, [("elsewhere", "{}", "fp")]))
    clock.advance(8 * 86_400)
    record(store, clock, "elsewhere", 1)  # another replica recorded a slot of it
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x", specs={}, clock=clock)

    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        await monitor.watch()
        await monitor.prune()

    assert "job_orphaned" not in actions(caplog)


async def test_the_monitor_prunes_at_once_then_every_retention_s_while_it_watches() -> None:
    store, clock = fleet()
    specs = {"a": job("a", retention="1m", retention_keep=0)}
    monitor = Monitor(
        AsyncMemoryStore(store),
        NS,
        "host:1:x",
        every_s=0.001,
        specs=specs,
        retention_s=600,
        clock=clock,
    )
    passes: list[int] = []

    async def next_pass() -> None:
        monitor.pruned.clear()
        await monitor.pruned.wait()
        passes.append(len(slots_of(store, "a")))

    async def watches(count: int) -> None:
        for _ in range(count):
            monitor.watched.clear()
            await monitor.watched.wait()

    record(store, clock, "a", 2)
    clock.advance(120)
    async with asyncio.timeout(10):
        waiting = asyncio.create_task(next_pass())
        monitor.start()
        try:
            await waiting
            record(store, clock, "a", 2)  # 2 minutes on: old by the rule, and
            clock.advance(120)  # 4 minutes after the first pass, under retention_s
            await watches(5)
            assert passes == [0], "no second pass before retention_s"
            assert len(slots_of(store, "a")) == 2
            waiting = asyncio.create_task(next_pass())
            await watches(1)
            clock.advance(360)
            await waiting
        finally:
            await monitor.stop()
    assert passes == [0, 0]


def test_a_negative_retention_period_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="retention_s must not be negative"):
        Monitor(AsyncMemoryStore(MemoryStore()), NS, "h", specs={}, retention_s=-1)


async def test_the_scheduler_gives_the_monitor_its_live_jobs_and_the_retention_period() -> None:
    store = AsyncMemoryStore(MemoryStore())
    jobs = [job("a", retention="2d")]
    scheduler = AsyncScheduler(store, jobs, SchedulerOptions(namespace=NS, retention_s=30))
    pruner = scheduler.monitor.pruner

    assert pruner is not None
    assert pruner.specs is scheduler.specs, "a reload reaches the next pass"
    assert scheduler.monitor.retention_s == 30
    off = AsyncScheduler(store, jobs, SchedulerOptions(namespace=NS, retention_s=0))
    assert off.monitor.pruner is None


async def test_a_pass_prunes_many_jobs_per_round_trip_and_asks_again_only_for_full_ones() -> None:
    store, clock = fleet()
    specs = {
        f"job{i:03d}": job(f"job{i:03d}", retention="1m", retention_keep=0) for i in range(450)
    }
    record(store, clock, "job007", 5)
    record(store, clock, "job300", 1)
    clock.advance(3600)
    counting = Recorded(store)

    result = await Pruner(counting, NS, specs, limit=2).prune()

    assert result.pruned == {"job007": 5, "job300": 1}
    # 450 jobs at 200 per round trip; then job007 (2 of its 5 went) twice more.
    assert [len(call["rules"]) for call in counting.calls["run_prune_jobs"]] == [200, 200, 50, 1, 1]
    assert slots_of(store, "job007") == []
