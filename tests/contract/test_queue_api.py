"""The queue's Python API on every backend: ``fleet.queue(name)``, sync and async, its
worker loop, and what it refuses."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from typing import Any

import pytest

from fleetcron import AsyncFleet, Claimed, ConfigurationError, Entry, Fleet, RunContext
from fleetcron.jsonvalue import MAX_JSON_DEPTH
from fleetcron.queue import MAX_ITEM_ID


def nested(depth: int) -> list[Any]:
    """A list in a list … ``depth`` deep (``[]`` is 1 deep)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_values_round_trip_as_json_with_ids_keys_and_delays(fleet: Fleet) -> None:
    queue = fleet.queue("mail", retry_backoff=0)
    values = [{"to": "a@example.com", "n": 1}, ["x", 2.5, None, True], "naïve 🎉", 7]

    ids = queue.put_many(values)
    assert queue.put("again", dedupe_key="k") is not None
    assert queue.put("twice", dedupe_key="k") is None
    assert queue.put_many([Entry("later", delay="1h"), Entry("dup", dedupe_key="k")])[1] is None

    got = queue.claim(10)
    assert [c.value for c in got] == [*values, "again"]
    assert [c.item_id for c in got[:4]] == ids
    assert all(c.attempt == 1 and c.fence > 0 for c in got)
    stats = queue.stats()
    assert (stats.claimed, stats.scheduled, stats.ready) == (5, 1, 0)
    assert queue.ack(*got) == [True] * 5
    assert queue.stats().done == 5


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({1, 2}, "set"),
        (b"bytes", "bytes"),
        (math.nan, "NaN"),
        (object(), "object"),
        ("x" * 1_048_577, "1048579 bytes"),
        ("\ud800", "lone surrogate"),
        (nested(1_000), "item 1 is nested too deep: lists and objects may nest at most 100"),
        (nested(MAX_JSON_DEPTH + 1), "nested too deep"),
        ({"a": [{"b": nested(MAX_JSON_DEPTH - 2)}]}, "nested too deep"),
    ],
    ids=["set", "bytes", "nan", "object", "too-large", "surrogate", "1000", "101", "mixed"],
)
def test_a_value_that_is_not_json_or_too_large_is_refused_and_nothing_is_queued(
    fleet: Fleet, value: Any, says: str
) -> None:
    queue = fleet.queue("bad")
    with pytest.raises(ConfigurationError) as caught:
        queue.put_many(["fine", value])
    assert "item 1" in str(caught.value)
    assert says in str(caught.value)
    assert queue.stats().depth == 0, "nothing of the batch was queued"


async def test_a_value_nested_too_deep_is_refused_by_every_put_and_nothing_is_queued(
    async_fleet: AsyncFleet,
) -> None:
    queue = async_fleet.queue("deep")
    with pytest.raises(ConfigurationError, match=r"^item 2 is nested too deep: .* at most 100 "):
        await queue.put_many(["fine", Entry("also fine"), Entry(nested(1_000), dedupe_key="k")])
    with pytest.raises(ConfigurationError, match=r"^item 0 is nested too deep"):
        await queue.put(nested(1_000))
    assert (await queue.stats()).depth == 0, "nothing of the batch was queued"


