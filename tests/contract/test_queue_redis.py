"""The work queue on a real Redis: what only the Redis store has.

Every rule of the queue is held on Redis by the generic suite (tests/contract/test_queue.py);
these tests are about the Redis store itself: one round trip per operation whatever the
number of items, its key layout (what a queue leaves behind, names that look like glob or
hash-tag syntax), ties in the sorted sets, the two ways ``queue_list`` reads, a
namespace-wide prune's limit over every queue, and a long random run of operations checked
against the in-memory reference.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection

from fleetcron.queue_models import QueueItem, QueueNack, QueuePut, QueueStats
from fleetcron.stores.memory import MemoryStore
from fleetcron.stores.redis import RedisStore
from fleetcron.stores.redis.queue import queue_keys
from fleetcron.stores.url import parse_store_url
from fleetcron.testing import FakeClock

pytestmark = pytest.mark.parametrize("backend_url", ["redis"], indirect=True)

LONG = 3_600_000_000  # never expires during a test, however loaded the machine


@pytest.fixture
def rs(backend_url: str, namespace: str) -> Iterator[RedisStore]:
    store = RedisStore(parse_store_url(backend_url))
    try:
        yield store
    finally:
        client = redis.Redis.from_url(backend_url)
        for key in client.scan_iter(match=f"fleetcron:{{{len(namespace)}:{namespace}:*"):
            client.delete(key)
        client.close()
        store.close()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every packed write a sync Redis connection sends: one per round trip."""
    sent: list[bytes] = []
    original: Any = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


def put(store: Any, ns: str, queue: str, *payloads: Any, **options: Any) -> list[int | None]:
    puts = [QueuePut(payload=json.dumps(p), **options) for p in payloads]
    return store.run(store.ops.queue_put(ns, queue, puts))  # type: ignore[no-any-return]


def claim(store: Any, ns: str, queue: str, limit: int, holder: str = "h") -> list[QueueItem]:
    return store.run(  # type: ignore[no-any-return]
        store.ops.queue_claim(ns, queue, holder, limit, LONG)
    )


def ack(store: Any, ns: str, queue: str, items: list[QueueItem]) -> list[bool]:
    pairs = [(item.item_id, item.fence) for item in items]
    return store.run(store.ops.queue_ack(ns, queue, pairs))  # type: ignore[no-any-return]


def test_every_operation_on_a_queue_is_one_round_trip_whatever_the_batch(
    rs: RedisStore, namespace: str, writes: list[bytes]
) -> None:
    def every_operation(queue: str, count: int) -> list[int]:
        ops = rs.ops
        ids = [i for i in put(rs, namespace, queue, *range(count), max_attempts=1) if i]
        items = claim(rs, namespace, queue, count + 10)
        half = count // 2
        assert ack(rs, namespace, queue, items[:half]) == [True] * half
        nacks = [QueueNack(item_id=i.item_id, fence=i.fence, error="e") for i in items[half:]]
        assert set(rs.run(ops.queue_nack(namespace, queue, nacks))) == {"dead"}
        assert rs.run(ops.queue_requeue(namespace, queue, ids)) == count - half
        assert rs.run(ops.queue_extend(namespace, queue, [(ids[0], 1)], LONG)) == [None]
        assert rs.run(ops.queue_get(namespace, queue, ids[0])) is not None
        assert len(rs.run(ops.queue_list(namespace, queue, ["ready"], count))) == count - half
        assert len(rs.run(ops.queue_list(namespace, queue, None, count))) == count
        (stats,) = rs.run(ops.queue_stats(namespace, queue))
        assert (stats.ready, stats.done) == (count - half, half)
        assert rs.run(ops.queue_prune(namespace, queue, 0, count)) == half
        return ids

    every_operation("warm", 2)  # each script is in the server's cache from here on
    writes.clear()

    every_operation("q", 200)

    assert len(writes) == 11, "one round trip per operation"


def test_equal_available_times_come_out_lowest_id_first_past_nine(
    rs: RedisStore, namespace: str
) -> None:
    # One put, one TIME: every item has the same available_us, and ids 1..25 would sort
    # as text ("10" < "9") if the members were not padded.
    ids = put(rs, namespace, "q", *range(25))
    got = [item.item_id for item in claim(rs, namespace, "q", 7)]
    got += [item.item_id for item in claim(rs, namespace, "q", 100)]
    assert got == ids


