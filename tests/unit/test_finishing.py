"""Group commit of outcomes: runs that end together record their outcomes in one round
trip; each outcome is still decided on its own fence, and a store error reaches every
outcome of its batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.models import RunFinish, RunOutcome, RunRecord, SlotClaim
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.finishing import FINISH_BATCH, FinishBatcher
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled
from unit.test_scheduler import spec

NS = "finishing"
OK = RunOutcome(state="succeeded")


class Counting(AsyncMemoryStore):
    """Counts the batches of outcomes and their sizes; fails the next ``failures``."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.batches: list[int] = []
        self.failures = 0

    async def run(self, operation: Any) -> Any:
        if getattr(operation, "__name__", "") == "run_finish_many":
            finishes = operation.gi_frame.f_locals["finishes"]
            self.batches.append(len(finishes))
            if self.failures > 0:
                self.failures -= 1
                operation.close()
                raise StoreUnavailable("could not write, as the test asked")
        await asyncio.sleep(0)  # a round trip: others may queue behind it
        return await super().run(operation)


def _claimed(store: MemoryStore, count: int) -> list[RunRecord]:
    now = store.clock.wall_us()
    claims = [
        SlotClaim(job=f"job{i}", slot_us=now - 1_000, run_id=f"r{i}", trigger="manual")
        for i in range(count)
    ]
    answers = store.run(store.ops.run_claim(NS, claims, "h:1:t", 60_000_000))
    runs = [answer.run for answer in answers if answer.run is not None]
    assert len(runs) == count
    return runs


def _state(store: MemoryStore, run: RunRecord) -> str | None:
    row = store.run(store.ops.run_get(NS, run.job, run.slot_us))
    return None if row is None else row.state


def _finish(run: RunRecord, fence: int | None = None) -> RunFinish:
    return RunFinish(run.job, run.slot_us, run.fence if fence is None else fence, OK)


async def test_outcomes_ending_together_share_one_round_trip() -> None:
    store = MemoryStore()
    counting = Counting(store)
    batcher = FinishBatcher(counting, NS)
    runs = _claimed(store, 30)

    answers = await asyncio.gather(*(batcher.finish(_finish(run)) for run in runs))

    assert answers == [True] * 30
    assert counting.batches == [30]
    assert {_state(store, run) for run in runs} == {"succeeded"}


async def test_outcomes_ending_during_a_flush_go_together_in_the_next() -> None:
    store = MemoryStore()
    counting = Counting(store)
    batcher = FinishBatcher(counting, NS)
    first, *rest = _claimed(store, 11)

    sending = asyncio.create_task(batcher.finish(_finish(first)))
    await asyncio.sleep(0)  # the first batch is in flight
    later = [asyncio.create_task(batcher.finish(_finish(run))) for run in rest]
    assert await sending
    assert await asyncio.gather(*later) == [True] * 10

    assert counting.batches == [1, 10]


async def test_a_refused_outcome_does_not_spoil_its_batch() -> None:
    store = MemoryStore()
    batcher = FinishBatcher(Counting(store), NS)
    a, b, c = _claimed(store, 3)

    answers = await asyncio.gather(
        batcher.finish(_finish(a)),
        batcher.finish(_finish(b, b.fence + 1)),
        batcher.finish(_finish(c)),
    )

    assert list(answers) == [True, False, True]
    assert _state(store, b) == "running"


async def test_a_store_error_reaches_every_outcome_of_the_batch_and_the_next_batch_works() -> None:
    store = MemoryStore()
    counting = Counting(store)
    counting.failures = 1
    batcher = FinishBatcher(counting, NS)
    runs = _claimed(store, 4)

    answers = await asyncio.gather(
        *(batcher.finish(_finish(run)) for run in runs), return_exceptions=True
    )

    assert all(isinstance(answer, StoreUnavailable) for answer in answers)
    assert await asyncio.gather(*(batcher.finish(_finish(run)) for run in runs)) == [True] * 4
    assert counting.batches == [4, 4]


async def test_a_batch_holds_at_most_finish_batch_outcomes() -> None:
    store = MemoryStore()
    counting = Counting(store)
    batcher = FinishBatcher(counting, NS)
    runs = _claimed(store, FINISH_BATCH + 5)

    assert all(await asyncio.gather(*(batcher.finish(_finish(run)) for run in runs)))

    assert counting.batches == [FINISH_BATCH, 5]


async def test_a_run_cancelled_while_its_outcome_is_in_flight_still_has_it_recorded() -> None:
    store = MemoryStore()
    counting = Counting(store)
    batcher = FinishBatcher(counting, NS)
    a, b = _claimed(store, 2)

    waiting = asyncio.create_task(batcher.finish(_finish(a)))
    other = asyncio.create_task(batcher.finish(_finish(b)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the flush has taken both
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await other

    assert counting.batches == [2]
    assert _state(store, a) == "succeeded"


async def test_the_scheduler_records_the_outcomes_of_runs_ending_together_in_few_round_trips() -> (
    None
):
    store = MemoryStore()
    counting = Counting(store)
    count = 40
    slot = store.clock.wall_us() - 1_000_000
    for i in range(count):
        assert store.run(store.ops.run_record(NS, f"job{i}", slot, "queued", None, "manual"))
    jobs = [spec(f"job{i}", lambda ctx: None, every="1h") for i in range(count)]
    scheduler = AsyncScheduler(counting, jobs, SchedulerOptions(namespace=NS, concurrency=count))
    task = asyncio.create_task(scheduler.run())

    def all_recorded() -> bool:
        rows = [store.run(store.ops.run_get(NS, f"job{i}", slot)) for i in range(count)]
        return all(row is not None and row.state == "succeeded" for row in rows)

    try:
        await until_signalled([scheduler], all_recorded)
    finally:
        scheduler.stop()
        await task

    assert sum(counting.batches) == count
    assert len(counting.batches) < count / 4, counting.batches