def test_a_value_nested_as_deep_as_allowed_comes_back(fleet: Fleet) -> None:
    queue = fleet.queue("deep")
    value = {"tree": nested(MAX_JSON_DEPTH - 1)}

    queue.put(value)

    (item,) = queue.claim()
    assert item.value == value
    assert queue.ack(item) == [True]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda q: q.claim(0), "batch must be 1 to"),
        (lambda q: q.claim(-3), "batch must be 1 to"),
        (lambda q: q.claim(True), "batch must be an integer"),
        (lambda q: q.claim(1, visibility=0), "visibility must be longer than 0"),
        (lambda q: q.claim(1, visibility=-5), "visibility must be longer than 0"),
        (lambda q: q.put(1, delay=-1), "delay must not be negative"),
        (lambda q: q.put(1, dedupe_key=""), "dedupe key is empty"),
        (lambda q: q.put(1, dedupe_key=" k"), "whitespace"),
        (lambda q: q.work(print, batch=0), "batch must be 1 to"),
        (lambda q: q.items(states=["gone"]), "unknown item state"),
        (lambda q: q.requeue(5), "a list of item ids"),
        (lambda q: q.requeue("12"), "a list of item ids"),
        (lambda q: q.requeue([1, "2"]), "an item id is an integer"),
        (lambda q: q.requeue([1, 2**70]), f"an item id is 1 to {MAX_ITEM_ID}, not {2**70}$"),
        (lambda q: q.requeue([2**63]), f"an item id is 1 to {MAX_ITEM_ID}, not {2**63}$"),
        (lambda q: q.requeue([0]), f"an item id is 1 to {MAX_ITEM_ID}, not 0$"),
        (lambda q: q.requeue([-(2**63) - 1]), "an item id is 1 to"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_wrong(fleet: Fleet, call: Any, says: str) -> None:
    queue = fleet.queue("q")
    with pytest.raises(ConfigurationError, match=says):
        call(queue)
    assert queue.stats().depth == 0


def test_the_largest_item_id_is_asked_for_like_any_other(fleet: Fleet) -> None:
    queue = fleet.queue("q")
    assert queue.requeue([MAX_ITEM_ID]) == 0


async def test_an_item_id_no_store_can_hold_is_refused_by_the_async_queue(
    async_fleet: AsyncFleet,
) -> None:
    with pytest.raises(ConfigurationError, match=f"an item id is 1 to {MAX_ITEM_ID}"):
        await async_fleet.queue("q").requeue([2**70])


def test_until_empty_goes_on_past_a_claim_that_only_killed_items(fleet: Fleet) -> None:
    queue = fleet.queue("poison", max_attempts=1)
    queue.put_many(["p1", "p2", "p3"])
    assert len(queue.claim(3, visibility="50ms")) == 3  # their only delivery, never acked
    give_up = time.monotonic() + 10
    while queue.stats().ready < 3:  # by the store's clock, their claims have expired
        assert time.monotonic() < give_up, "the claims did not expire"
        time.sleep(0.02)
    queue.put("fresh")
    handled: list[str] = []
    # The first claim of 3 takes the expired items (oldest first) and kills them all.
    queue.work(lambda item: handled.append(item.value), batch=3, until_empty=True)
    assert handled == ["fresh"]
    assert (queue.stats().dead, queue.stats().done) == (3, 1)


def test_one_state_name_alone_is_that_state(fleet: Fleet) -> None:
    queue = fleet.queue("q")
    queue.put("a")
    assert [item.state for item in queue.items(states="ready")] == ["ready"]
    assert queue.items(states="dead") == []


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"visibility": 0}, "visibility must be longer than 0"),
        ({"visibility": "soon"}, "is not a duration"),
        ({"max_attempts": 0}, "max_attempts must be 1 to 1000"),
        ({"max_attempts": 2.5}, "max_attempts must be an integer"),
        ({"retry_backoff": -1}, "retry_backoff must not be negative"),
        ({"retry_backoff": "2h"}, "retry_backoff_max (1h) is shorter than retry_backoff (2h)"),
    ],
)
def test_bad_queue_settings_are_refused(fleet: Fleet, options: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        fleet.queue("q", **options)
    assert says in str(caught.value)


def test_bad_queue_names_are_refused(fleet: Fleet) -> None:
    for name, says in [("", "queue name is empty"), ("a\nb", "control character")]:
        with pytest.raises(ConfigurationError, match=says):
            fleet.queue(name)


def test_a_failed_item_backs_off_doubling_then_dies(fleet: Fleet) -> None:
    queue = fleet.queue("flaky", max_attempts=3, retry_backoff="10s", retry_backoff_max="15s")
    queue.put("x")
    (first,) = queue.claim()

    assert queue.nack(first, ValueError("nope")) == "ready"
    item = queue.items()[0]
    assert item.error == "ValueError: nope"
    assert item.available_us - item.now_us > 9_000_000, "10 s after the first failure"
    assert queue.settings.backoff_us(2) == 15_000_000, "doubled, at most the maximum"
    assert queue.nack(first, "stale") is None, "a delivery is given back once"


def test_the_worker_acknowledges_successes_and_kills_what_keeps_failing(fleet: Fleet) -> None:
    queue = fleet.queue("work", max_attempts=2, retry_backoff=0)
    queue.put_many(range(12))
    seen: Counter[int] = Counter()
    stop = threading.Event()

    def handle(item: Claimed) -> None:
        seen[item.value] += 1
        if sum(seen.values()) >= 13:  # 11 once, and 5 twice
            stop.set()
        if item.value == 5:
            raise RuntimeError("five is bad")

    bound = threading.Timer(30, stop.set)  # never hangs the suite
    bound.start()
    try:
        queue.work(handle, batch=4, idle="10ms", stop=stop)
    finally:
        bound.cancel()

    assert seen[5] == 2, "two deliveries, then dead"
    assert all(seen[n] == 1 for n in range(12) if n != 5)
    stats = queue.stats()
    assert (stats.done, stats.dead, stats.depth) == (11, 1, 0)
    (dead,) = queue.items(states=["dead"])
    assert dead.error == "RuntimeError: five is bad"
    assert queue.requeue([dead.item_id]) == 1
    assert queue.stats().ready == 1


async def test_the_async_worker_drains_with_several_loops(async_fleet: AsyncFleet) -> None:
    queue = async_fleet.queue("async-work", retry_backoff=0)
    await queue.put_many(range(40))
    handled: list[int] = []
    stop = asyncio.Event()

    async def handle(item: Claimed) -> None:
        handled.append(item.value)
        if len(handled) >= 40:
            stop.set()

    workers = [queue.work(handle, batch=5, idle="10ms", stop=stop) for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*workers), 30)

    assert sorted(handled) == list(range(40))
    stats = await queue.stats()
    assert (stats.done, stats.depth) == (40, 0)


