"""The scheduler on the in-memory store: exactly once across replicas, and each policy.

Schedules here are a few hundred milliseconds apart. A test runs its replicas until the
ledger shows what it is about (checked after every pass of a replica, the scheduler's
``ticked`` signal), never for a fixed time; the assertions are about the ledger, never
about timings.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fleetcron import Fleet, keepalive, slot_lease
from fleetcron.clock import SYSTEM_CLOCK
from fleetcron.context import RunContext
from fleetcron.errors import ConfigurationError, StoreUnavailable
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec
from fleetcron.models import RunOutcome, RunRecord, SlotClaim
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions, StoreOutage
from fleetcron.scheduling import claiming, planning
from fleetcron.stores.ledger import MISSED_ERROR
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled
from unit.fakes import Recorded

NS = "sched"


def spec(name: str, func: Callable[..., Any], **options: Any) -> JobSpec:
    options.setdefault("every", "200ms")
    return job_spec(name, where="test", call=func, **options)


async def run_replicas(
    store: MemoryStore,
    jobs: Sequence[JobSpec],
    until: Callable[[], bool],
    replicas: int = 2,
    **options: Any,
) -> list[AsyncScheduler]:
    """Run ``replicas`` schedulers until ``until()`` holds, then stop them all."""
    options.setdefault("shutdown_grace_s", 1.0)
    options.setdefault("kill_grace_s", 0.5)
    schedulers = [
        AsyncScheduler(AsyncMemoryStore(store), jobs, SchedulerOptions(namespace=NS, **options))
        for _ in range(replicas)
    ]
    tasks = [asyncio.create_task(s.run()) for s in schedulers]
    try:
        await until_signalled(schedulers, until)
    finally:
        for scheduler in schedulers:
            scheduler.stop()
        await asyncio.gather(*tasks)
    return schedulers


def states(store: MemoryStore, job: str) -> list[str]:
    return [r.state for r in ledger(store, job)]


def ledger(store: MemoryStore, job: str | None = None) -> list[RunRecord]:
    return store.run(store.ops.run_list(NS, job, 10_000))


async def test_every_slot_runs_exactly_once_across_three_replicas() -> None:
    store = MemoryStore()
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(ctx: RunContext) -> None:
        with lock:
            seen.append((ctx.slot_us, ctx.fence))

    await run_replicas(
        store, [spec("tick", work)], lambda: states(store, "tick").count("succeeded") >= 4, 3
    )

    slots = [slot for slot, _ in seen]
    assert len(slots) >= 4
    assert len(slots) == len(set(slots))  # no slot ran twice
    rows = ledger(store, "tick")
    assert sorted(r.slot_us for r in rows if r.state == "succeeded") == sorted(slots)
    fences = [fence for _, fence in sorted(seen)]
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)
    # consecutive slots 200ms apart: nothing was skipped between the first and the last
    assert max(slots) - min(slots) == 200_000 * (len(slots) - 1)


async def test_a_slot_whose_previous_run_still_runs_is_recorded_as_skipped() -> None:
    store = MemoryStore()

    async def slow(ctx: RunContext) -> None:
        await asyncio.sleep(0.5)

    await run_replicas(
        store,
        [spec("slow", slow, overlap="skip")],
        lambda: {"succeeded", "skipped"} <= set(states(store, "slow")),
    )

    seen = states(store, "slow")
    assert "succeeded" in seen
    assert "skipped" in seen
    skipped = [r for r in ledger(store, "slow") if r.state == "skipped"]
    assert all("still running" in (r.error or "") for r in skipped)


async def test_overlap_allow_runs_slots_concurrently() -> None:
    store = MemoryStore()
    active = 0
    most = 0

    async def slow(ctx: RunContext) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.5)
        active -= 1

    await run_replicas(store, [spec("wide", slow, overlap="allow")], lambda: most >= 2)

    assert most >= 2
    assert "skipped" not in [r.state for r in ledger(store, "wide")]


@pytest.mark.parametrize("catchup", ["latest", "all", "skip"])
async def test_slots_missed_while_every_replica_was_down_follow_the_catchup_policy(
    catchup: str,
) -> None:
    store = MemoryStore()
    job = spec("report", lambda ctx: None, every="1m", catchup=catchup, catchup_window="1h")
    now = store.clock.wall_us()
    last_minute = now - now % 60_000_000
    # The fleet last handled the slot five minutes before the current one.
    last_done = last_minute - 5 * 60_000_000
    store.run(store.ops.run_record(NS, "report", last_done, "succeeded", None, "schedule"))
    backlog = [last_done + k * 60_000_000 for k in range(1, 6)]  # ends with the current slot

    def settled() -> bool:
        rows = {r.slot_us: r.state for r in ledger(store, "report")}
        return all(rows.get(slot) in ("succeeded", "missed") for slot in backlog)

    await run_replicas(store, [job], settled, replicas=2)

    rows = {r.slot_us: r for r in ledger(store, "report") if r.slot_us != last_done}
    assert set(backlog) <= set(rows)  # every slot since the last one is accounted for
    ran = [slot for slot in backlog if rows[slot].state == "succeeded"]
    assert all(rows[slot].state in ("succeeded", "missed") for slot in backlog)
    # A slot that came while the test ran (a minute boundary) is on time: it just runs.
    assert all(rows[slot].state == "succeeded" for slot in rows if slot > backlog[-1])
    if catchup == "all":
        assert ran == backlog
    elif catchup == "latest":
        assert ran == [backlog[-1]]  # only the newest missed slot runs
    else:
        for slot in ran:  # only an on-time slot may run; late ones are missed
            started = rows[slot].started_us
            assert started is not None
            assert started - slot <= 6_000_000
        assert len(ran) <= 1


@pytest.mark.parametrize("catchup", ["latest", "all", "skip"])
async def test_after_a_short_outage_one_rule_says_which_slot_is_on_time(catchup: str) -> None:
    # Every replica was down for 3 s, a slot every 200 ms: 15 slots came due, every one of
    # them within the 5 s late tolerance. Only the newest is on time (a newer slot came
    # after each of the others); what happens to the others is the catch-up policy's call,
    # and a slot that comes due while the backlog drains is never skipped behind it.
    store = MemoryStore()

    async def quick(ctx: RunContext) -> None:
        await asyncio.sleep(0.02)

    job = spec("tick", quick, every="200ms", catchup=catchup, catchup_window="1h")
    now = store.clock.wall_us()
    last_done = now - now % 200_000 - 3_000_000
    store.run(store.ops.run_record(NS, "tick", last_done, "succeeded", None, "schedule"))
    backlog = [last_done + k * 200_000 for k in range(1, 16)]
    after_start: list[int] = []

    def settled() -> bool:
        rows = {r.slot_us: r.state for r in ledger(store, "tick")}
        after_start[:] = [s for s, state in rows.items() if s > backlog[-1]]
        done = all(rows.get(slot) not in (None, "queued", "running") for slot in backlog)
        return done and sum(rows[s] == "succeeded" for s in after_start) >= 3

    await run_replicas(store, [job], settled, replicas=2)

    rows = {r.slot_us: r for r in ledger(store, "tick") if r.slot_us != last_done}
    report = [(slot, r.state, r.error) for slot, r in sorted(rows.items())]
    assert all(rows[slot].state in ("succeeded", "missed") for slot in backlog), report
    ran = [slot for slot in backlog if rows[slot].state == "succeeded"]
    if catchup == "all":
        assert ran == backlog, report
        # Nothing is skipped behind the backlog: a slot that came due before its last run
        # ended waits its turn (later, the job's overlap policy applies as usual).
        drained = rows[backlog[-1]].finished_us
        assert drained is not None
        behind = [r for slot, r in rows.items() if slot <= drained and r.state == "skipped"]
        assert not behind, report
    else:
        # Only the newest slot due at the restart may run; the older ones are missed.
        assert len(ran) <= 1, report
        assert ran == backlog[-1:] or catchup == "skip", report
        assert all(rows[slot].state == "missed" for slot in backlog[:-1]), report


async def test_a_restart_says_the_slots_missed_while_no_replica_ran_in_one_line_per_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    jobs = [spec(name, lambda ctx: None, every="200ms", catchup="latest") for name in ("a", "b")]
    now = store.clock.wall_us()
    last_done = now - now % 200_000 - 3_000_000
    for job in jobs:
        store.run(store.ops.run_record(NS, job.name, last_done, "succeeded", None, "schedule"))

    def missed(name: str) -> list[RunRecord]:
        return [r for r in ledger(store, name) if r.state == "missed"]

    with caplog.at_level(logging.INFO, logger="fleetcron"):
        await run_replicas(store, jobs, lambda: all(len(missed(j.name)) >= 13 for j in jobs))

    for job in jobs:
        lines = [
            r.getMessage()
            for r in caplog.records
            if getattr(r, "action", None) == "slot_missed" and getattr(r, "job", None) == job.name
        ]
        count = len(missed(job.name))
        assert len(lines) == 1, lines
        assert f"{job.name}: {count} slots missed while no replica ran (" in lines[0], lines
        assert lines[0].endswith("catchup = latest"), lines
        assert all(r.error == MISSED_ERROR for r in missed(job.name))


async def test_a_replica_that_falls_behind_records_late_slots_missed_instead_of_running_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleetcron")
    tolerance = 300_000
    monkeypatch.setattr(planning, "LATE_TOLERANCE_US", tolerance)
    store = MemoryStore()

    async def slow(ctx: RunContext) -> None:
        await asyncio.sleep(0.45)

    # Room for one run at a time, a slot every 200 ms that takes 450 ms: it falls behind.
    job = spec("slow", slow, overlap="allow", catchup="skip")
    await run_replicas(
        store,
        [job],
        lambda: {"succeeded", "missed"} <= set(states(store, "slow")),
        replicas=1,
        concurrency=1,
    )

    rows = ledger(store, "slow")
    ran = [r for r in rows if r.state == "succeeded"]
    missed = [r for r in rows if r.state == "missed"]
    assert ran
    assert missed
    assert {r.state for r in rows} <= {"succeeded", "missed"}
    assert all(r.error == MISSED_ERROR and r.attempt == 0 for r in missed)
    said = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "slot_missed"]
    assert said
    assert all(" missed behind schedule: " in line for line in said), said
    assert all(line.endswith("catchup = skip") for line in said), said
    for run in ran:  # nothing started past its deadline: on time or not at all
        assert run.started_us is not None
        assert run.started_us - run.slot_us <= tolerance


async def test_a_failed_run_is_retried_with_the_next_attempt_and_a_higher_fence() -> None:
    store = MemoryStore()
    attempts: dict[int, list[tuple[int, int]]] = {}

    def flaky(ctx: RunContext) -> None:
        attempts.setdefault(ctx.slot_us, []).append((ctx.attempt, ctx.fence))
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    job = spec("flaky", flaky, every="300ms", overlap="allow", retries=1, retry_backoff="100ms")

    def retried_and_recorded() -> bool:
        rows = ledger(store, "flaky")
        return any(r.state == "succeeded" and r.attempt == 2 for r in rows)

    await run_replicas(store, [job], retried_and_recorded)

    retried = {slot: tries for slot, tries in attempts.items() if len(tries) == 2}
    assert retried, attempts
    recorded = 0
    for slot, ((first, fence1), (second, fence2)) in retried.items():
        assert (first, second) == (1, 2)
        assert fence2 > fence1
        row = store.run(store.ops.run_get(NS, "flaky", slot))
        assert row is not None
        # The replicas may have stopped while a second attempt was being recorded.
        if row.state == "succeeded":
            assert row.attempt == 2
            recorded += 1
    assert recorded
    assert all(len(tries) <= 2 for tries in attempts.values())  # retries = 1: two attempts


async def test_fleet_job_decorator_runs_in_a_background_thread_until_stop() -> None:
    store = MemoryStore()
    fleet = Fleet(store, namespace=NS)
    ran = threading.Event()

    @fleet.job(every="200ms")
    def ping(ctx: RunContext) -> None:
        ran.set()

    fleet.start()
    try:
        assert await asyncio.to_thread(ran.wait, 5)
    finally:
        fleet.stop()
    assert any(r.state == "succeeded" for r in ledger(store, "ping"))


async def test_a_replica_recovers_its_own_due_rows_behind_many_of_jobs_it_does_not_run() -> None:
    store = MemoryStore()
    now = store.clock.wall_us()
    # 300 queued rows of a job no replica defines any more, all older than our own.
    for k in range(300):
        slot = now - 3_600_000_000 + k * 1_000_000
        store.run(store.ops.run_record(NS, "removed", slot, "queued", None, "manual"))
    ours = now - 60_000_000
    store.run(store.ops.run_record(NS, "daily", ours, "queued", None, "manual"))
    seen: list[int] = []

    def ran_ours() -> bool:
        row = store.run(store.ops.run_get(NS, "daily", ours))
        return row is not None and row.state == "succeeded"

    await run_replicas(
        store, [spec("daily", lambda ctx: seen.append(ctx.slot_us), every="1h")], ran_ours
    )

    assert seen == [ours]
    row = store.run(store.ops.run_get(NS, "daily", ours))
    assert row is not None
    assert (row.state, row.trigger) == ("succeeded", "manual")
    assert all(r.state == "queued" for r in ledger(store, "removed"))


async def test_a_paused_job_is_not_run_and_its_slots_are_recorded_as_skipped() -> None:
    store = MemoryStore()
    calls: list[int] = []
    job = spec("quiet", lambda ctx: calls.append(ctx.slot_us))
    store.run(store.ops.job_register(NS, [("quiet", "{}", job.fingerprint())]))
    store.run(store.ops.job_set_paused(NS, "quiet", True))

    await run_replicas(store, [job], lambda: len(ledger(store, "quiet")) >= 2)

    assert calls == []
    rows = ledger(store, "quiet")
    assert rows
    assert all(r.state == "skipped" and r.error == "job paused" for r in rows)


async def test_a_run_past_its_timeout_is_cancelled_and_recorded_as_failed() -> None:
    store = MemoryStore()

    async def stuck(ctx: RunContext) -> None:
        await asyncio.sleep(30)

    await run_replicas(
        store,
        [spec("stuck", stuck, every="1s", timeout="200ms")],
        lambda: "failed" in states(store, "stuck"),
    )

    failed = [r for r in ledger(store, "stuck") if r.state == "failed"]
    assert failed
    assert all(r.error == "timed out" for r in failed)


class Unplugged(AsyncMemoryStore):
    """An async store whose connection can be cut, as for a partitioned replica."""

    cut = False

    async def run(self, operation: Any) -> Any:
        if self.cut:
            operation.close()
            raise StoreUnavailable("connection cut by the test")
        return await super().run(operation)


async def test_leader_mode_runs_every_slot_on_the_leader_and_fails_over_after_its_lease() -> None:
    store = MemoryStore()
    ran: list[tuple[int, int]] = []

    def work(ctx: RunContext) -> None:
        ran.append((ctx.slot_us, ctx.fence))

    jobs = [spec("lead", work)]
    options = SchedulerOptions(namespace=NS, mode="leader", leader_ttl_us=600_000)
    cut_off = Unplugged(store)
    first = AsyncScheduler(cut_off, jobs, options)
    second = AsyncScheduler(AsyncMemoryStore(store), jobs, options)
    first_task = asyncio.create_task(first.run())
    await asyncio.wait_for(first.signals.leader.wait(), 5)
    second_task = asyncio.create_task(second.run())
    await second.signals.started.wait()

    def succeeded_by(holder: str) -> int:
        rows = ledger(store, "lead")
        return sum(1 for r in rows if r.state == "succeeded" and r.holder == holder)

    # The standby polls (every ttl / 3) while the leader runs two slots.
    await until_signalled([first, second], lambda: succeeded_by(first.holder) >= 2)
    assert not second.signals.leader.is_set()  # one leader at a time

    cut_off.cut = True  # the leader can no longer renew: it steps down at its deadline
    await asyncio.wait_for(second.signals.leader.wait(), 10)  # the other takes over
    await until_signalled([second], lambda: succeeded_by(second.holder) >= 1)
    for scheduler in (first, second):
        scheduler.stop()
    await asyncio.gather(first_task, second_task)

    slots = [slot for slot, _ in ran]
    assert len(slots) == len(set(slots))  # no slot ran twice across the failover
    holders = {r.holder for r in ledger(store, "lead") if r.state == "succeeded"}
    assert holders == {first.holder, second.holder}


@pytest.mark.parametrize("replicas", [1, 2])
async def test_buffer_one_runs_the_newest_waiting_slot_and_skips_the_older_ones(
    replicas: int,
) -> None:
    # A slot every 300 ms, a run of 700 ms: when a run ends, two newer slots are due. The
    # newest runs next; the older one is skipped (superseded), never run late or missed.
    store = MemoryStore()

    async def slow(ctx: RunContext) -> None:
        await asyncio.sleep(0.7)

    await run_replicas(
        store,
        [spec("buffered", slow, every="300ms", overlap="buffer_one")],
        lambda: states(store, "buffered").count("succeeded") >= 3,
        replicas=replicas,
    )

    rows = ledger(store, "buffered")
    done = sorted((r for r in rows if r.state == "succeeded"), key=lambda r: r.slot_us)
    assert len(done) >= 3
    for before, after in itertools.pairwise(done):
        # A buffered slot starts when the previous run ends, never alongside it...
        assert after.started_us is not None
        assert before.finished_us is not None
        assert after.started_us >= before.finished_us
        # ...and it is the newest slot then due, not the one right after the previous.
        assert after.slot_us - before.slot_us >= 600_000, [
            (r.slot_us, r.state, r.error) for r in rows
        ]
    assert not [r for r in rows if r.state == "missed"], [(r.slot_us, r.error) for r in rows]
    skipped = [r for r in rows if r.state == "skipped"]
    assert skipped
    assert all("superseded" in (r.error or "") for r in skipped)


async def test_cancel_other_stops_the_running_attempt_for_the_new_slot() -> None:
    store = MemoryStore()

    async def endless(ctx: RunContext) -> None:
        await asyncio.sleep(30)

    job = spec("preempt", endless, every="1s", overlap="cancel_other", lock_at_most="900ms")

    def preempted() -> bool:
        rows = ledger(store, "preempt")
        return any(r.state == "cancelled" and r.error == "cancel requested" for r in rows)

    await run_replicas(store, [job], preempted)

    rows = ledger(store, "preempt")
    reasons = [r.error for r in rows if r.state == "cancelled"]
    assert "cancel requested" in reasons, [(r.state, r.error) for r in rows]
    # the last one is stopped by the test's shutdown, not by a newer slot
    assert set(reasons) <= {"cancel requested", "replica shutting down"}


async def test_cancel_other_reaches_the_running_attempt_within_a_second_whatever_its_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # lock_at_most = 10 m: the attempt's renewals come every 200 s; the request must not
    # wait for them.
    store = MemoryStore()
    stopped: list[int] = []

    async def endless(ctx: RunContext) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.append(store.clock.wall_us())

    job = spec("preempt", endless, every="2s", overlap="cancel_other", lock_at_most="10m")

    def preempted() -> bool:
        return any(r.state == "cancelled" for r in ledger(store, "preempt"))

    with caplog.at_level(logging.INFO, logger="fleetcron"):
        await run_replicas(store, [job], preempted)

    rows = sorted(ledger(store, "preempt"), key=lambda r: r.slot_us)
    cancelled = [r for r in rows if r.state == "cancelled"]
    assert cancelled[0].error == "cancel requested", [(r.state, r.error) for r in rows]
    # Stopped within about a second of the newer slot's request (a bound for a loaded
    # machine: the renewals alone would take 200 s).
    newer = cancelled[0].slot_us + 2_000_000
    assert stopped[0] - newer < 5_000_000
    # Said once, by the replica running the attempt (every replica holding the newer slot
    # asks; the request is a flag on the attempt's row).
    said = [r for r in caplog.records if getattr(r, "action", None) == "run_cancel_received"]
    stops = [r for r in said if "cancel requested" in r.getMessage()]
    requested = [r for r in cancelled if r.error == "cancel requested"]
    assert len(stops) == len(requested), [r.getMessage() for r in said]
    asks = [r for r in caplog.records if getattr(r, "action", None) == "run_cancel_requested"]
    assert all(r.levelno == logging.DEBUG for r in asks)


# -- the claim path, piece by piece --------------------------------------------------------
class FailingOn(AsyncMemoryStore):
    """An async store whose operations named in ``failing`` raise StoreUnavailable."""

    failing: set[str] = set()  # noqa: RUF012 - set per instance below

    async def run(self, operation: Any) -> Any:
        if getattr(operation, "__name__", "") in self.failing:
            operation.close()
            raise StoreUnavailable("the store failed, as the test asked")
        return await super().run(operation)


def _claim(job: str, slot: int, *, deadline_us: int | None = None, **options: Any) -> SlotClaim:
    return SlotClaim(
        job=job, slot_us=slot, run_id=f"{job}-{slot}", deadline_us=deadline_us, **options
    )


async def test_sifting_drops_fresh_slots_others_have_and_keeps_retries_and_recoveries() -> None:
    store = MemoryStore()
    now = store.clock.wall_us()
    s1, s2, s3 = now - 3_000_000, now - 2_000_000, now - 1_000_000
    [held] = store.run(store.ops.run_claim(NS, [_claim("a", s1)], "other", 60_000_000))
    [failed] = store.run(
        store.ops.run_claim(
            NS, [_claim("a", s2, exclusive=False, max_attempts=2)], "other", 60_000_000
        )
    )
    assert held.run is not None
    assert failed.run is not None
    outcome = RunOutcome(state="failed", retry_after_us=1)
    assert store.run(store.ops.run_finish(NS, "a", s2, failed.run.fence, outcome))
    fresh_taken = _claim("a", s1, deadline_us=now + 60_000_000)
    retry = _claim("a", s2)  # a retry (no deadline): its failed row is still to be claimed
    fresh_free = _claim("a", s3, deadline_us=now + 60_000_000)
    pending = collections.deque([fresh_taken, retry, fresh_free])

    await claiming.sift(AsyncMemoryStore(store), NS, pending, 16, set())

    assert list(pending) == [retry, fresh_free]


async def test_a_store_error_while_collecting_keeps_every_due_job_in_the_heap() -> None:
    store = MemoryStore()
    failing = FailingOn(store)
    failing.failing = {"run_record_many"}
    # catchup = skip with a cursor an hour back: collecting records missed slots, and fails.
    jobs = [spec(name, lambda ctx: None, every="1s", catchup="skip") for name in ("a", "b")]
    scheduler = AsyncScheduler(failing, jobs, SchedulerOptions(namespace=NS))
    now = store.clock.wall_us()
    for name in ("a", "b"):
        scheduler._jobs[name] = planning.PlannedJob(
            spec=scheduler.specs[name], cursor_us=now - 3_600_000_000
        )
        scheduler._due.push(scheduler._jobs[name])

    with pytest.raises(StoreUnavailable):
        await scheduler._tick(0.0)

    assert sorted(scheduler._due.pop_due(now + 3_600_000_000)) == ["a", "b"]
    for job in scheduler._jobs.values():
        scheduler._due.push(job)
    assert all(job.cursor_us == now - 3_600_000_000 for job in scheduler._jobs.values())
    failing.failing = set()
    await scheduler._tick(0.0)  # the next tick collects (and records) what failed
    assert all(job.cursor_us >= now - 1_000_000 for job in scheduler._jobs.values())
    assert any(r.state == "missed" for r in ledger(store, "a"))


class Counting(AsyncMemoryStore):
    """An async store that counts the operations it runs, by name."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.calls: collections.Counter[str] = collections.Counter()

    async def run(self, operation: Any) -> Any:
        self.calls[getattr(operation, "__name__", "")] += 1
        return await super().run(operation)