def test_a_queue_leaves_only_its_counter_and_ids_go_on_after_a_full_prune(
    rs: RedisStore, namespace: str, backend_url: str
) -> None:
    first = put(rs, namespace, "q", "a", "b", dedupe_key=None)
    assert ack(rs, namespace, "q", claim(rs, namespace, "q", 10)) == [True, True]
    assert rs.run(rs.ops.queue_prune(namespace, None, 0, 10)) == 2

    client = redis.Redis.from_url(backend_url)
    try:
        left = sorted(
            key.decode()
            for key in client.scan_iter(match=f"fleetcron:{{{len(namespace)}:{namespace}:*")
        )
    finally:
        client.close()
    assert left == [queue_keys(namespace, "q")[1]], "only the id counter"
    assert rs.run(rs.ops.queue_stats(namespace, None)) == []
    assert rs.run(rs.ops.queue_stats(namespace, "q")) == []
    (again,) = put(rs, namespace, "q", "c")
    assert again is not None
    assert again > max(i for i in first if i is not None)


def test_queue_keys_are_invisible_to_the_lease_and_ledger_scans(
    rs: RedisStore, namespace: str
) -> None:
    put(rs, namespace, "q", "x", dedupe_key="k")
    claim(rs, namespace, "q", 1)
    assert rs.run(rs.ops.lease_list(namespace)) == []
    assert rs.run(rs.ops.lease_prune(namespace, 0, True)) == []
    assert rs.run(rs.ops.job_list(namespace)) == []
    assert rs.run(rs.ops.run_list(namespace, None, 10)) == []


def test_queue_names_like_glob_or_hash_tag_syntax_are_found_by_name(
    rs: RedisStore, namespace: str
) -> None:
    names = ["a*b", "c}:ids", "c", "d[e]?", "f\\g"]
    for name in names:
        put(rs, namespace, name, name)
    stats = rs.run(rs.ops.queue_stats(namespace, None))
    assert [s.queue for s in stats] == sorted(names)
    assert all(s.ready == 1 for s in stats)
    for name in names:
        (item,) = claim(rs, namespace, name, 10)
        assert json.loads(item.payload) == name


def test_list_reads_the_same_rows_by_either_path(rs: RedisStore, namespace: str) -> None:
    # 300 items: 250 done, 5 dead, 45 ready. Listing "done" walks the id index (many
    # match); listing "dead" reads the dead set and sorts it (few match).
    put(rs, namespace, "q", *range(300), max_attempts=1)
    held = claim(rs, namespace, "q", 255)
    assert all(ack(rs, namespace, "q", held[:250]))
    for item in held[250:]:
        nack = QueueNack(item_id=item.item_id, fence=item.fence, error="x")
        assert rs.run(rs.ops.queue_nack(namespace, "q", [nack])) == ["dead"]
    everything = rs.run(rs.ops.queue_list(namespace, "q", None, 1000))
    assert [i.item_id for i in everything] == sorted((i.item_id for i in everything), reverse=True)

    for states, limit in [
        (["done"], 7),
        (["done"], 1000),
        (["dead"], 3),
        (["dead", "ready"], 10),
        (["ready", "claimed", "dead", "done"], 20),
        (["nonsense"], 5),
        (["dead", "dead"], 10),
    ]:
        listed = rs.run(rs.ops.queue_list(namespace, "q", states, limit))
        expected = [i for i in everything if i.state in states][:limit]
        assert [dataclasses.replace(i, now_us=0) for i in listed] == [
            dataclasses.replace(i, now_us=0) for i in expected
        ], (states, limit)


def test_a_namespace_wide_prune_takes_the_oldest_finished_of_every_queue(
    rs: RedisStore, namespace: str
) -> None:
    # Finished in this order: a1, b1, a2, b2, a3 (one ack each, so each its own TIME).
    order = []
    for queue in ("a", "b"):
        put(rs, namespace, queue, 1, 2, 3)
    held = {queue: claim(rs, namespace, queue, 3) for queue in ("a", "b")}
    for queue, index in [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]:
        item = held[queue][index]
        assert ack(rs, namespace, queue, [item]) == [True]
        order.append((queue, item.item_id))

    assert rs.run(rs.ops.queue_prune(namespace, None, 0, 3)) == 3

    def finished(queue: str) -> set[int]:
        rows = rs.run(rs.ops.queue_list(namespace, queue, ["done"], 10))
        return {row.item_id for row in rows}

    assert finished("a") == {order[4][1]}
    assert finished("b") == {order[3][1]}
    assert rs.run(rs.ops.queue_prune(namespace, None, 0, 100)) == 2
    assert [(s.queue, s.claimed, s.done) for s in rs.run(rs.ops.queue_stats(namespace, None))] == [
        ("b", 1, 0)
    ], "a has no items left: not listed"


# -- against the reference ------------------------------------------------------------------