def test_a_scheduled_job_fans_out_through_ctx_queue(fleet: Fleet) -> None:
    twice = threading.Event()
    slots: list[int] = []

    @fleet.job(every="200ms")
    def enqueue(ctx: RunContext) -> None:
        queue = ctx.queue("fan-out", max_attempts=3)
        slots.append(ctx.slot_us)
        # Each slot's items once, whichever run of the slot puts them.
        queue.put_many(
            Entry({"slot": ctx.slot_us, "part": n}, dedupe_key=f"{ctx.slot_us}:{n}")
            for n in range(3)
        )
        assert queue.put_many([Entry(0, dedupe_key=f"{ctx.slot_us}:0")]) == [None]
        if len(slots) >= 2:
            twice.set()

    fleet.start()
    try:
        assert twice.wait(30), "two runs"
    finally:
        fleet.stop()
    items = fleet.queue("fan-out").items()
    assert len(items) == 3 * len(slots)
    assert {item.max_attempts for item in items} == {3}


async def test_an_async_job_puts_with_aput_and_the_blocking_put_is_refused(
    async_fleet: AsyncFleet,
) -> None:
    done = asyncio.Event()
    refusals: list[str] = []

    @async_fleet.job(every="200ms")
    async def enqueue(ctx: RunContext) -> None:
        queue = ctx.queue("async-fan-out")
        await queue.aput({"slot": ctx.slot_us}, dedupe_key=str(ctx.slot_us))
        try:
            queue.put("blocked")
        except ConfigurationError as exc:
            refusals.append(str(exc))
        done.set()

    await async_fleet.start()
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await async_fleet.stop()
    stats = await async_fleet.queue("async-fan-out").stats()
    assert stats.ready >= 1
    assert "aput" in refusals[0]