def _ten_seconds_behind(
    counting: Counting, store: MemoryStore, names: list[str], behind_us: int = 10_000_000
) -> tuple[AsyncScheduler, int]:
    """A scheduler of ``names`` (every 1 s, catchup = skip) whose cursors are 10 s back:
    each job has slots past the late tolerance (and every slot but its newest is late).
    Returns it and the store's now."""
    jobs = [spec(name, lambda ctx: None, every="1s", catchup="skip") for name in names]
    scheduler = AsyncScheduler(counting, jobs, SchedulerOptions(namespace=NS))
    now = store.clock.wall_us()
    for name in names:
        scheduler._jobs[name] = planning.PlannedJob(
            spec=scheduler.specs[name], cursor_us=now - behind_us
        )
        scheduler._due.push(scheduler._jobs[name])
    return scheduler, now


async def test_the_missed_slots_of_every_job_of_a_pass_are_recorded_in_one_round_trip(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    counting = Counting(store)
    names = [f"job-{index}" for index in range(100)]  # 9-10 missed slots each
    scheduler, now = _ten_seconds_behind(counting, store, names)

    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        await scheduler._tick(0.0)

    assert counting.calls["run_record_many"] == 1
    assert counting.calls["run_record"] == 0
    # Slots past the late tolerance at the test's now were past it at the tick too: catch-up
    # recorded them. (A slot near the edge may instead reach the store past its deadline on
    # a loaded machine, and be recorded by the claim with the store's reason.)
    late = now - planning.LATE_TOLERANCE_US
    missed = {
        name: [r for r in ledger(store, name) if r.state == "missed" and r.slot_us < late]
        for name in names
    }
    assert all(len(rows) >= 3 for rows in missed.values()), "each job's late slots recorded"
    assert all(r.error == MISSED_ERROR for rows in missed.values() for r in rows)
    # Said once per job, the recorded reason one wording.
    said = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "slot_missed"]
    assert len(said) == len(names)
    line = r"job-\d+: \d+ slots missed behind schedule: no replica started them in time \(.*"
    assert all(re.fullmatch(line, text) for text in said), said[:2]