def _norm(item: QueueItem) -> tuple[Any, ...]:
    """What two stores with different clocks must agree on about an item."""
    return (
        item.item_id,
        item.dedupe_key,
        item.payload,
        item.state,
        item.attempts,
        item.max_attempts,
        item.fence > 0,
        item.holder,
        item.finished_us is None,
        item.error,
    )


def _norm_stats(rows: list[QueueStats]) -> list[tuple[Any, ...]]:
    return [
        (s.queue, s.ready, s.scheduled, s.claimed, s.done, s.dead, s.oldest_us is None)
        for s in rows
    ]


def _params(rnd: random.Random, kind: str, top: int) -> dict[str, Any]:
    """Random arguments of one operation; ``top``: the highest id put so far."""
    ids = [rnd.randint(1, top + 2) for _ in range(rnd.randint(1, 4))]
    if rnd.random() < 0.2:  # every item: so that requeue, ack and nack find their kind
        ids = list(range(1, top + 1)) or ids
    return {
        "puts": [
            QueuePut(
                payload=json.dumps(rnd.random()),
                dedupe_key=rnd.choice([None, None, "k1", "k2", "k3", "k4"]),
                delay_us=rnd.choice([0, 0, 0, LONG]),
                max_attempts=rnd.randint(1, 3),
            )
            for _ in range(rnd.randint(0, 4))
        ],
        "limit": rnd.randint(0, 5),
        "holder": rnd.choice(["h1", "h2"]),
        "ids": ids,
        "stale": {i for i in ids if rnd.random() < 0.2},
        "retry": rnd.choice([0, LONG]),
        "queue": rnd.choice(["q", None]),
        "states": rnd.choice([None, ["ready"], ["claimed", "dead"], ["done"], ["dead"]]),
    }


def _apply(store: Any, ns: str, fences: dict[int, int], kind: str, p: dict[str, Any]) -> Any:
    """Run operation ``kind`` with arguments ``p`` on ``store``; a claim's fence is the one
    this store gave the item last (0 if none), or one less for a stale claim."""
    ops = store.ops
    pairs = [(i, fences.get(i, 0) - (i in p["stale"])) for i in p["ids"]]
    operations = {
        "put": lambda: ops.queue_put(ns, "q", p["puts"]),
        "claim": lambda: ops.queue_claim(ns, "q", p["holder"], p["limit"], LONG),
        "ack": lambda: ops.queue_ack(ns, "q", pairs),
        "extend": lambda: ops.queue_extend(ns, "q", pairs, LONG),
        "nack": lambda: ops.queue_nack(
            ns,
            "q",
            [
                QueueNack(item_id=i, fence=fence, error=f"e{i}", retry_in_us=p["retry"])
                for i, fence in pairs
            ],
        ),
        "requeue": lambda: ops.queue_requeue(ns, "q", p["ids"]),
        "prune": lambda: ops.queue_prune(ns, p["queue"], 0, p["limit"]),
        "list": lambda: ops.queue_list(ns, "q", p["states"], p["limit"]),
        "stats": lambda: ops.queue_stats(ns, p["queue"]),
        "get": lambda: ops.queue_get(ns, "q", p["ids"][0]),
    }
    answer = store.run(operations[kind]())
    if kind == "claim":
        fences.update((item.item_id, item.fence) for item in answer)
    return answer


def _comparable(kind: str, answer: Any) -> Any:
    """What of an answer two stores with different clocks must agree on."""
    if kind in ("claim", "list"):
        return [_norm(item) for item in answer]
    if kind == "get":
        return None if answer is None else _norm(answer)
    if kind == "extend":
        return [expiry is None for expiry in answer]
    if kind == "stats":
        return _norm_stats(answer)
    return answer


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_run_answers_as_the_reference_does(
    rs: RedisStore, namespace: str, seed: int
) -> None:
    """The same random operations on Redis and on the in-memory store (whose clock steps
    1 ms after each operation, so that no two operations share a time on either) answer the
    same, once each store's own fences and times are set aside."""
    rnd = random.Random(seed)
    clock = FakeClock()
    memory = MemoryStore(clock=clock)
    fences: dict[str, dict[int, int]] = {"redis": {}, "memory": {}}
    kinds = ["put", "put", "claim", "claim", "ack", "nack", "extend", "requeue"]
    kinds += ["prune", "list", "stats", "get"]
    top = 0
    for step in range(300):
        kind = rnd.choice(kinds)
        params = _params(rnd, kind, top)
        on_redis = _apply(rs, namespace, fences["redis"], kind, params)
        on_memory = _apply(memory, namespace, fences["memory"], kind, params)
        clock.advance(micros=1_000)
        assert _comparable(kind, on_redis) == _comparable(kind, on_memory), (step, kind, params)
        if kind == "put":
            top = max([top, *(i for i in on_memory if i is not None)])
