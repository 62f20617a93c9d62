"""The etcd client (fleetcron.stores.etcd) against real etcd members, sync and async.

Every test runs with both clients: ``etcd`` calls look the same (``await etcd.put(...)``);
the sync client's calls run in threads (``asyncio.to_thread``), so that concurrent calls
exercise its lock. The clusters are the module's own: one member for the API, three for
failover (healed after each failover test).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import pickle
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from etcd_server import EtcdCluster
from fleetcron.errors import StoreError, StoreRefused, StoreUnavailable
from fleetcron.stores.etcd import (
    AsyncEtcdClient,
    Compare,
    DeleteRange,
    DeleteRangeResponse,
    Endpoint,
    EtcdClient,
    EtcdCompacted,
    EtcdDuplicateKey,
    EtcdError,
    EtcdLeaseNotFound,
    EtcdNoSpace,
    EtcdRefused,
    EtcdRequestTooLarge,
    EtcdTooManyOps,
    EtcdUnavailable,
    GrpcCode,
    Put,
    Range,
    RangeResponse,
    Txn,
    TxnResponse,
    parse_endpoints,
    prefix_end,
)
from ports import spare_port

TIMEOUT_S = 1.0  # the failover tests' per-call deadline
SLACK_S = 1.0  # what a loaded two-core machine may add to a deadline
GUARD_S = 20.0  # far above any expected wait: only a hang reaches it

Address = tuple[str, int]


class Face:
    """One client, sync or async, called the same way: ``await face.put(...)``."""

    def __init__(self, client: EtcdClient | AsyncEtcdClient) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if isinstance(self.client, AsyncEtcdClient):
            return method

        async def in_thread(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return in_thread


Connect = Callable[..., Face]


@pytest.fixture(scope="module")
def single() -> Iterator[EtcdCluster]:
    """One member, for the API."""
    with EtcdCluster(1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def trio() -> Iterator[EtcdCluster]:
    """Three members, for failover."""
    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def secure() -> Iterator[EtcdCluster]:
    """One member serving clients over TLS (a self-signed certificate)."""
    with EtcdCluster(1, tls=True) as cluster:
        yield cluster


@pytest.fixture
def healed(trio: EtcdCluster) -> Iterator[EtcdCluster]:
    """The three members, all running and healthy again after the test."""
    yield trio
    trio.heal()


@pytest.fixture(params=["sync", "async"])
async def connect(request: pytest.FixtureRequest) -> AsyncIterator[Connect]:
    """Make a client of the parametrized kind on some endpoints; closed after the test."""
    opened: list[Face] = []

    def make(
        endpoints: list[Address] | list[Endpoint],
        timeout: float = 5.0,
        connect_timeout: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> Face:
        kind = EtcdClient if request.param == "sync" else AsyncEtcdClient
        face = Face(
            kind(
                endpoints,
                timeout=timeout,
                connect_timeout=connect_timeout,
                ssl_context=ssl_context,
            )
        )
        opened.append(face)
        return face

    yield make
    for face in opened:
        await face.close()


@pytest.fixture
def prefix() -> str:
    """Keys of this test's own."""
    return f"t/{uuid.uuid4().hex[:10]}/"


def _claim(key: str, holder: str, lease: int) -> Txn:
    """The lease-cycle acquire: create the key bound to the lease, or read who holds it."""
    return Txn([Compare.create_revision(key, "==", 0)], [Put(key, holder, lease)], [Range(key)])


def _fields(txn: Txn) -> tuple[Any, Any, Any]:
    return txn.compare, txn.success, txn.failure


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"


def _error_body(code: int, message: str) -> bytes:
    return json.dumps({"error": message, "message": message, "code": code}).encode()


def _http(
    status: int, body: bytes, *, chunked: bool = False, content_type: str = "application/json"
) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
    if chunked:  # as the gateway sends errors: in chunks, with a trailer
        return (
            f"{head}Trailer: Grpc-Trailer-Content-Type\r\nTransfer-Encoding: chunked\r\n\r\n"
            f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n"
        )
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