class RegisteringMeanwhile(Counting):
    """A store where another replica registers ``definitions`` just before this
    replica's first ``job_register`` arrives (a fleet starting together)."""

    definitions: list[tuple[str, str, str]] = []  # noqa: RUF012 - set per instance below

    async def run(self, operation: Any) -> Any:
        if getattr(operation, "__name__", "") == "job_register" and self.definitions:
            self.sync.run(self.sync.ops.job_register(NS, self.definitions))
            self.definitions = []
        return await super().run(operation)


async def test_registration_reads_again_when_other_replicas_wrote_the_same_definitions() -> None:
    store = MemoryStore()
    racing = RegisteringMeanwhile(store)
    names = [f"job-{index:04d}" for index in range(1_500)]  # three batches to write
    jobs = [spec(name, lambda ctx: None, every="1m") for name in names]
    scheduler = AsyncScheduler(racing, jobs, SchedulerOptions(namespace=NS))
    local = scheduler.definitions.local
    racing.definitions = [
        (job.name, json.dumps(job.definition(), sort_keys=True), local[job.name]) for job in jobs
    ]

    await scheduler._register()

    # The first batch found its rows written by the other replica: the rest were read
    # back in one round trip, not written again.
    assert racing.calls["job_register"] == 1
    assert racing.calls["job_list"] == 2
    assert sorted(scheduler._jobs) == names
    assert not scheduler.definitions.conflicts
    stored = {row.job: row.fingerprint for row in store.run(store.ops.job_list(NS))}
    assert stored == {name: local[name] for name in names}


