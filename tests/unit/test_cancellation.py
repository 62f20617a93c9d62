"""Stopping a run: the keepalive's stop sequence, threads that cannot be killed, and
``isolate = "process"``.

The scheduler runs on the in-memory store, whose clock is this host's wall clock, so a
child process's heartbeats and the lease's expiry in the store are on one clock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetcron import AsyncFleet, RunCancelled
from fleetcron.context import RunContext
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec
from fleetcron.keepalive import (
    describe_failure,
    effective_grace_us,
    local_deadline_us,
    stop_points,
)
from fleetcron.models import RunRecord
from fleetcron.scheduler import ABANDONED_REASON, AsyncScheduler, SchedulerOptions
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore

NS = "cancel"


def spec(name: str, func: Callable[..., Any], **options: Any) -> JobSpec:
    options.setdefault("every", "200ms")
    return job_spec(name, where="test", call=func, **options)


async def run_until(
    store: MemoryStore,
    jobs: Sequence[JobSpec],
    done: Callable[[], bool],
    *,
    timeout: float = 20.0,
    **options: Any,
) -> AsyncScheduler:
    """Run one replica until ``done()`` holds (checked after every pass)."""
    options.setdefault("shutdown_grace_s", 0.5)
    options.setdefault("kill_grace_s", 0.5)
    scheduler = AsyncScheduler(
        AsyncMemoryStore(store), jobs, SchedulerOptions(namespace=NS, **options)
    )
    task = asyncio.create_task(scheduler.run())
    try:
        async with asyncio.timeout(timeout):
            while not done():
                async with scheduler.signals.ticked:
                    await scheduler.signals.ticked.wait()
    finally:
        scheduler.stop()
        await task
    return scheduler


def ledger(store: MemoryStore, job: str) -> list[RunRecord]:
    return store.run(store.ops.run_list(NS, job, 10_000))


# -- the rules --------------------------------------------------------------------------
def test_a_run_is_asked_to_stop_a_grace_before_the_deadline_and_killed_at_it() -> None:
    points = stop_points(deadline_us=10_000, grace_us=2_000, asked_at_us=None)
    assert (points.term_at, points.kill_at) == (8_000, 10_000)


def test_a_stop_asked_for_gets_its_grace_but_never_past_the_deadline() -> None:
    early = stop_points(deadline_us=10_000, grace_us=2_000, asked_at_us=1_000)
    assert (early.term_at, early.kill_at) == (1_000, 3_000)
    late = stop_points(deadline_us=10_000, grace_us=2_000, asked_at_us=9_500)
    assert (late.term_at, late.kill_at) == (8_000, 10_000)


def test_without_a_deadline_nothing_stops_until_asked() -> None:
    assert stop_points(deadline_us=None, grace_us=5, asked_at_us=None).kill_at is None
    assert stop_points(deadline_us=None, grace_us=5, asked_at_us=7).kill_at == 12


def test_a_grace_as_long_as_the_lease_is_clamped_to_a_sixth_of_it() -> None:
    assert effective_grace_us(5_000_000, 3_000_000) == 500_000
    assert effective_grace_us(5_000_000, 600_000_000) == 5_000_000


def test_the_local_deadline_is_the_send_time_plus_the_lease_minus_the_margin() -> None:
    assert local_deadline_us(1_000_000, 3_000_000) == 1_000_000 + 3_000_000 - 300_000
    assert local_deadline_us(0, 600_000_000) == 600_000_000 - 2_000_000


def test_a_failure_without_a_message_is_still_described() -> None:
    assert "timed out" in describe_failure(TimeoutError())
    assert describe_failure(RuntimeError()) == "RuntimeError"
    assert describe_failure(OSError("refused")) == "refused"


# -- a renewal that times out says why ------------------------------------------------------
class _SilentStore(AsyncMemoryStore):
    """Answers everything, except renewals while ``silent`` is set: those never return."""

    silent = False

    async def run(self, operation: Operation[Any]) -> Any:
        if self.silent and operation.gi_code.co_name == "lease_extend":  # type: ignore[attr-defined]
            await asyncio.Event().wait()
        return await super().run(operation)


async def test_a_renewal_that_times_out_logs_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    store = _SilentStore(MemoryStore())
    fleet = AsyncFleet(store, namespace=NS)
    lease = await fleet.lock("quiet", lock_at_most="600ms")
    store.silent = True
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        await asyncio.wait_for(lease.lost.wait(), 10)
    failures = [r for r in caplog.records if getattr(r, "action", None) == "lease_renew_failed"]
    assert failures, [r.getMessage() for r in caplog.records]
    for record in failures:
        reason = record.getMessage().partition("failed: ")[2]
        assert reason.strip(), f"empty reason in {record.getMessage()!r}"
        assert "timed out" in reason
    await lease.release()


# -- a thread that does not stop ---------------------------------------------------------------
async def test_an_abandoned_sync_run_blocks_its_job_on_the_replica_until_it_returns() -> None:
    store = MemoryStore()
    active = 0
    most = 0
    lock = threading.Lock()
    released = threading.Event()

    def deaf(ctx: RunContext) -> None:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
        try:
            released.wait(20)  # ignores ctx.cancelled until the test lets it go
        finally:
            with lock:
                active -= 1

    def skipped_for_abandon() -> list[RunRecord]:
        rows = ledger(store, "deaf")
        return [r for r in rows if r.state == "skipped" and r.error == ABANDONED_REASON]

    def after_release() -> bool:
        if len(skipped_for_abandon()) >= 2:
            released.set()
        runs = [r for r in ledger(store, "deaf") if r.fence and r.state != "skipped"]
        return released.is_set() and len(runs) >= 2

    await run_until(store, [spec("deaf", deaf, timeout="100ms")], after_release)
    released.set()

    rows = ledger(store, "deaf")
    assert most == 1, "a second run started while the abandoned one still ran"
    first = min((r for r in rows if r.fence), key=lambda r: r.slot_us)
    assert first.state == "failed", first
    assert "abandoned" in (first.error or ""), first
    assert len(skipped_for_abandon()) >= 2
    later = [r for r in rows if r.fence and r.slot_us > first.slot_us]
    assert later, "the job never ran again after the abandoned run returned"


def _careful(ended: threading.Event) -> Callable[[RunContext], None]:
    """A sync job that checks its cancellation every 10 ms and sets ``ended`` on leaving."""

    def careful(ctx: RunContext) -> None:
        try:
            while True:
                ctx.raise_if_cancelled()
                time.sleep(0.01)
        finally:
            ended.set()

    return careful


async def test_raise_if_cancelled_ends_a_sync_run_that_checks_it() -> None:
    store = MemoryStore()
    ended = threading.Event()

    await run_until(
        store,
        [spec("careful", _careful(ended), timeout="100ms")],
        lambda: (
            bool(ledger(store, "careful"))
            and ended.is_set()
            and any(r.state == "failed" for r in ledger(store, "careful"))
        ),
    )
    row = next(r for r in ledger(store, "careful") if r.state == "failed")
    assert row.error == "timed out", row  # ended in time: not abandoned


async def test_the_run_cancelled_a_sync_run_ends_with_is_read_not_logged_as_never_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    ended = threading.Event()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await run_until(
            store,
            [spec("careful", _careful(ended), timeout="100ms")],
            lambda: ended.is_set() and any(r.state == "failed" for r in ledger(store, "careful")),
        )
        gc.collect()  # the future of the run is freed: asyncio logs it then if unread
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_run_cancelled_carries_the_reason() -> None:
    ctx = RunContext(
        job="j",
        namespace=NS,
        slot_us=0,
        fence=1,
        attempt=1,
        run_id="r",
        trigger="schedule",
        logger=logging.LoggerAdapter(logging.getLogger("t"), {}),
    )
    ctx.raise_if_cancelled()  # not cancelled: nothing happens
    ctx.cancel("lease lost")
    assert ctx.cancelled
    assert ctx.cancel_reason == "lease lost"
    with pytest.raises(RunCancelled) as raised:
        ctx.raise_if_cancelled()
    assert raised.value.reason == "lease lost"


# -- isolate = "process" ------------------------------------------------------------------------
@pytest.fixture
def beats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "beats"
    monkeypatch.setenv("FLEETCRON_TEST_BEATS", str(path))
    return path


def _isolated(name: str, function: str, **options: Any) -> JobSpec:
    from unit import isolated_jobs  # the child process imports it by the same name

    return spec(name, getattr(isolated_jobs, function), isolate="process", **options)


async def test_an_isolated_job_that_ignores_its_cancellation_dies_before_its_lease_expires(
    beats: Path,
) -> None:
    store = MemoryStore()
    # 3 s: the child process must have started and beaten before the stop, also on a
    # loaded machine (a Python child importing fleetcron can take a second to start).
    job = _isolated("stubborn", "stubborn", every="1h", lock_at_most="3s", keepalive=False)
    store.run(
        store.ops.run_record(NS, "stubborn", store.clock.wall_us() - 1, "queued", None, "manual")
    )

    def ended() -> bool:
        return any(r.state == "cancelled" for r in ledger(store, "stubborn"))

    await run_until(store, [job], ended)

    (run,) = [r for r in ledger(store, "stubborn") if r.state == "cancelled"]
    assert run.error == "lock_at_most elapsed"
    assert run.started_us is not None
    beaten = Path(f"{beats}.{run.fence}")
    assert beaten.exists(), "the isolated job never ran"
    lines = beaten.read_text().split()
    assert lines, "the isolated job never ran"
    expiry = run.started_us + 3_000_000
    assert int(lines[-1]) < expiry, f"alive {(int(lines[-1]) - expiry) / 1e6:.3f}s past its lease"


async def test_an_isolated_job_runs_in_a_child_process_and_reports_its_failure(
    beats: Path,
) -> None:
    store = MemoryStore()
    now = store.clock.wall_us() - 1
    store.run(store.ops.run_record(NS, "fine", now, "queued", None, "manual"))
    store.run(store.ops.run_record(NS, "broken", now, "queued", None, "manual"))
    jobs = [_isolated("fine", "fine", every="1h"), _isolated("broken", "broken", every="1h")]

    def both_final() -> bool:
        states = [r.state for job in ("fine", "broken") for r in ledger(store, job)]
        return len([s for s in states if s in ("succeeded", "failed")]) == 2

    await run_until(store, jobs, both_final)

    (fine,) = ledger(store, "fine")
    assert fine.state == "succeeded"
    pid, fence, _attempt = Path(f"{beats}.fine").read_text().split()
    assert int(pid) != os.getpid()
    assert int(fence) == fine.fence
    (broken,) = ledger(store, "broken")
    assert broken.state == "failed"
    assert broken.error == f"ValueError: boom at fence {broken.fence}"


def test_isolate_is_checked_when_the_job_is_defined() -> None:
    with pytest.raises(ConfigurationError, match=r"isolate.*unknown value 'thread'"):
        spec("a", lambda ctx: None, isolate="thread")
    with pytest.raises(ConfigurationError, match="applies to call jobs"):
        job_spec("b", where="test", every="1m", command=["true"], isolate="process")
    with pytest.raises(ConfigurationError, match="define it at module level"):
        spec("c", lambda ctx: None, isolate="process")


def test_an_isolated_childs_interpreter_says_nothing_before_the_job_does() -> None:
    # Without its payload the child fails at once, after the imports that once made runpy
    # warn ("found in sys.modules") as the first line of every isolated run's output.
    from fleetcron.isolated import PAYLOAD_ENV, child_command

    env = {k: v for k, v in os.environ.items() if k != PAYLOAD_ENV}
    done = subprocess.run(child_command(), env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode != 0
    assert "RuntimeWarning" not in done.stderr
    assert "found in sys.modules" not in done.stderr