# ------------------------------------------------------------------------- no server


def test_endpoints_are_parsed_from_a_url_authority() -> None:
    assert parse_endpoints("a:1, https://b:2,[::1]:3,c") == (
        Endpoint("a", 1),
        Endpoint("b", 2, tls=True),
        Endpoint("::1", 3),
        Endpoint("c", 2379),
    )
    assert str(Endpoint("::1", 3, tls=True)) == "https://[::1]:3"
    for wrong in ("a:0", "a:x", ":1", "[::1", "a:1,,b:2", "a:١"):
        with pytest.raises(ValueError, match="etcd endpoint"):
            parse_endpoints(wrong)


def test_prefix_end_covers_the_prefix() -> None:
    assert prefix_end("a/") == b"a0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_errors_keep_their_fields_across_processes() -> None:
    error = EtcdUnavailable(
        "m", code=14, status=503, reason="r", endpoint=Endpoint("a", 1), outcome_unknown=True
    )
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, EtcdUnavailable)
    assert isinstance(copy, StoreUnavailable)
    assert (copy.message, copy.code, copy.status, copy.reason) == ("m", 14, 503, "r")
    assert (copy.endpoint, copy.outcome_unknown) == (Endpoint("a", 1), True)


def test_compares_are_checked_when_built() -> None:
    with pytest.raises(TypeError):
        Compare.value("k", "==", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Compare.version("k", "==", True)
    with pytest.raises(ValueError, match="operator"):
        Compare("k", "version", "=", 1)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- the API


async def test_lease_cycle_fences_increase_and_guard_the_delete(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    key = prefix + "lock"
    fences: list[int] = []
    for _ in range(5):
        lease, ttl = await etcd.grant(5)
        assert ttl >= 5
        won = await etcd.txn(*_fields(_claim(key, "holder-a", lease)))
        assert won.succeeded
        fence = won.revision
        other, _ = await etcd.grant(5)
        lost = await etcd.txn(*_fields(_claim(key, "holder-b", other)))
        assert not lost.succeeded
        held = lost.response(0, RangeResponse).kvs[0]
        assert (held.create_revision, held.value, held.lease) == (fence, b"holder-a", lease)
        stale = await etcd.txn([Compare.create_revision(key, "==", fence - 1)], [DeleteRange(key)])
        assert not stale.succeeded
        right = await etcd.txn([Compare.create_revision(key, "==", fence)], [DeleteRange(key)])
        assert right.succeeded
        assert right.response(0, DeleteRangeResponse).deleted == 1
        assert await etcd.revoke(lease)
        assert await etcd.revoke(other)
        fences.append(fence)
    assert fences == sorted(set(fences)), "fences strictly increase"


async def test_the_members_clock_is_bounded_by_the_date_of_its_answers(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    assert etcd.client.clock() is None  # nothing answered yet
    await etcd.range(prefix + "clock")
    first = etcd.client.clock()
    assert first is not None
    assert first.width < 1.5  # one answer: its second, and the round trip
    for _ in range(7):
        # Each answer asked when the member's second most likely turns (the store's clock
        # as bounded so far) halves the bounds, less a round trip.
        tick = etcd.client.next_tick()
        assert tick is not None
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
        await etcd.range(prefix + "clock")
    now, wall = time.monotonic(), time.time()
    bounds = etcd.client.clock(now)
    assert bounds is not None
    # The member runs on this host: its clock is this host's wall clock.
    assert bounds.low - 0.001 <= wall < bounds.high + 0.001, (bounds, wall)
    assert bounds.width < 0.05, bounds


async def test_every_compare_target_and_operator_decides(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    key, missing = prefix + "k", prefix + "missing"
    lease, _ = await etcd.grant(10)
    await etcd.put(key, b"v1", lease)
    await etcd.put(key, b"v2", lease)
    kv = (await etcd.range(key)).kvs[0]
    assert (kv.version, kv.lease) == (2, lease)
    cases = [
        (Compare.create_revision(key, "==", kv.create_revision), True),
        (Compare.create_revision(key, "!=", kv.create_revision), False),
        (Compare.mod_revision(key, "==", kv.mod_revision), True),
        (Compare.mod_revision(key, ">", kv.mod_revision - 1), True),
        (Compare.mod_revision(key, "<", kv.mod_revision), False),
        (Compare.mod_revision(key, "<", kv.mod_revision + 1), True),
        (Compare.version(key, "==", 2), True),
        (Compare.version(key, ">", 2), False),
        (Compare.value(key, "==", b"v2"), True),
        (Compare.value(key, "==", "v1"), False),
        (Compare.value(key, "!=", "v1"), True),
        (Compare.lease(key, "==", lease), True),
        (Compare.lease(key, "==", 0), False),
        (Compare.create_revision(missing, "==", 0), True),
        (Compare.version(missing, ">", 0), False),
    ]
    for compare, holds in cases:
        reply = await etcd.txn([compare], [Range(key)], [])
        assert reply.succeeded is holds, compare
        # the branch that ran answered: one range, or nothing
        assert len(reply.responses) == (1 if holds else 0)
    await etcd.revoke(lease)


async def test_127_nested_txns_in_one_request_and_128_refused(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    lease, _ = await etcd.grant(30)
    keys = [f"{prefix}slot/{i:03}" for i in range(128)]
    batch = [_claim(k, "me", lease) for k in keys]
    won = await etcd.txn(success=batch[:127])
    assert won.succeeded
    assert len(won.responses) == 127
    assert all(won.response(i, TxnResponse).succeeded for i in range(127))
    lost = await etcd.txn(success=batch[:127])
    for i in range(127):
        nested = lost.response(i, TxnResponse)
        assert not nested.succeeded
        # every put of one txn shares its revision: the holder's fence
        assert nested.response(0, RangeResponse).kvs[0].create_revision == won.revision
    with pytest.raises(EtcdTooManyOps) as refused:
        await etcd.txn(success=batch)
    error = refused.value
    assert error.code == GrpcCode.INVALID_ARGUMENT
    assert isinstance(error, StoreError)
    assert not isinstance(error, StoreUnavailable)
    assert "too many operations in txn request" in error.message
    assert (await etcd.range(keys[127])).count == 0, "nothing of the refused batch applied"
    await etcd.revoke(lease)


async def test_a_key_written_twice_in_one_txn_is_refused(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    key = prefix + "twice"
    with pytest.raises(EtcdDuplicateKey) as refused:
        await etcd.txn(success=[Put(key, "a"), Put(key, "b")])
    assert refused.value.code == GrpcCode.INVALID_ARGUMENT
    assert (await etcd.range(key)).count == 0


async def test_a_lease_that_is_gone_says_so(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    key = prefix + "leased"
    lease, _ = await etcd.grant(10)
    await etcd.put(key, "x", lease)
    ttl = await etcd.keepalive_once(lease)
    assert ttl is not None
    assert 0 < ttl <= 10
    live = await etcd.time_to_live(lease, keys=True)
    assert (live.id, live.granted_ttl, live.keys) == (lease, 10, (key.encode(),))
    assert 0 < live.ttl <= 10
    assert await etcd.revoke(lease) is True
    assert await etcd.keepalive_once(lease) is None
    assert await etcd.time_to_live(lease) is None
    assert await etcd.revoke(lease) is False
    assert (await etcd.range(key)).count == 0, "revoking deleted the lease's key"
    with pytest.raises(EtcdLeaseNotFound):
        await etcd.put(key, "x", lease)
    with pytest.raises(EtcdLeaseNotFound):
        await etcd.txn(success=[Put(key, "x", lease)])


async def test_binary_and_non_ascii_keys_and_values_round_trip(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    pairs: list[tuple[bytes | str, bytes | str]] = [
        (prefix.encode() + b"\x00\xff\xfe bin/\xc3", bytes(range(256)) * 4),
        (prefix + "clé/☃", "välue ☃ 𝄞"),
        (prefix + "empty", b""),
    ]
    for key, value in pairs:
        await etcd.put(key, value)
        (kv,) = (await etcd.range(key)).kvs
        expected = value.encode() if isinstance(value, str) else value
        assert (kv.key, kv.value, kv.version) == (
            key.encode() if isinstance(key, str) else key,
            expected,
            1,
        )
        assert (await etcd.txn([Compare.value(key, "==", value)])).succeeded


async def test_big_range_replies_arrive_whole(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    values = {f"{prefix}big/{i:03}".encode(): f"{i:03}".encode() * 67 for i in range(300)}
    items = list(values.items())
    for start in range(0, 300, 100):
        await etcd.txn(success=[Put(k, v) for k, v in items[start : start + 100]])
    low, high = f"{prefix}big/".encode(), prefix_end(f"{prefix}big/")
    everything = await etcd.range(low, high)
    assert (everything.count, everything.more) == (300, False)
    assert {kv.key: kv.value for kv in everything.kvs} == values
    assert [kv.key for kv in everything.kvs] == sorted(values)
    page = await etcd.range(low, high, limit=10)
    assert (len(page.kvs), page.count, page.more) == (10, 300, True)
    keys = await etcd.range(low, high, keys_only=True)
    assert len(keys.kvs) == 300
    assert all(kv.value == b"" for kv in keys.kvs)
    counted = await etcd.range(low, high, count_only=True)
    assert (counted.count, counted.kvs) == (300, ())
    # the reply above came in chunks (the gateway chunks replies over 32 KiB)
    host, port = single.endpoints[0]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        body = {"key": _b64(low), "range_end": _b64(high)}
        conn.request("POST", "/v3/kv/range", json.dumps(body))
        response = conn.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert len(response.read()) > 60_000
    finally:
        conn.close()


async def test_a_compacted_revision_is_refused(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    key = prefix + "history"
    first = await etcd.put(key, "1")
    second = await etcd.put(key, "2")
    assert (await etcd.range(key, revision=first.revision)).kvs[0].value == b"1"
    await etcd.compact(second.revision)
    with pytest.raises(EtcdCompacted) as refused:
        await etcd.range(key, revision=first.revision)
    assert refused.value.code == GrpcCode.OUT_OF_RANGE
    with pytest.raises(EtcdCompacted):
        await etcd.compact(first.revision)
    assert (await etcd.range(key)).kvs[0].value == b"2"


async def test_a_request_over_the_size_limit_is_refused(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    with pytest.raises(EtcdRequestTooLarge):
        await etcd.put(prefix + "huge", b"x" * 1_600_000)


async def test_status_members_and_alarms(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    status = await etcd.status()
    assert status.leader == status.header.member_id == single.member_id(0)
    assert status.raft_term >= 1
    assert status.db_size > 0
    assert status.version.startswith("3.")
    assert status.errors == ()
    (member,) = await etcd.member_list()
    host, port = single.endpoints[0]
    assert (member.id, member.name) == (status.header.member_id, "m0")
    assert member.client_urls == (f"http://{host}:{port}",)
    assert await etcd.alarm_list() == ()
    # NOSPACE, raised by hand (as the quota would): listed, and puts and grants refused
    alarm = {"memberID": str(status.header.member_id), "alarm": "NOSPACE"}
    assert single.post(0, "/v3/maintenance/alarm", {"action": "ACTIVATE", **alarm})[0] == 200
    try:
        (raised,) = await etcd.alarm_list()
        assert (raised.member_id, raised.alarm) == (status.header.member_id, "NOSPACE")
        assert (await etcd.status()).errors
        with pytest.raises(EtcdNoSpace) as refused:
            await etcd.put(prefix + "k", "v")
        assert refused.value.code == GrpcCode.RESOURCE_EXHAUSTED
        assert not isinstance(refused.value, StoreUnavailable)
        with pytest.raises(EtcdNoSpace):
            await etcd.grant(5)
        assert (await etcd.range(prefix + "k")).count == 0  # reads still served
    finally:
        single.post(0, "/v3/maintenance/alarm", {"action": "DEACTIVATE", **alarm})
    assert await etcd.alarm_list() == ()


async def test_concurrent_calls_share_one_client(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    etcd = connect(single.endpoints)
    puts = await asyncio.gather(*(etcd.put(f"{prefix}c/{i}", str(i)) for i in range(40)))
    assert len({p.revision for p in puts}) == 40
    reads = await asyncio.gather(*(etcd.range(f"{prefix}c/{i}") for i in range(40)))
    assert [r.kvs[0].value for r in reads] == [str(i).encode() for i in range(40)]


async def test_a_member_with_authentication_refuses_an_anonymous_client(
    connect: Connect, prefix: str
) -> None:
    with EtcdCluster(1) as locked:
        for path, body in (
            ("/v3/auth/user/add", {"name": "root", "password": "pw"}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/enable", {}),
        ):
            assert locked.post(0, path, body)[0] == 200, path
        etcd = connect(locked.endpoints)
        with pytest.raises(EtcdRefused) as refused:
            await etcd.range(prefix + "k")
        assert isinstance(refused.value, StoreRefused)
        assert "user name is empty" in refused.value.message


async def test_tls_members_are_reached_with_the_callers_ca(
    secure: EtcdCluster, connect: Connect, prefix: str
) -> None:
    endpoints = [Endpoint(host, port, tls=True) for host, port in secure.endpoints]
    etcd = connect(endpoints, ssl_context=secure.ssl_context())
    await etcd.put(prefix + "k", "over TLS")
    assert (await etcd.range(prefix + "k")).kvs[0].value == b"over TLS"
    untrusting = connect(endpoints)  # the system's CAs: the certificate is refused
    with pytest.raises(EtcdUnavailable, match="certificate verify failed") as failed:
        await untrusting.put(prefix + "k", "v")
    assert not failed.value.outcome_unknown
    plain = connect(secure.endpoints)  # HTTP to an HTTPS port: etcd hangs up
    with pytest.raises(EtcdUnavailable, match="broke during status"):
        await plain.status()


# ------------------------------------------------------------------ endpoints, deadlines


async def test_an_unreachable_first_endpoint_is_passed_over(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    closed = ("127.0.0.1", spare_port())
    etcd = connect([closed, *single.endpoints])
    await etcd.put(prefix + "k", "v")  # nothing was sent to the first: tried on the next
    assert etcd.client.endpoint == Endpoint(*single.endpoints[0])
    await etcd.put(prefix + "k", "w")  # and pinned there
    assert etcd.client.endpoint == Endpoint(*single.endpoints[0])


async def test_no_endpoint_answering_is_unavailable(connect: Connect, prefix: str) -> None:
    etcd = connect([("127.0.0.1", spare_port()), ("127.0.0.1", spare_port())])
    with pytest.raises(EtcdUnavailable) as failed:
        await etcd.put(prefix + "k", "v")
    assert "cannot connect" in failed.value.message
    assert not failed.value.outcome_unknown  # never sent


async def test_a_call_to_a_frozen_member_ends_at_its_deadline(
    healed: EtcdCluster, connect: Connect, prefix: str
) -> None:
    cluster = healed
    follower = (cluster.leader() + 1) % 3
    etcd = connect([cluster.endpoints[follower]], timeout=0.5, connect_timeout=0.5)
    await etcd.put(prefix + "k", "v")  # connected
    cluster.pause(follower)
    for call, args in (("range", (prefix + "k",)), ("put", (prefix + "k", "w"))):
        started = time.monotonic()
        with pytest.raises(EtcdUnavailable) as failed:
            await asyncio.wait_for(getattr(etcd, call)(*args), GUARD_S)
        elapsed = time.monotonic() - started
        assert 0.45 <= elapsed <= 0.5 + SLACK_S, (call, elapsed)
        error = failed.value
        assert "did not answer" in error.message
        assert error.code == GrpcCode.DEADLINE_EXCEEDED
        assert error.outcome_unknown is (call == "put")
        if call == "put":
            assert "may or may not have been applied" in error.message


async def test_a_reply_trickling_in_ends_at_the_deadline(connect: Connect) -> None:
    with _Trickler() as port:
        etcd = connect([("127.0.0.1", port)], timeout=0.6)
        started = time.monotonic()
        with pytest.raises(EtcdUnavailable, match="did not answer"):
            await asyncio.wait_for(etcd.status(), GUARD_S)
        assert time.monotonic() - started <= 0.6 + SLACK_S


async def test_a_frozen_leader_is_left_within_two_timeouts(
    healed: EtcdCluster, connect: Connect, prefix: str
) -> None:
    cluster = healed
    leader = cluster.leader()
    order = [leader, *(i for i in range(3) if i != leader)]
    etcd = connect([cluster.endpoints[i] for i in order], timeout=TIMEOUT_S)
    assert (await etcd.put(prefix + "k", "0")).header.member_id == cluster.member_id(leader)
    cluster.pause(leader)
    started = time.monotonic()
    failures: list[EtcdUnavailable] = []
    while True:
        try:
            served = await etcd.put(prefix + "k", "1")
            break
        except EtcdUnavailable as error:
            failures.append(error)
        assert time.monotonic() - started < GUARD_S, failures
    elapsed = time.monotonic() - started
    assert served.header.member_id != cluster.member_id(leader)
    assert failures, "the first write went to the frozen leader"
    assert failures[0].outcome_unknown
    assert elapsed <= 2 * TIMEOUT_S + SLACK_S, (elapsed, [f.message for f in failures])
    # pinned on the new member: the next calls do not go back to the frozen one
    for _ in range(5):
        reply = await etcd.range(prefix + "k")
        assert reply.header.member_id == served.header.member_id


async def test_writes_resume_after_the_leader_is_killed(
    healed: EtcdCluster, connect: Connect, prefix: str
) -> None:
    cluster = healed
    leader = cluster.leader()
    order = [leader, *(i for i in range(3) if i != leader)]
    etcd = connect([cluster.endpoints[i] for i in order], timeout=TIMEOUT_S)
    lease, _ = await etcd.grant(30)
    fences = [(await etcd.txn(*_fields(_claim(prefix + "before", "me", lease)))).revision]
    cluster.kill9(leader)
    killed = time.monotonic()
    failures = 0
    while True:
        try:
            reply = await etcd.txn(*_fields(_claim(f"{prefix}after/{failures}", "me", lease)))
            break
        except EtcdUnavailable:
            failures += 1
        assert time.monotonic() - killed < GUARD_S
    gap = time.monotonic() - killed
    assert reply.succeeded
    assert reply.header.member_id != cluster.member_id(leader)
    fences.append(reply.revision)
    assert fences[0] < fences[1]
    assert gap <= 3 * TIMEOUT_S + SLACK_S, (gap, failures)
    # the lease granted before the crash lives on under the new leader
    assert await etcd.keepalive_once(lease) is not None


async def test_a_member_without_a_leader_is_left(
    single: EtcdCluster, connect: Connect, prefix: str
) -> None:
    no_leader = _http(503, _error_body(14, "etcdserver: no leader"), chunked=True)
    with _Canned([no_leader]) as port:
        etcd = connect([("127.0.0.1", port), *single.endpoints])
        reply = await etcd.range(prefix + "k")  # a read: tried again on the next member
        assert reply.header.member_id == single.member_id(0)
        assert etcd.client.endpoint == Endpoint(*single.endpoints[0])
        writer = connect([("127.0.0.1", port), *single.endpoints])
        with pytest.raises(EtcdUnavailable) as failed:
            await writer.put(prefix + "k", "v")  # a write: never sent twice
        error = failed.value
        assert (error.code, error.status, error.outcome_unknown) == (14, 503, True)
        assert "no leader" in error.message
        assert "may or may not have been applied" in error.message
        assert writer.client.endpoint == Endpoint(*single.endpoints[0])
        await writer.put(prefix + "k", "v")  # the next call goes to the next member


_STATUS_BODY = b'{"header":{"member_id":"7","revision":"3"},"version":"3.4.23","leader":"7"}'


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"10;ext=1\r\n"
            + _STATUS_BODY[:16]
            + b"\r\n"
            + f"{len(_STATUS_BODY) - 16:x}".encode()
            + b"\r\n"
            + _STATUS_BODY[16:]
            + b"\r\n0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n",
            "3.4.23",
            id="chunks-extension-trailer",
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
            + _STATUS_BODY,
            "3.4.23",
            id="interim-then-body-to-close",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(
                b'{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader",'
                b'"http_status":"Service Unavailable"}}\n'
            ),
            (EtcdUnavailable, "no leader"),
            id="stream-error-in-200",
        ),
        pytest.param(
            _http(502, b"<html>Bad Gateway</html>", content_type="text/html"),
            (EtcdUnavailable, "Bad Gateway"),
            id="proxy-502-page",
        ),
        pytest.param(
            _http(429, _error_body(8, "etcdserver: too many requests")),
            (EtcdUnavailable, "overloaded"),
            id="too-many-requests",
        ),
        pytest.param(
            _http(403, _error_body(7, "etcdserver: permission denied")),
            (EtcdRefused, "permission denied"),
            id="permission-denied",
        ),
        pytest.param(b"hello\r\n\r\n", (EtcdUnavailable, "broke"), id="not-http"),
        pytest.param(
            _http(200, b'{"header":{"revision":"x"}}'),
            (EtcdError, "cannot read"),
            id="unreadable-200",
        ),
    ],
)
async def test_gateway_replies_are_read(
    connect: Connect, reply: bytes, expected: str | tuple[type[Exception], str]
) -> None:
    with _Canned([reply]) as port:
        etcd = connect([("127.0.0.1", port)], timeout=2.0)
        if isinstance(expected, str):
            assert (await etcd.status()).version == expected
            assert (await etcd.status()).leader == 7  # and again, on a new connection or not
            return
        kind, words = expected
        with pytest.raises(kind, match=words):
            await etcd.status()


class _Canned:
    """A server answering every request with the next of ``replies`` (the last again
    when they run out), one connection at a time, as long as the client keeps it."""

    def __init__(self, replies: list[bytes]) -> None:
        self._replies = replies
        self.served = 0
        self._conn: socket.socket | None = None
        self._server = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        port: int = self._server.getsockname()[1]
        return port

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._server.close()
        conn = self._conn
        if conn is not None:  # the client's connection: end the wait for its next request
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def _serve(self) -> None:
        self._server.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self._conn = conn
            with conn:
                conn.settimeout(5)
                try:
                    self._converse(conn)
                except OSError:
                    pass

    def _converse(self, conn: socket.socket) -> None:
        pending = b""
        while not self._stop.is_set():
            while b"\r\n\r\n" not in pending:
                data = conn.recv(65536)
                if not data:
                    return
                pending += data
            head, _, pending = pending.partition(b"\r\n\r\n")
            found = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
            length = int(found.group(1)) if found else 0
            while len(pending) < length:
                pending += conn.recv(65536)
            pending = pending[length:]
            reply = self._replies[min(self.served, len(self._replies) - 1)]
            self.served += 1
            conn.sendall(reply)
            if b"connection: close" in reply.lower() or not reply.startswith(b"HTTP/"):
                return


class _Trickler:
    """A server that accepts, reads a request and answers one byte every 50 ms: no
    single read ever waits long, only the whole reply does."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        port: int = self._server.getsockname()[1]
        return port

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(5)

    def _serve(self) -> None:
        self._server.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                    while not self._stop.wait(0.05):
                        conn.sendall(b" ")
                except OSError:
                    pass