async def test_registration_writes_every_batch_when_nobody_else_registers() -> None:
    store = MemoryStore()
    counting = Counting(store)
    names = [f"job-{index:04d}" for index in range(1_500)]
    jobs = [spec(name, lambda ctx: None, every="1m") for name in names]
    scheduler = AsyncScheduler(counting, jobs, SchedulerOptions(namespace=NS))

    await scheduler._register()

    assert counting.calls["job_register"] == 3
    assert counting.calls["job_list"] == 1
    assert sorted(scheduler._jobs) == names


async def test_a_pass_records_the_missed_slots_of_its_jobs_in_groups_of_about_a_batch() -> None:
    store = MemoryStore()
    counting = Counting(store)
    names = [f"job-{index:04d}" for index in range(300)]  # 4-5 missed slots each
    scheduler, now = _ten_seconds_behind(counting, store, names, behind_us=6_000_000)

    await scheduler._tick(0.0)

    assert counting.calls["run_record_many"] == 2  # ~1,000 slots, then the rest
    assert all(sum(r.state == "missed" for r in ledger(store, name)) >= 4 for name in names), (
        "every job's late slots recorded"
    )
    assert all(job.cursor_us >= now - 1_000_000 for job in scheduler._jobs.values())


async def test_another_replicas_slot_still_free_is_adopted_and_one_it_ran_is_dropped() -> None:
    store = MemoryStore()
    now = store.clock.wall_us()
    slot = now - 1_000_000
    failing = FailingOn(store)
    jobs = [spec(name, lambda ctx: None, every="1h") for name in ("a", "b", "gone")]
    scheduler = AsyncScheduler(failing, jobs, SchedulerOptions(namespace=NS))
    for job in jobs:
        scheduler._jobs[job.name] = planning.PlannedJob(spec=job, cursor_us=slot)
    [ran] = store.run(store.ops.run_claim(NS, [_claim("b", slot)], "owner", 60_000_000))
    assert ran.run is not None  # b's owner has it
    for name in ("a", "b", "gone"):
        scheduler.handover.wait_for_owner(name, slot, slot + 10_000_000, now, ripe=True)
    del scheduler._jobs["gone"]  # removed by a reload meanwhile

    failing.failing = {"run_settled"}
    with pytest.raises(StoreUnavailable):
        await scheduler._adopt(now)
    # Nothing is lost when the look fails: the slots wait for the next one.
    assert [(job, at) for _, job, at, _ in scheduler.handover._waiting] == [
        ("a", slot),
        ("b", slot),
        ("gone", slot),
    ]
    assert not scheduler._pending

    failing.failing = set()
    await scheduler._adopt(now)

    [adopted] = scheduler._pending
    assert (adopted.job, adopted.slot_us, adopted.trigger) == ("a", slot, "schedule")
    assert adopted.deadline_us == slot + 10_000_000
    assert len(adopted.run_id) == 36  # a run id of its own, made when adopted
    assert scheduler.handover.next_look_us() is None


