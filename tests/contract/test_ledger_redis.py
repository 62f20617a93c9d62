"""The run ledger on a real Redis: what only the Redis store has.

Every rule of docs/design/ledger.md is held on Redis by the generic contract suite
(tests/contract/test_ledger.py, which runs on every backend); these tests are about the
Redis store itself: its clock, one round trip per batch of script calls (and one call per
job on a Cluster), a script cache the server lost, the connection a single call is sent on,
and the async store. Each test has its own namespace. Under ``CI=true`` a missing Redis fails.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection

from fleetcron.models import RunOutcome, RunRecord, SlotClaim
from fleetcron.stores.redis import AsyncRedisStore, RedisOperations, RedisStore
from fleetcron.stores.url import parse_store_url

pytestmark = pytest.mark.parametrize("backend_url", ["redis"], indirect=True)

HOLDER = "host:1:tok"
LONG = 30_000_000  # outlives any test
SHORT = 150_000  # an attempt whose holder "vanishes"
HOUR = 3_600_000_000


@pytest.fixture
def rs(backend_url: str, namespace: str) -> Iterator[RedisStore]:
    store = RedisStore(parse_store_url(backend_url))
    try:
        yield store
    finally:
        client = redis.Redis.from_url(backend_url)
        pattern = f"fleetcron:{{{len(namespace)}:{namespace}:*"
        for key in client.scan_iter(match=pattern):
            client.delete(key)
        client.close()
        store.close()


def now(store: RedisStore) -> int:
    return store.run(store.ops.store_now())


def claim(
    store: RedisStore,
    namespace: str,
    *claims: SlotClaim,
    holder: str = HOLDER,
    ttl_us: int = LONG,
) -> list[RunRecord]:
    answers = store.run(store.ops.run_claim(namespace, list(claims), holder, ttl_us))
    return [answer.run for answer in answers if answer.run is not None]


def one(
    store: RedisStore, namespace: str, job: str, slot_us: int, ttl_us: int = LONG, **kw: Any
) -> RunRecord:
    runs = claim(
        store,
        namespace,
        SlotClaim(job=job, slot_us=slot_us, run_id=f"run-{slot_us}", **kw),
        ttl_us=ttl_us,
    )
    assert len(runs) == 1, "the slot should have been claimed"
    return runs[0]


# -- what only Redis has ---------------------------------------------------------------------
def test_store_now_is_the_servers_clock(rs: RedisStore, backend_url: str) -> None:
    seconds, micros = redis.Redis.from_url(backend_url).time()
    assert abs(now(rs) - (seconds * 1_000_000 + micros)) < 5_000_000


# -- round trips ----------------------------------------------------------------------------------
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


def test_a_batch_of_claims_is_one_round_trip(
    rs: RedisStore, namespace: str, writes: list[bytes]
) -> None:
    slot = now(rs) - 1_000
    one(rs, namespace, "warm", slot)  # the script is in the server's cache
    writes.clear()

    claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(20)]
    runs = claim(rs, namespace, *claims)

    assert [run.job for run in runs] == [f"job{k}" for k in range(20)]
    assert len(writes) == 1
    assert len({run.started_us for run in runs}) == 1  # one script, one TIME


def test_a_cluster_batch_is_one_call_per_job_in_one_round_trip(
    rs: RedisStore, namespace: str, writes: list[bytes]
) -> None:
    rs.ops = RedisOperations(cluster=True)
    base = now(rs) - 10_000
    one(rs, namespace, "warm", base)
    writes.clear()

    claims = [
        SlotClaim(job=f"job{k % 3}", slot_us=base + k, run_id=f"r{k}", exclusive=False)
        for k in range(9)
    ]
    runs = claim(rs, namespace, *claims)

    assert [run.run_id for run in runs] == [f"r{k}" for k in range(9)]
    assert len(writes) == 1
    assert len({run.started_us for run in runs if run.job == "job1"}) == 1


def test_a_batch_survives_a_script_cache_the_server_lost(rs: RedisStore, namespace: str) -> None:
    rs._scripts["run_claim"].sha = "0" * 40  # as after SCRIPT FLUSH or a failover
    slot = now(rs) - 1_000
    claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(3)]

    assert [run.job for run in claim(rs, namespace, *claims)] == ["job0", "job1", "job2"]
    assert rs._scripts["run_claim"].sha != "0" * 40


def test_a_single_call_survives_a_script_cache_the_server_lost(
    rs: RedisStore, namespace: str
) -> None:
    rs._scripts["lease_acquire"].sha = "0" * 40  # as after SCRIPT FLUSH or a failover
    record = rs.run(rs.ops.lease_acquire(namespace, "lock", HOLDER, LONG, 0))

    assert record is not None
    assert rs._scripts["lease_acquire"].sha != "0" * 40
    assert rs.run(rs.ops.lease_release(namespace, "lock", HOLDER, record.fence))


def test_a_connection_the_server_closed_while_idle_is_opened_again_before_the_next_call(
    backend_url: str, rs: RedisStore, namespace: str
) -> None:
    first = rs.run(rs.ops.lease_acquire(namespace, "lock", HOLDER, LONG, 0))
    assert first is not None
    host, port = rs._conn._sock.getsockname()[:2]  # the server knows it by this address
    killer = redis.Redis.from_url(backend_url)
    try:
        assert killer.client_kill_filter(addr=f"{host}:{port}") == 1
    finally:
        killer.close()
    # The server has closed it; wait until the close has reached this end (a condition,
    # not a sleep) so the next call finds it closed rather than racing the FIN.
    until = time.monotonic() + 10
    while not _closed_here(rs._conn):
        assert time.monotonic() < until, "the server's close never arrived"

    assert rs.run(rs.ops.lease_release(namespace, "lock", HOLDER, first.fence))
    assert rs.run(rs.ops.lease_acquire(namespace, "lock", HOLDER, LONG, 0)) is not None


def _closed_here(conn: Any) -> bool:
    sock = conn._sock
    readable, _, _ = select.select([sock], [], [], 0.05)
    return bool(readable)  # end-of-file is readable


def test_a_store_used_after_a_fork_opens_a_connection_of_its_own_and_closes_once(
    rs: RedisStore, namespace: str
) -> None:
    held = rs.run(rs.ops.lease_acquire(namespace, "parent", HOLDER, LONG, 0))
    assert held is not None
    parent_socket = rs._conn._sock
    child = os.fork()
    if child == 0:  # the child: a lease of its own on a connection of its own
        ok = False
        try:
            got = rs.run(rs.ops.lease_acquire(namespace, "child", "host:2:tok", LONG, 0))
            own = rs._conn._sock is not parent_socket
            ok = (
                got is not None
                and own
                and rs.run(rs.ops.lease_release(namespace, "child", "host:2:tok", got.fence))
            )
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert rs._conn._sock is parent_socket  # the parent's connection was left alone
    assert rs.run(rs.ops.lease_release(namespace, "parent", HOLDER, held.fence))
    rs.close()
    rs.close()  # a second close changes nothing


async def test_the_async_store_runs_the_same_ledger(backend_url: str, namespace: str) -> None:
    store = AsyncRedisStore(parse_store_url(backend_url))
    await store.open()
    try:
        slot = await store.run(store.ops.store_now()) - 1_000
        claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(3)]
        store._scripts["run_claim"].sha = "0" * 40
        answers = await store.run(store.ops.run_claim(namespace, claims, HOLDER, LONG))
        runs = [answer.run for answer in answers if answer.run is not None]
        assert [run.job for run in runs] == ["job0", "job1", "job2"]
        again = await store.run(store.ops.run_claim(namespace, claims, HOLDER, LONG))
        assert [answer.status for answer in again] == ["taken"] * 3
        outcome = RunOutcome(state="succeeded")
        assert await store.run(
            store.ops.run_finish(namespace, "job0", slot, runs[0].fence, outcome)
        )
        listed = await store.run(store.ops.run_list(namespace, None, 10))
        assert [(run.job, run.state) for run in listed] == [
            ("job0", "succeeded"),
            ("job1", "running"),
            ("job2", "running"),
        ]
        assert len(await store.run(store.ops.lease_list(namespace))) == 3
    finally:
        client = redis.Redis.from_url(backend_url)
        for key in client.scan_iter(match=f"fleetcron:{{{len(namespace)}:{namespace}:*"):
            client.delete(key)
        client.close()
        await store.close()
