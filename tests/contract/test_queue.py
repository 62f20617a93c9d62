"""The work queue of every backend (docs/design/queue.md): one suite, every rule.

Each test drives the queue operations of ``store.ops`` directly. Every time is the store's
clock: tests read it and wait on it, never on the local one.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from contract.contract_support import run_together, started_together
from contract.queueworker import churn, drain
from fleetcron.queue_models import QueueItem, QueueNack, QueuePut
from fleetcron.stores import SyncStore
from fleetcron.stores.base import QueueOperations

SECOND = 1_000_000
LONG = 30 * SECOND  # never expires during a test
SHORT = 300_000  # expires within the test; the test waits for it on the store's clock
WORKER = Path(__file__).with_name("queueworker.py")


def stored(item: QueueItem) -> QueueItem:
    """The persistent part of an item (``now_us`` is only when it was read)."""
    return dataclasses.replace(item, now_us=0)


class Queue:
    """The queue operations of one store, in one namespace, for one queue by default."""

    def __init__(self, store: SyncStore, namespace: str, queue: str = "q") -> None:
        self.store = store
        self.ops = store.ops
        self.ns = namespace
        self.queue = queue

    def now(self) -> int:
        return self.store.run(self.ops.store_now())

    def wait_until(self, target_us: int, *, timeout: float = 10.0) -> int:
        give_up = time.monotonic() + timeout
        while True:
            now = self.now()
            if now >= target_us:
                return now
            assert time.monotonic() < give_up, "the store clock did not reach the target"
            time.sleep(min(max((target_us - now) / 1e6, 0.001), 0.05))

    def put(self, *payloads: Any, queue: str | None = None, **options: Any) -> list[int]:
        """Put items without dedupe keys: each gets an id."""
        puts = [QueuePut(payload=json.dumps(p), **options) for p in payloads]
        ids = self.store.run(self.ops.queue_put(self.ns, queue or self.queue, puts))
        assert None not in ids, ids
        return [i for i in ids if i is not None]

    def put_all(self, puts: Sequence[QueuePut], queue: str | None = None) -> list[int | None]:
        return self.store.run(self.ops.queue_put(self.ns, queue or self.queue, puts))

    def claim(
        self, limit: int = 10, *, holder: str = "h1", visibility_us: int = LONG, queue: str = ""
    ) -> list[QueueItem]:
        return self.store.run(
            self.ops.queue_claim(self.ns, queue or self.queue, holder, limit, visibility_us)
        )

    def extend(self, items: Sequence[QueueItem], visibility_us: int = LONG) -> list[int | None]:
        pairs = [(i.item_id, i.fence) for i in items]
        return self.store.run(self.ops.queue_extend(self.ns, self.queue, pairs, visibility_us))

    def ack(self, *items: QueueItem) -> list[bool]:
        pairs = [(i.item_id, i.fence) for i in items]
        return self.store.run(self.ops.queue_ack(self.ns, self.queue, pairs))

    def nack(self, item: QueueItem, error: str = "boom", retry_in_us: int = 0) -> str | None:
        nack = QueueNack(
            item_id=item.item_id, fence=item.fence, error=error, retry_in_us=retry_in_us
        )
        (answer,) = self.store.run(self.ops.queue_nack(self.ns, self.queue, [nack]))
        return answer

    def get(self, item_id: int | None) -> QueueItem:
        assert item_id is not None
        item = self.store.run(self.ops.queue_get(self.ns, self.queue, item_id))
        assert item is not None, f"no item {item_id}"
        return item

    def stats(self, queue: str | None = "") -> list[Any]:
        return self.store.run(self.ops.queue_stats(self.ns, self.queue if queue == "" else queue))

    def payloads(self, items: Sequence[QueueItem]) -> list[Any]:
        return [json.loads(item.payload) for item in items]


@pytest.fixture
def q(store: SyncStore, namespace: str) -> Queue:
    assert isinstance(store.ops, QueueOperations), "the backend has no queue operations"
    return Queue(store, namespace)


# -- put ------------------------------------------------------------------------------------


def test_put_adds_ready_items_with_increasing_ids_at_the_stores_clock(q: Queue) -> None:
    before = q.now()
    ids = q.put({"n": 1}, "two", [3], max_attempts=3)
    after = q.now()

    assert all(isinstance(i, int) for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    first = q.get(ids[0])
    assert (first.queue, first.state, first.attempts, first.max_attempts) == ("q", "ready", 0, 3)
    assert (first.fence, first.holder, first.finished_us, first.error) == (0, None, None, None)
    assert before <= first.created_us <= after
    assert first.available_us == first.created_us
    assert json.loads(first.payload) == {"n": 1}
    assert [json.loads(q.get(i).payload) for i in ids] == [{"n": 1}, "two", [3]]


def test_a_payload_comes_back_byte_for_byte(q: Queue) -> None:
    payload = json.dumps({"text": "naïve 'quote' \"dq\" ;DROP TABLE x;-- \\ 🎉 \u0000"})
    (item_id,) = q.put_all([QueuePut(payload=payload)])
    assert q.get(item_id).payload == payload
    (claimed,) = q.claim()
    assert claimed.payload == payload


def test_a_delayed_item_is_not_claimable_before_its_time(q: Queue) -> None:
    (later,) = q.put("later", delay_us=SHORT)
    (_now,) = q.put("now")
    item = q.get(later)
    assert item.available_us == item.created_us + SHORT

    assert q.payloads(q.claim()) == ["now"]
    q.wait_until(item.available_us)
    assert q.payloads(q.claim()) == ["later"]


def test_a_dedupe_key_is_put_once_in_any_state_even_within_one_call(q: Queue) -> None:
    ids = q.put_all(
        [
            QueuePut(payload='"a"', dedupe_key="k1"),
            QueuePut(payload='"b"', dedupe_key="k1"),
            QueuePut(payload='"c"', dedupe_key="k2"),
            QueuePut(payload='"d"'),
            QueuePut(payload='"e"'),
        ]
    )
    assert ids[1] is None
    assert None not in (ids[0], ids[2], ids[3], ids[4])
    assert q.get(ids[0]).dedupe_key == "k1"

    (item,) = q.claim(1)
    assert item.item_id == ids[0]
    assert q.put_all([QueuePut(payload='"again"', dedupe_key="k1")]) == [None], "claimed"
    assert q.ack(item) == [True]
    assert q.put_all([QueuePut(payload='"again"', dedupe_key="k1")]) == [None], "done"
    # Another queue, another namespace: keys are their own.
    assert q.put_all([QueuePut(payload='"x"', dedupe_key="k1")], queue="other") != [None]
    other = Queue(q.store, q.ns + "-2")
    assert other.put_all([QueuePut(payload='"x"', dedupe_key="k1")]) != [None]


# -- claim ------------------------------------------------------------------------------------


def test_claim_delivers_the_oldest_first_up_to_the_limit_and_holds_them(q: Queue) -> None:
    ids = q.put(*range(5))
    before = q.now()
    first = q.claim(3, holder="h1", visibility_us=LONG)
    after = q.now()

    assert [i.item_id for i in first] == ids[:3]
    for item in first:
        assert (item.state, item.attempts, item.holder, item.held) == ("claimed", 1, "h1", True)
        assert before <= item.now_us <= after
        assert item.fence >= item.now_us, "a fence is at least the store's clock of its claim"
        assert item.available_us == item.now_us + LONG
        assert stored(q.get(item.item_id)) == stored(item)
    second = q.claim(10, holder="h2")
    assert [i.item_id for i in second] == ids[3:]
    assert q.claim(10, holder="h3") == []
    assert q.claim(0) == []


def test_an_expired_claim_is_delivered_again_with_a_higher_fence(q: Queue) -> None:
    q.put("x", max_attempts=3)
    (first,) = q.claim(holder="h1", visibility_us=SHORT)
    assert q.claim(holder="h2") == []
    q.wait_until(first.available_us)

    (second,) = q.claim(holder="h2", visibility_us=LONG)

    assert second.item_id == first.item_id
    assert (second.attempts, second.holder) == (2, "h2")
    assert second.fence > first.fence
    # The first claimer's claim is stale: ack, nack and extend are refused, nothing changes.
    assert q.ack(first) == [False]
    assert q.nack(first) is None
    assert q.extend([first]) == [None]
    assert stored(q.get(first.item_id)) == stored(second)


def test_an_item_whose_claim_expired_with_no_deliveries_left_is_dead_not_delivered(
    q: Queue,
) -> None:
    (dies,) = q.put("dies", max_attempts=1)
    (first,) = q.claim(visibility_us=SHORT)
    q.wait_until(first.available_us)
    (lives,) = q.put("lives")

    got = q.claim(10)

    assert [i.item_id for i in got] == [lives]
    dead = q.get(dies)
    assert (dead.state, dead.attempts) == ("dead", 1)
    assert dead.finished_us is not None
    assert dead.finished_us >= first.available_us
    assert dead.error == "claim expired after 1 deliveries"
    assert q.ack(first) == [False]


def test_claims_of_other_queues_and_namespaces_do_not_mix(q: Queue) -> None:
    q.put("mine")
    q.put("theirs", queue="other")
    other_ns = Queue(q.store, q.ns + "-2")
    other_ns.put("elsewhere")

    assert q.payloads(q.claim()) == ["mine"]
    assert q.payloads(q.claim(queue="other")) == ["theirs"]
    assert other_ns.payloads(other_ns.claim()) == ["elsewhere"]


# -- extend, ack, nack -----------------------------------------------------------------------


def test_extend_moves_a_held_claims_expiry_and_refuses_a_stale_fence(q: Queue) -> None:
    q.put("a", "b")
    a, b = q.claim(2, visibility_us=SHORT)

    answers = q.extend([a, dataclasses.replace(b, fence=b.fence + 1)], LONG)

    assert answers[1] is None
    extended = q.get(a.item_id)
    assert answers[0] == extended.available_us
    assert extended.available_us >= a.now_us + LONG
    q.wait_until(b.available_us)
    assert [i.item_id for i in q.claim(10, holder="h2")] == [b.item_id], "a is still held"


def test_ack_finishes_a_held_item_once(q: Queue) -> None:
    q.put("a")
    (a,) = q.claim()

    assert q.ack(a) == [True]
    done = q.get(a.item_id)
    assert (done.state, done.fence, done.holder) == ("done", a.fence, "h1")
    assert done.finished_us is not None
    assert done.finished_us >= a.now_us
    assert q.ack(a) == [False], "acknowledged already"
    assert q.claim(10) == []


def test_nack_puts_an_item_back_after_its_backoff_then_kills_it_after_max_attempts(
    q: Queue,
) -> None:
    (item_id,) = q.put("flaky", max_attempts=2)
    (first,) = q.claim()

    assert q.nack(first, "first failure", retry_in_us=SHORT) == "ready"
    back = q.get(item_id)
    assert (back.state, back.error, back.attempts) == ("ready", "first failure", 1)
    assert back.available_us >= first.now_us + SHORT
    assert q.claim(10) == [], "backing off"
    q.wait_until(back.available_us)
    (second,) = q.claim(holder="h2")
    assert (second.attempts, second.holder) == (2, "h2")
    assert second.fence > first.fence

    assert q.nack(second, "second failure") == "dead"
    dead = q.get(item_id)
    assert (dead.state, dead.error) == ("dead", "second failure")
    assert dead.finished_us is not None
    assert q.claim(10) == []
    assert q.nack(second) is None


def test_requeue_gives_a_dead_item_its_deliveries_back(q: Queue) -> None:
    (item_id, alive) = q.put("poison", "fine", max_attempts=1)
    (poison, fine) = q.claim(2)
    assert q.nack(poison, "bad") == "dead"

    assert q.store.run(q.ops.queue_requeue(q.ns, "q", [item_id, alive, item_id, 999_999])) == 1

    again = q.get(item_id)
    assert (again.state, again.attempts, again.finished_us, again.holder) == (
        "ready",
        0,
        None,
        None,
    )
    assert again.error == "bad"
    assert again.fence == poison.fence
    (claimed,) = q.claim(1, holder="h2")
    assert claimed.item_id == item_id
    assert claimed.fence > poison.fence
    assert q.get(fine.item_id).state == "claimed"


# -- reading: get, list, stats ---------------------------------------------------------------


def test_list_and_stats_say_how_the_queue_stands(q: Queue) -> None:
    assert q.stats() == []
    assert q.stats(None) == []
    ids = q.put("r1", "r2", "c1", "d1", "x1", max_attempts=1)
    (later,) = q.put("s1", delay_us=LONG)
    q.put("elsewhere", queue="other")
    claimed = q.claim(3)
    now_before = claimed[0].now_us
    r1, r2, c1 = claimed
    assert q.ack(r1) == [True]
    assert q.nack(r2, "no") == "dead"

    (stats,) = q.stats()

    assert (stats.queue, stats.ready, stats.scheduled, stats.claimed) == ("q", 2, 1, 1)
    assert (stats.done, stats.dead, stats.depth) == (1, 1, 4)
    assert stats.oldest_us is not None
    assert stats.oldest_us <= now_before
    assert stats.oldest_age_us == stats.now_us - stats.oldest_us
    assert [s.queue for s in q.stats(None)] == ["other", "q"]
    listed = q.store.run(q.ops.queue_list(q.ns, "q", None, 100))
    assert [i.item_id for i in listed] == sorted([*ids, later], reverse=True)
    dead = q.store.run(q.ops.queue_list(q.ns, "q", ["dead"], 100))
    assert [i.item_id for i in dead] == [r2.item_id]
    two = q.store.run(q.ops.queue_list(q.ns, "q", ["ready", "claimed"], 2))
    assert [i.item_id for i in two] == [later, ids[4]]
    assert c1.state == "claimed"


# -- prune --------------------------------------------------------------------------------------


def test_prune_deletes_finished_items_older_than_the_age_and_frees_their_keys(q: Queue) -> None:
    puts = [QueuePut(payload=json.dumps(n), dedupe_key=f"k{n}", max_attempts=1) for n in range(4)]
    q.put_all(puts)
    done, dead, _held = q.claim(3)
    assert q.ack(done) == [True]
    assert q.nack(dead, "gone") == "dead"
    newest = max(q.get(done.item_id).finished_us or 0, q.get(dead.item_id).finished_us or 0)

    assert q.store.run(q.ops.queue_prune(q.ns, "q", LONG, 100)) == 0, "not old enough"
    q.wait_until(newest + 1)
    assert q.store.run(q.ops.queue_prune(q.ns, "q", 0, 100)) == 2

    left = q.store.run(q.ops.queue_list(q.ns, "q", None, 10))
    assert sorted(i.state for i in left) == ["claimed", "ready"]
    again = q.put_all([QueuePut(payload="1", dedupe_key=f"k{n}") for n in range(4)])
    assert [i is not None for i in again] == [True, True, False, False], "pruned keys are free"


def test_prune_is_bounded_and_takes_the_oldest_finished_first(q: Queue) -> None:
    q.put(*range(5))
    items = q.claim(5)
    for item in items:  # one by one: each finishes after the one before
        assert q.ack(item) == [True]
    q.put("still waiting")
    q.wait_until((q.get(items[-1].item_id).finished_us or 0) + 1)

    assert q.store.run(q.ops.queue_prune(q.ns, None, 0, 2)) == 2

    left = q.store.run(q.ops.queue_list(q.ns, "q", ["done"], 10))
    assert sorted(i.item_id for i in left) == [i.item_id for i in items[2:]]
    assert q.store.run(q.ops.queue_prune(q.ns, None, 0, 100)) == 3
    ((stats),) = q.stats()
    assert (stats.ready, stats.done) == (1, 0)


# -- concurrency ----------------------------------------------------------------------------


def _claimers(url: str, namespace: str, queue: str, count: int) -> list[dict[str, Any]]:
    commands = [
        [sys.executable, str(WORKER), url, namespace, queue, f"claimer-{index}"]
        for index in range(count)
    ]
    return run_together(commands, "claimer")


@pytest.mark.slow
def test_concurrent_claimers_never_get_the_same_item_and_drain_the_queue(
    q: Queue, backend_url: str
) -> None:
    ids = [i for i in q.put(*range(300)) if i is not None]
    if backend_url.startswith("memory"):
        results: list[dict[str, Any]] = []
        threads = [
            threading.Thread(
                target=lambda n=n: results.append(drain(q.store, q.ns, "q", f"claimer-{n}"))
            )
            for n in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    else:
        results = _claimers(backend_url, q.ns, "q", 4)

    claimed = Counter(item_id for r in results for item_id, _fence in r["claimed"])
    assert sorted(claimed) == sorted(ids), "every item delivered"
    assert max(claimed.values()) == 1, "no item delivered twice while held"
    acked = [pair for r in results for pair in r["acked"]]
    assert sorted(i for i, _ in acked) == sorted(ids)
    (stats,) = q.stats()
    assert (stats.done, stats.depth) == (300, 0)


@pytest.mark.slow
def test_a_claim_finds_an_item_put_while_neighbour_queues_are_busy(
    q: Queue, backend_url: str, namespace: str
) -> None:
    """Claims skip only the items another claim holds: busy neighbours, another queue of the
    namespace (one sorting just before, whose claims' index ranges end at this queue's
    first item) and another namespace, never hide an item a claim could take."""
    rounds = 150
    neighbours = [(namespace, "p"), (f"{namespace}-next", "q")]
    if backend_url.startswith("memory"):
        stop = threading.Event()
        done: list[dict[str, Any]] = []
        threads = [
            threading.Thread(
                target=lambda n=n, qn=qn: done.append(
                    churn(q.store, n, qn, f"neighbour-{qn}", stop.is_set)
                )
            )
            for n, qn in neighbours
        ]
        for thread in threads:
            thread.start()
        try:
            found = _claim_fresh_items(q, rounds)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
    else:
        commands = [
            [sys.executable, str(WORKER), backend_url, n, qn, f"neighbour-{qn}", "churn"]
            for n, qn in neighbours
        ]
        with started_together(commands, "neighbour") as finish:
            found = _claim_fresh_items(q, rounds)
            done = finish()

    assert found == [1] * rounds, "each claim found the one item just put"
    assert all(result["rounds"] > 0 for result in done), done


def _claim_fresh_items(q: Queue, rounds: int) -> list[int]:
    """Put one item, claim at once, acknowledge: how many items each claim found."""
    found = []
    for n in range(rounds):
        q.put(n)
        items = q.claim(10, holder="h1")
        found.append(len(items))
        q.ack(*items)
    return found