async def test_won_claims_start_even_when_recording_a_refusal_fails() -> None:
    store = MemoryStore()
    now = store.clock.wall_us()
    slot = now - 1_000_000
    # Another replica holds job a's lease: a's claim is refused "busy", and skipping it fails.
    [other] = store.run(
        store.ops.run_claim(NS, [_claim("a", slot - 1_000_000)], "other", 60_000_000)
    )
    assert other.run is not None
    failing = FailingOn(store)
    failing.failing = {"run_record"}
    ran = threading.Event()
    jobs = [spec("a", lambda ctx: None), spec("b", lambda ctx: ran.set())]
    scheduler = AsyncScheduler(failing, jobs, SchedulerOptions(namespace=NS))
    for job in jobs:
        scheduler._jobs[job.name] = planning.PlannedJob(spec=job, cursor_us=now)
    refused, won = _claim("a", slot), _claim("b", slot)
    scheduler._pending.extend([refused, won])

    with pytest.raises(StoreUnavailable):
        await scheduler._claim_batch()

    assert list(scheduler.supervisor.running) == [("b", slot)]
    assert list(scheduler._pending) == [refused], "the refusal is looked at again next tick"
    running = scheduler.supervisor.running.values()
    tasks = [entry.task for entry in running if entry.task is not None]
    failing.failing = set()
    await asyncio.gather(*tasks)
    assert ran.is_set()
    row = store.run(store.ops.run_get(NS, "b", slot))
    assert row is not None
    assert row.state == "succeeded"


