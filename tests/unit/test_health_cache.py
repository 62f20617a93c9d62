"""The monitor judges a job again only when its rows changed or its health may have
changed with time: the health it keeps is the health a fresh read gives, and an idle
watch judges no job."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcron.health import JobHealth, assess, unchanged_until
from fleetcron.health_cache import FULL_EVERY_US, HealthCache
from fleetcron.metrics import Metrics
from fleetcron.models import JobRecord, RunOutcome, RunRecord, SlotClaim
from fleetcron.schedules import schedule_from_definition
from fleetcron.scheduling.monitor import Monitor
from fleetcron.status import read_status, read_status_in_turns
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock

NS = "cache"
S = 1_000_000
MIN = 60 * S
T0 = 1_800_000_000 * S  # on a minute boundary

SCHEDULES: list[Mapping[str, object]] = [
    {"kind": "every", "every_us": 5 * MIN},
    {"kind": "every", "every_us": 30 * S},
    {"kind": "cron", "expression": "*/7 * * * *", "timezone": "UTC"},
    {"kind": "cron", "expression": "30 2 * * *", "timezone": "Europe/Berlin"},
    {"kind": "cron", "expression": "0 * * * *", "timezone": "America/New_York"},
]


def definition(schedule: Mapping[str, object], **extra: object) -> str:
    return json.dumps({"schedule": dict(schedule), "timezone": "UTC", **extra})


# -- unchanged_until: assess gives the same verdict until then --------------------------


def _row(text: str, now: int, **fields: object) -> JobRecord:
    values: dict[str, object] = {
        "namespace": NS,
        "job": "j",
        "paused": False,
        "definition": text,
        "fingerprint": "f" * 32,
        "high_water_us": None,
        "last_success_us": None,
        "last_failure_us": None,
        "updated_us": T0,
        "now_us": now,
    }
    values.update(fields)
    return JobRecord(**values)  # type: ignore[arg-type]


def _run(slot: int, state: str, took: int, expires: int | None) -> RunRecord:
    final = state not in ("running", "queued")
    return RunRecord(
        namespace=NS,
        job="j",
        slot_us=slot,
        state=state,
        attempt=1,
        fence=slot,
        holder="host:1",
        run_id="r",
        trigger="schedule",
        started_us=None if state == "skipped" else slot,
        finished_us=slot + took if final and state != "skipped" else None,
        expires_us=expires,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error="previous run still running" if state == "skipped" else None,
        output=None,
        now_us=slot,
    )


def _verdict(health: JobHealth) -> JobHealth:
    """The health without the moment it was read at (a kept health keeps its own)."""

    def plain(run: RunRecord | None) -> RunRecord | None:
        return None if run is None else replace(run, now_us=0)

    return replace(health, now_us=0, running=plain(health.running), last_run=plain(health.last_run))


@settings(max_examples=300, deadline=None)
@given(
    schedule=st.sampled_from(SCHEDULES),
    grace=st.sampled_from([None, 30 * S, 5 * MIN, 3 * 60 * MIN]),
    stuck_after=st.sampled_from([None, 2 * MIN]),
    age=st.integers(0, 3 * 24 * 60 * MIN),
    success=st.one_of(st.none(), st.integers(-2 * 24 * 60 * MIN, 0)),
    failure=st.one_of(st.none(), st.integers(-2 * 24 * 60 * MIN, 0)),
    paused=st.booleans(),
    ledger=st.lists(
        st.tuples(
            st.integers(1, 3 * 24 * 60 * MIN),
            st.sampled_from(["succeeded", "failed", "skipped", "running", "queued"]),
            st.integers(S, 20 * MIN),
        ),
        max_size=6,
    ),
    steps=st.lists(st.integers(0, 2 * 24 * 60 * MIN), min_size=1, max_size=5),
)
def test_assess_judges_the_same_until_unchanged_until(
    schedule: Mapping[str, object],
    grace: int | None,
    stuck_after: int | None,
    age: int,
    success: int | None,
    failure: int | None,
    paused: bool,
    ledger: list[tuple[int, str, int]],
    steps: list[int],
) -> None:
    now = T0 + age
    text = definition(schedule, grace_us=grace, stuck_after_us=stuck_after)
    row = _row(
        text,
        now,
        paused=paused,
        last_success_us=None if success is None else now + success,
        last_failure_us=None if failure is None else now + failure,
    )
    runs = sorted(
        (
            _run(T0 + offset, state, took, T0 + offset + took if state == "running" else None)
            for offset, state, took in ledger
            if offset <= age
        ),
        key=lambda run: -run.slot_us,
    )
    health = assess(row, runs, now_us=now)
    until = unchanged_until(row, runs, health)
    assert until is None or until >= now
    for step in steps:
        later = now + step
        if until is not None and later >= until:
            continue
        assert _verdict(assess(row, runs, now_us=later)) == _verdict(health), (later, until)


def test_an_idle_daily_job_is_kept_until_its_slot() -> None:
    schedule: Mapping[str, object] = {"kind": "cron", "expression": "30 2 * * *", "timezone": "UTC"}
    now = T0 + 5 * MIN
    row = _row(definition(schedule), now, last_success_us=now - MIN)
    health = assess(row, [], now_us=now)
    until = unchanged_until(row, [], health)
    assert until == health.next_slot_us == schedule_from_definition(schedule).next_after(now)
    running = [_run(now - MIN, "running", MIN, now + 5 * MIN)]
    assert unchanged_until(row, running, assess(row, running, now_us=now)) == now


# -- the monitor's reads: what it keeps is what a fresh read says -----------------------


def _store(jobs: int) -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(wall_us=T0)
    store = MemoryStore(clock=clock)
    rows = [
        (
            f"job-{i:03d}",
            definition(
                SCHEDULES[i % len(SCHEDULES)],
                grace_us=[None, 2 * MIN][i % 2],
                stuck_after_us=[None, 3 * MIN][i % 3 == 0],
            ),
            "f" * 32,
        )
        for i in range(jobs)
    ]
    store.run(store.ops.job_register(NS, rows))
    return store, clock


def _by_job(healths: tuple[JobHealth, ...]) -> dict[str, JobHealth]:
    return {health.job: _verdict(health) for health in healths}


@pytest.mark.parametrize("seed", range(6))
async def test_a_kept_health_is_what_a_fresh_read_gives(seed: int) -> None:
    rng = random.Random(seed)
    store, clock = _store(12)
    names = [f"job-{i:03d}" for i in range(12)]
    schedules = {
        name: schedule_from_definition(SCHEDULES[i % len(SCHEDULES)])
        for i, name in enumerate(names)
    }
    cache = HealthCache()
    astore = AsyncMemoryStore(store)
    ops = store.ops
    for step in range(120):
        clock.advance(rng.choice([0, 1, 20, 45, 90, 400, 3600]))
        now = store.run(ops.store_now())
        job = rng.choice(names)
        action = rng.random()
        if action < 0.3:  # a replica claims the job's latest slot
            slot = schedules[job].at_or_before(now)
            if slot is not None:
                claim = SlotClaim(
                    job=job, slot_us=slot, run_id=f"r{step}", exclusive=rng.random() < 0.8
                )
                store.run(ops.run_claim(NS, [claim], "host:1:t", rng.choice([MIN, 10 * MIN])))
        elif action < 0.55:  # a run in progress ends
            running = [r for r in store.run(ops.run_list(NS, job, 5)) if r.state == "running"]
            for run in running[:1]:
                outcome = RunOutcome(
                    state=rng.choice(["succeeded", "succeeded", "failed", "cancelled"])
                )
                store.run(ops.run_finish(NS, job, run.slot_us, run.fence, outcome))
        elif action < 0.65:  # or is extended
            running = [r for r in store.run(ops.run_list(NS, job, 5)) if r.state == "running"]
            for run in running[:1]:
                store.run(ops.run_extend(NS, job, run.slot_us, run.fence, 10 * MIN))
        elif action < 0.72:
            store.run(ops.job_set_paused(NS, job, rng.random() < 0.5))
        elif action < 0.8:  # a slot skipped: the previous run still ran
            slot = schedules[job].at_or_before(now)
            if slot is not None:
                store.run(
                    ops.run_record(
                        NS, job, slot, "skipped", "previous run still running", "schedule"
                    )
                )
        elif action < 0.85:  # fleetcron trigger: a manual run queued now
            store.run(ops.run_record(NS, job, now, "queued", None, "manual"))
        kept = await read_status_in_turns(astore, NS, queues=False, cache=cache)
        fresh = store.run(read_status(ops, NS, queues=False))
        assert _by_job(kept.jobs) == _by_job(fresh.jobs), (seed, step)
        assert [h.job for h in kept.jobs] == [h.job for h in fresh.jobs]
        assert kept.totals == fresh.totals


async def test_an_idle_watch_judges_no_job_again() -> None:
    store, clock = _store(300)
    metrics = Metrics()
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x", on_status=metrics.watched)
    assert await monitor.watch() is not None
    assert monitor.cache.judged == 300
    assert len(metrics.jobs.health) == 300  # the gauges are built from it when scraped
    for _ in range(3):
        clock.advance(15)  # nothing written, no slot reached: the jobs' 30 s slots aside
        status = await monitor.watch()
        assert status is not None
        assert len(status.jobs) == 300
        every_30s = sum(1 for i in range(300) if i % len(SCHEDULES) == 1)
        assert monitor.cache.judged <= every_30s
    clock.advance(30)
    await monitor.watch()
    # Only what was judged again since: the 30 s jobs, whose slot came.
    assert 0 < monitor.cache.judged <= every_30s


async def test_a_job_is_judged_again_when_a_run_of_it_starts_and_ends() -> None:
    store, clock = _store(50)
    ops = store.ops
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x")
    await monitor.watch()
    clock.advance(1)
    await monitor.watch()
    baseline = monitor.cache.judged  # the 30 s jobs whose slot came, if any
    job = "job-000"  # every 5 minutes
    slot = schedule_from_definition(SCHEDULES[0]).at_or_before(store.run(ops.store_now()))
    assert slot is not None
    [answer] = store.run(
        ops.run_claim(NS, [SlotClaim(job=job, slot_us=slot, run_id="r")], "host:1:t", MIN)
    )
    assert answer.run is not None
    await monitor.watch()
    assert monitor.last is not None
    assert {h.job: h.state for h in monitor.last.jobs}[job] == "running"
    assert monitor.cache.judged == baseline + 1
    store.run(ops.run_finish(NS, job, slot, answer.run.fence, RunOutcome(state="failed")))
    await monitor.watch()
    assert {h.job: h.state for h in monitor.last.jobs}[job] == "failing"
    assert monitor.cache.judged == baseline + 1
    await monitor.watch()
    assert monitor.cache.judged == baseline


async def test_every_job_is_judged_again_after_a_full_period_or_a_new_term() -> None:
    store, clock = _store(20)
    cache = HealthCache(full_every_us=FULL_EVERY_US)
    astore = AsyncMemoryStore(store)
    await read_status_in_turns(astore, NS, queues=False, cache=cache)
    assert cache.judged == 20
    # A slot queued in the past (a backfill) shows in neither the row nor the lease.
    store.run(store.ops.run_backfill(NS, "job-003", [T0 - 24 * 60 * MIN]))
    clock.advance(FULL_EVERY_US / S)
    await read_status_in_turns(astore, NS, queues=False, cache=cache)
    assert cache.judged == 20
    cache.clear()
    await read_status_in_turns(astore, NS, queues=False, cache=cache)
    assert cache.judged == 20