@pytest.mark.parametrize(
    ("catchup", "window", "deadline_s"),
    [
        ("skip", "1h", 5),  # on time only
        ("all", "1h", 3600),  # the whole window
        ("latest", "1h", 60),  # until the next slot (every minute) fires
        ("latest", "0s", 5),  # a window shorter than on time: on time still runs
    ],
)
def test_the_claim_deadline_follows_the_catchup_policy(
    catchup: str, window: str, deadline_s: int
) -> None:
    job = spec("j", lambda ctx: None, every="1m", catchup=catchup, catchup_window=window)
    slot = 1_800_000_000_000_000

    assert planning.deadline(job, slot) == slot + deadline_s * 1_000_000


def test_fleet_job_misuse_is_a_clear_error() -> None:
    fleet = Fleet(MemoryStore(), namespace=NS)

    with pytest.raises(ConfigurationError, match=r"not a bare @fleet\.job"):
        fleet.job(lambda ctx: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="call cannot be given"):
        fleet.job(every="1s", call="os:getcwd")
    with pytest.raises(ConfigurationError, match="has no __name__"):
        fleet.job(every="1s")(functools.partial(print))
    assert fleet.jobs == ()


async def test_a_store_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    cut_off = Unplugged(store)
    options = SchedulerOptions(namespace=NS, shutdown_grace_s=0.5, kill_grace_s=0.2)
    scheduler = AsyncScheduler(cut_off, [spec("tick", lambda ctx: None)], options)
    task = asyncio.create_task(scheduler.run())
    try:
        await asyncio.wait_for(scheduler.signals.started.wait(), 10)
        with caplog.at_level(logging.DEBUG, logger="fleetcron"):
            cut_off.cut = True
            await until_signalled([scheduler], lambda: scheduler.outage.failures >= 4)
            cut_off.cut = False
            await until_signalled([scheduler], lambda: not scheduler.outage.active)
    finally:
        scheduler.stop()
        await task

    def logged(action: str, level: int) -> int:
        return sum(
            1 for r in caplog.records if getattr(r, "action", None) == action and r.levelno >= level
        )

    assert logged("store_unavailable", logging.ERROR) == 1
    assert logged("store_recovered", logging.WARNING) == 1
    assert scheduler.outage.total_failures >= 4


def test_passes_are_spaced_by_a_growing_jittered_back_off_while_the_store_is_down() -> None:
    outage = StoreOutage()
    ceilings = []
    for failure in range(1, 10):
        outage.failed(StoreUnavailable("down"), float(failure))
        ceiling = min(StoreOutage.MOST_S, StoreOutage.FIRST_S * 2 ** (failure - 1))
        delays = [outage.delay_s() for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (failure, delays)
        ceilings.append(ceiling)
    assert ceilings == sorted(ceilings)
    assert ceilings[-1] == StoreOutage.MOST_S


class FlakyFinish(AsyncMemoryStore):
    """Fails the next ``failures`` outcomes it is asked to record (a store down, a disk
    full), then records them again."""

    failures = 0

    async def run(self, operation: Any) -> Any:
        name = getattr(operation, "__name__", "")
        if name in ("run_finish", "run_finish_many") and self.failures > 0:
            self.failures -= 1
            operation.close()
            raise StoreUnavailable("could not write, as the test asked")
        return await super().run(operation)


def _queue_one_run(store: MemoryStore, job: str) -> int:
    slot = store.clock.wall_us() - 1_000_000
    assert store.run(store.ops.run_record(NS, job, slot, "queued", None, "manual"))
    return slot


def _actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "action", "")) for r in caplog.records]


async def test_an_outcome_the_store_could_not_take_is_recorded_once_it_can(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    flaky = FlakyFinish(store)
    flaky.failures = 3
    slot = _queue_one_run(store, "report")
    scheduler = AsyncScheduler(
        flaky, [spec("report", lambda ctx: None, every="1h")], SchedulerOptions(namespace=NS)
    )
    task = asyncio.create_task(scheduler.run())

    def recorded() -> bool:
        row = store.run(store.ops.run_get(NS, "report", slot))
        return row is not None and row.state == "succeeded"

    try:
        with caplog.at_level(logging.INFO, logger="fleetcron"):
            await until_signalled([scheduler], recorded)
    finally:
        scheduler.stop()
        await task

    assert flaky.failures == 0
    assert _actions(caplog).count("run_finish_retrying") == 1
    assert "run_finish_failed" not in _actions(caplog)


async def test_an_outcome_not_recorded_before_its_lease_ends_is_recovered_by_the_ledger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    flaky = FlakyFinish(store)
    flaky.failures = 10_000
    slot = _queue_one_run(store, "report")
    job = spec("report", lambda ctx: None, every="1h", lock_at_most="600ms")
    scheduler = AsyncScheduler(flaky, [job], SchedulerOptions(namespace=NS))
    task = asyncio.create_task(scheduler.run())

    def closed() -> bool:
        row = store.run(store.ops.run_get(NS, "report", slot))
        return row is not None and row.state == "lost"

    try:
        with caplog.at_level(logging.INFO, logger="fleetcron"):
            await until_signalled([scheduler], closed)
    finally:
        scheduler.stop()
        await task

    actions = _actions(caplog)
    assert actions.count("run_finish_retrying") == 1
    assert actions.count("run_finish_failed") == 1


class DownForOutcomes(AsyncMemoryStore):
    """Fails every outcome while :attr:`down` is set (the store back for claims, not yet
    for the outcome retry's next try)."""

    down = False

    async def run(self, operation: Any) -> Any:
        if self.down and getattr(operation, "__name__", "") in ("run_finish", "run_finish_many"):
            operation.close()
            raise StoreUnavailable("could not write, as the test asked")
        return await super().run(operation)


async def test_a_slot_due_while_the_previous_outcome_waits_for_its_retry_runs_after_it() -> None:
    store = MemoryStore()
    flaky = DownForOutcomes(store)
    flaky.down = True
    job = spec("quick", lambda ctx: None, every="1s", overlap="skip")
    scheduler = AsyncScheduler(flaky, [job], SchedulerOptions(namespace=NS))
    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], lambda: bool(ledger(store, "quick")))
        first = ledger(store, "quick")[0].slot_us
        # The next slot is due, and its claim goes out, while the first outcome waits.
        async with asyncio.timeout(30):
            while store.clock.wall_us() < first + 1_300_000:
                await asyncio.sleep(0.01)
        assert "quick" in scheduler.supervisor.finishing
        flaky.down = False
        await until_signalled(
            [scheduler],
            lambda: (
                [r.state for r in ledger(store, "quick") if r.slot_us <= first + 1_000_000]
                == ["succeeded", "succeeded"]
            ),
        )
    finally:
        scheduler.stop()
        await task

    assert "skipped" not in states(store, "quick")


async def test_an_outcome_waiting_for_its_next_try_goes_at_once_when_the_store_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    flaky = DownForOutcomes(store)
    flaky.down = True
    tries = 0
    real = keepalive.finish_retry_pause_us

    def long_pause(attempt: int, **times: int) -> int | None:
        nonlocal tries
        tries += 1
        return None if real(attempt, **times) is None else 3_600_000_000  # an hour

    monkeypatch.setattr(slot_lease, "finish_retry_pause_us", long_pause)
    slot = _queue_one_run(store, "report")
    scheduler = AsyncScheduler(
        flaky, [spec("report", lambda ctx: None, every="1h")], SchedulerOptions(namespace=NS)
    )
    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], lambda: tries >= 1)
        flaky.down = False
        scheduler.supervisor.store_answered()
        row = None

        def recorded() -> bool:
            nonlocal row
            row = store.run(store.ops.run_get(NS, "report", slot))
            return row is not None and row.state == "succeeded"

        # Without the wake-up the next try would be an hour away.
        await until_signalled([scheduler], recorded, timeout=20)
    finally:
        scheduler.stop()
        await task
    assert tries == 1


async def test_a_one_time_job_whose_moment_passed_before_it_was_scheduled_is_said_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    past = spec("once-past", lambda ctx: None, every=None, at="2020-01-01T00:00:00+00:00")
    future = spec("once-future", lambda ctx: None, every=None, at="2999-01-01T00:00:00+00:00")
    options = SchedulerOptions(namespace=NS, shutdown_grace_s=0.5, kill_grace_s=0.2)
    scheduler = AsyncScheduler(AsyncMemoryStore(store), [past, future], options)
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        task = asyncio.create_task(scheduler.run())
        try:
            await asyncio.wait_for(scheduler.signals.started.wait(), 10)
        finally:
            scheduler.stop()
            await task

    said = [r for r in caplog.records if getattr(r, "action", None) == "job_at_in_past"]
    assert [getattr(r, "job", None) for r in said] == ["once-past"]
    assert "2020-01-01T00:00:00Z" in said[0].getMessage()
    assert ledger(store, "once-past") == []


async def test_a_reload_adds_changes_and_removes_jobs_while_running() -> None:
    store = MemoryStore()
    keep = spec("keep", lambda ctx: None)
    gone = spec("gone", lambda ctx: None)
    options = SchedulerOptions(namespace=NS, shutdown_grace_s=1.0, kill_grace_s=0.5)
    scheduler = AsyncScheduler(AsyncMemoryStore(store), [keep, gone], options)

    def succeeded(job: str) -> int:
        return sum(1 for r in ledger(store, job) if r.state == "succeeded")

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled(
            [scheduler], lambda: succeeded("keep") >= 1 and succeeded("gone") >= 1
        )
        changed = spec("keep", lambda ctx: None, every="300ms")
        added = spec("new", lambda ctx: None)
        change = await scheduler.reload([changed, added])
        assert (change.added, change.changed, change.removed) == (("new",), ("keep",), ("gone",))
        gone_runs = len(ledger(store, "gone"))
        keep_runs = succeeded("keep")
        await until_signalled(
            [scheduler], lambda: succeeded("new") >= 2 and succeeded("keep") >= keep_runs + 2
        )
        assert len(ledger(store, "gone")) == gone_runs, "a removed job was still claimed"
        stored = {job.job: job for job in store.run(store.ops.job_list(NS))}
        assert stored["keep"].fingerprint == changed.fingerprint()
        assert scheduler.heartbeat.info.jobs_fingerprint != ""
    finally:
        scheduler.stop()
        await task
    slots = [r.slot_us for r in ledger(store, "keep") if r.slot_us > 0]
    assert len(slots) == len(set(slots)), "a slot ran twice"


# -- the store's clock ----------------------------------------------------------------


class _SteppedClock:
    """The real clocks, with the wall clock (the memory store's time) moved by ``step_us``."""

    def __init__(self) -> None:
        self.step_us = 0

    def monotonic_us(self) -> int:
        return SYSTEM_CLOCK.monotonic_us()

    def wall_us(self) -> int:
        return SYSTEM_CLOCK.wall_us() + self.step_us


async def test_the_store_clock_is_read_at_most_once_a_second_between_passes() -> None:
    store = MemoryStore()
    counting = Recorded(store)
    scheduler = AsyncScheduler(
        counting, [spec("often", lambda ctx: None, every="100ms")], SchedulerOptions(namespace=NS)
    )
    started = SYSTEM_CLOCK.monotonic_us()
    passes = 0

    def enough() -> bool:
        nonlocal passes
        passes += 1
        return passes >= 30

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], enough)
    finally:
        scheduler.stop()
        await task
    elapsed_s = (SYSTEM_CLOCK.monotonic_us() - started) / 1e6

    # One reading at registration, then at most one per second of passes.
    clock_reads = len(counting.calls["store_now"])
    assert clock_reads <= 2 + elapsed_s, (clock_reads, elapsed_s)
    assert len(store.run(store.ops.run_list(NS, "often", 100))) >= 10


async def test_the_estimate_follows_a_store_clock_that_steps_forward() -> None:
    clock = _SteppedClock()
    store = MemoryStore(clock=clock)
    scheduler = AsyncScheduler(
        AsyncMemoryStore(store),
        [spec("often", lambda ctx: None, every="100ms")],
        SchedulerOptions(namespace=NS),
    )

    def ran_after(moment_us: int) -> Callable[[], bool]:
        def done() -> bool:
            runs = store.run(store.ops.run_list(NS, "often", 1000))
            return any(r.slot_us >= moment_us and r.state == "succeeded" for r in runs)

        return done

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], ran_after(0))
        # The store's clock jumps 30 s ahead: slots planned by the old estimate would all
        # be refused as missed; the scheduler must move to the store's new time.
        clock.step_us = 30_000_000
        stepped = store.clock.wall_us()
        await until_signalled([scheduler], ran_after(stepped - 1_000_000))
    finally:
        scheduler.stop()
        await task
