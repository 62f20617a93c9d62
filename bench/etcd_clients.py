"""etcd client bake-off for fleetcron's etcd backend: which client, by measurement.

Run it with a Python that has the candidates installed (none of them is a fleetcron
dependency; fleetcron itself is not imported)::

    python3 -m venv /tmp/etcdclients/all
    /tmp/etcdclients/all/bin/pip install aetcd etcd3aio python3-etcd3 httpx httpx2
    /tmp/etcdclients/all/bin/python bench/etcd_clients.py              # all, ~2.5 min
    /tmp/etcdclients/all/bin/python bench/etcd_clients.py --pypi --json /tmp/etcd.json
    /tmp/etcdclients/all/bin/python bench/etcd_clients.py --clients gw-stdlib,etcd3aio \\
        --iterations 100 --no-failover

It needs the ``etcd`` binary (3.4+; ``apt-get install etcd-server``, or ``--etcd PATH``).
It starts its own 3-member cluster on spare loopback ports in a temporary directory,
runs every candidate that imports, and stops the members by pid at the end.

Candidates (``--clients``; a candidate whose module does not import is listed, not run):

- ``aetcd`` (asyncio, grpc), ``etcd3aio`` (asyncio, grpc), ``python3-etcd3`` (sync, grpc;
  the maintained fork of ``etcd3``, imported as ``etcd3``);
- the etcd v3 JSON gateway (``POST /v3/kv/txn``, ``/v3/lease/grant|keepalive|revoke``,
  base64 keys) over ``httpx`` and ``httpx2`` (sync and async each), the standard library's
  ``http.client`` (sync, one persistent connection) and raw asyncio streams (async, a
  ~60-line HTTP/1.1 client here: what "no dependency" costs on the async side).

The grpc libraries cannot share a process: each registers etcd's ``.proto`` files in
protobuf's default descriptor pool ("duplicate file name kv.proto"). So each candidate runs
in a child process of this script (``--worker NAME``), and the parent never imports grpc.
Async clients are driven from plain code through one ``asyncio.Runner`` kept for the whole
run; its per-call overhead is measured and printed (tens of microseconds).

Measured per client:

a. acquire = LeaseGrant(ttl) + Txn(compare create_revision(key)==0 -> put(key, v, lease)
   else get(key)); the fence is the txn's revision (the holder's create_revision when
   lost). p50/p99 over ``--iterations``, and the full cycle grant + txn + guarded delete
   (txn compare create_revision==fence -> delete) + revoke. Fences must strictly increase;
   a second holder must lose and see the first one's fence; a wrong fence must not delete.
b. batch claim: one txn whose success branch holds N nested txns (``--batch``, 127: etcd's
   default ``--max-txn-ops`` is 128 and nested ops count against the outer txn's budget),
   latency when all N win and when all N lose; N+1 must be refused (error shape recorded).
c. failover, the client given all 3 endpoints: SIGSTOP the leader and count the full
   cycles that complete in ``--freeze`` seconds (each call with a ``--timeout`` deadline),
   then SIGCONT; then an acquire loop every 20 ms, SIGKILL the leader and measure the gap
   until a write succeeds again. Which member served each call is read from the response
   headers' ``member_id`` (the endpoint policy as observed). The killed member is
   restarted by the parent before the next candidate.
d. import time (fresh interpreter, median of 5), installed size of the distribution and
   everything it requires (from the installed RECORDs: grpcio, protobuf, ...), its
   requirement pins, and with ``--pypi`` the index's JSON metadata (release dates,
   authors/maintainers).

Also printed: facts about the JSON gateway of the running etcd that a backend author must
handle (path prefixes, int64 as strings, omitted zero fields, error shapes), checked live.

The numbers are from whatever machine runs this; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import importlib
import importlib.metadata
import itertools
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

VALUE = b"bench-holder"
PACE_S = 0.02  # between acquires in the SIGKILL loop


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidate:
    name: str
    module: str  # must import for the candidate to run
    dist: str | None  # the distribution measured for size and pins (None: standard library)
    mode: str  # "sync" | "async"
    imports: str  # statement timed in a fresh interpreter
    opener: str  # name of the function in this module that opens the adapter


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("aetcd", "aetcd", "aetcd", "async", "import aetcd", "open_aetcd"),
    Candidate("etcd3aio", "etcd3aio", "etcd3aio", "async", "import etcd3aio", "open_etcd3aio"),
    Candidate("python3-etcd3", "etcd3", "python3-etcd3", "sync", "import etcd3", "open_p3"),
    Candidate("gw-httpx", "httpx", "httpx", "sync", "import httpx", "open_gw_httpx"),
    Candidate("gw-httpx-async", "httpx", "httpx", "async", "import httpx", "open_gw_httpx_async"),
    Candidate("gw-httpx2", "httpx2", "httpx2", "sync", "import httpx2", "open_gw_httpx2"),
    Candidate(
        "gw-httpx2-async", "httpx2", "httpx2", "async", "import httpx2", "open_gw_httpx2_async"
    ),
    Candidate(
        "gw-stdlib",
        "http.client",
        None,
        "sync",
        "import http.client, json, base64",
        "open_gw_stdlib",
    ),
    Candidate(
        "gw-asyncio",
        "asyncio",
        None,
        "async",
        "import asyncio, json, base64",
        "open_gw_asyncio",
    ),
)
BY_NAME = {c.name: c for c in CANDIDATES}


# ------------------------------------------------------------------ the JSON gateway


class Unavailable(Exception):
    """The pinned endpoint did not answer (connect error, timeout, reset, HTTP 503);
    the gateway client has moved to the next endpoint. The call may have been applied."""


class GatewayError(Exception):
    """The gateway answered with an error: ``{"error", "message", "code"}`` (grpc code)."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(f"HTTP {status} code {code}: {message}")
        self.status, self.code, self.message = status, code, message


def b64(data: bytes) -> str:
    """Keys and values travel as standard base64 (the URL-safe alphabet is refused)."""
    return base64.b64encode(data).decode("ascii")


def _create_is(key: bytes, revision: int) -> dict[str, Any]:
    # int64 fields go as strings (JSON numbers are accepted too, but lose precision in
    # other languages); a zero value may equally be left out.
    return {
        "key": b64(key),
        "target": "CREATE",
        "result": "EQUAL",
        "create_revision": str(revision),
    }


def gw_acquire(key: bytes, value: bytes, lease: int) -> dict[str, Any]:
    return {
        "compare": [_create_is(key, 0)],
        "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}],
        "failure": [{"request_range": {"key": b64(key)}}],
    }


def gw_acquired(reply: dict[str, Any]) -> tuple[bool, int]:
    """(won, fence): "succeeded" is left out when false, int64 fields are strings."""
    if reply.get("succeeded", False):
        return True, int(reply["header"]["revision"])
    kvs = reply["responses"][0]["response_range"].get("kvs", [])
    return False, int(kvs[0]["create_revision"]) if kvs else 0


def gw_release(key: bytes, fence: int) -> dict[str, Any]:
    return {
        "compare": [_create_is(key, fence)],
        "success": [{"request_delete_range": {"key": b64(key)}}],
    }


def gw_batch(keys: list[bytes], value: bytes, lease: int) -> dict[str, Any]:
    return {"success": [{"request_txn": gw_acquire(k, value, lease)} for k in keys]}


def gw_batch_won(reply: dict[str, Any]) -> int:
    return sum(1 for r in reply.get("responses", []) if r["response_txn"].get("succeeded"))


def gw_answer(status: int, raw: bytes) -> dict[str, Any]:
    """A gateway reply as a dict, or :class:`GatewayError`. Streaming RPCs (lease
    keepalive) answer ``{"result": {...}}`` with chunked encoding: unwrapped here."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw[:200].decode("utf-8", "replace")}
    if status == 200:
        return body.get("result", body) if isinstance(body, dict) else {}
    raise GatewayError(status, int(body.get("code", 0)), str(body.get("message", "")))


class Pinned:
    """Endpoint policy of the gateway clients here: stay on one endpoint until it fails
    to answer, then move to the next one (the failed call raises :class:`Unavailable`;
    the caller decides whether to retry). No round robin per call."""

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        self.endpoints = [urlsplit(e) for e in endpoints]
        self.index = 0
        self.moves = 0
        self.timeout = timeout

    @property
    def base(self) -> str:
        ep = self.endpoints[self.index]
        return f"http://{ep.hostname}:{ep.port}"

    def move(self) -> None:
        self.index = (self.index + 1) % len(self.endpoints)
        self.moves += 1

    def check(self, status: int, raw: bytes) -> dict[str, Any]:
        try:
            return gw_answer(status, raw)
        except GatewayError as exc:
            if exc.status == 503:  # grpc UNAVAILABLE from the member (no leader, ...)
                self.move()
            raise


class StdlibTransport(Pinned):
    """``http.client``: one persistent HTTP/1.1 connection, dropped on any error. The
    timeout bounds each socket operation, not the whole request. Not thread-safe."""

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        try:
            if self.conn is None:
                ep = self.endpoints[self.index]
                self.conn = http.client.HTTPConnection(
                    ep.hostname or "", ep.port, timeout=self.timeout
                )
            self.conn.request("POST", "/v3/" + path, data, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            self.move()
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        return self.check(resp.status, raw)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class HttpxTransport(Pinned):
    """``httpx.Client`` (or ``httpx2``): a pool, thread-safe, per-request ``timeout=``
    (per socket operation, not a total deadline)."""

    def __init__(self, module: Any, endpoints: list[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        self.httpx = module
        self.client = module.Client(timeout=timeout)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        try:
            resp = self.client.post(
                f"{self.base}/v3/{path}",
                content=data,
                headers={"Content-Type": "application/json"},
                timeout=self.timeout,
            )
        except self.httpx.TransportError as exc:
            self.move()
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        return self.check(resp.status_code, resp.content)

    def close(self) -> None:
        self.client.close()


class HttpxAsyncTransport(Pinned):
    """``httpx.AsyncClient`` (or ``httpx2``), same policy as :class:`HttpxTransport`."""

    def __init__(self, module: Any, endpoints: list[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        self.httpx = module
        self.client = module.AsyncClient(timeout=timeout)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        try:
            resp = await self.client.post(
                f"{self.base}/v3/{path}",
                content=data,
                headers={"Content-Type": "application/json"},
                timeout=self.timeout,
            )
        except self.httpx.TransportError as exc:
            self.move()
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        return self.check(resp.status_code, resp.content)

    async def close(self) -> None:
        await self.client.aclose()


class AsyncioTransport(Pinned):
    """HTTP/1.1 over ``asyncio.open_connection``: one persistent connection, a total
    deadline per request (``asyncio.timeout``), Content-Length or chunked replies."""

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        super().__init__(endpoints, timeout)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        try:
            async with asyncio.timeout(self.timeout):
                status, raw = await self._exchange(path, data)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.close()
            self.move()
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        return self.check(status, raw)

    async def _exchange(self, path: str, data: bytes) -> tuple[int, bytes]:
        ep = self.endpoints[self.index]
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(ep.hostname, ep.port)
        assert self.reader is not None
        head = (
            f"POST /v3/{path} HTTP/1.1\r\nHost: {ep.hostname}:{ep.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode("ascii") + data)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("connection closed by the server")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                parts.append(await self.reader.readexactly(size + 2))
            # error replies end with a trailer ("Grpc-Trailer-Content-Type: ...") before
            # the empty line: skip lines until it
            while (await self.reader.readline()) not in (b"\r\n", b""):
                pass
            raw = b"".join(p[:-2] for p in parts)
        else:
            raw = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, raw

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


class GatewayOps:
    """The fleetcron operations over a sync gateway transport."""

    def __init__(self, transport: Any, policy: str) -> None:
        self.t = transport
        self.policy = policy

    def grant(self, ttl: int) -> int:
        return int(self.t.post("lease/grant", {"TTL": ttl})["ID"])

    def acquire(self, key: bytes, value: bytes, lease: int) -> tuple[bool, int]:
        return gw_acquired(self.t.post("kv/txn", gw_acquire(key, value, lease)))

    def release(self, key: bytes, fence: int) -> bool:
        return bool(self.t.post("kv/txn", gw_release(key, fence)).get("succeeded", False))

    def revoke(self, lease: int) -> None:
        self.t.post("lease/revoke", {"ID": str(lease)})

    def batch(self, keys: list[bytes], value: bytes, lease: int) -> int:
        return gw_batch_won(self.t.post("kv/txn", gw_batch(keys, value, lease)))

    def served_by(self) -> int:
        return int(self.t.post("kv/range", {"key": b64(b"probe")})["header"]["member_id"])

    def moves(self) -> int:
        return int(self.t.moves)

    def close(self) -> None:
        self.t.close()


class AsyncGatewayOps:
    """The fleetcron operations over an async gateway transport."""

    def __init__(self, transport: Any, policy: str) -> None:
        self.t = transport
        self.policy = policy

    async def grant(self, ttl: int) -> int:
        return int((await self.t.post("lease/grant", {"TTL": ttl}))["ID"])

    async def acquire(self, key: bytes, value: bytes, lease: int) -> tuple[bool, int]:
        return gw_acquired(await self.t.post("kv/txn", gw_acquire(key, value, lease)))

    async def release(self, key: bytes, fence: int) -> bool:
        reply = await self.t.post("kv/txn", gw_release(key, fence))
        return bool(reply.get("succeeded", False))

    async def revoke(self, lease: int) -> None:
        await self.t.post("lease/revoke", {"ID": str(lease)})

    async def batch(self, keys: list[bytes], value: bytes, lease: int) -> int:
        return gw_batch_won(await self.t.post("kv/txn", gw_batch(keys, value, lease)))

    async def served_by(self) -> int:
        reply = await self.t.post("kv/range", {"key": b64(b"probe")})
        return int(reply["header"]["member_id"])

    async def moves(self) -> int:
        return int(self.t.moves)

    async def close(self) -> None:
        await self.t.close()


_GW_POLICY = "pinned to one endpoint, next one after a timeout/503 (policy written here)"


def open_gw_stdlib(endpoints: list[str], timeout: float) -> GatewayOps:
    return GatewayOps(StdlibTransport(endpoints, timeout), _GW_POLICY)


def open_gw_httpx(endpoints: list[str], timeout: float) -> GatewayOps:
    module = importlib.import_module("httpx")
    return GatewayOps(HttpxTransport(module, endpoints, timeout), _GW_POLICY)


def open_gw_httpx2(endpoints: list[str], timeout: float) -> GatewayOps:
    module = importlib.import_module("httpx2")
    return GatewayOps(HttpxTransport(module, endpoints, timeout), _GW_POLICY)


async def open_gw_httpx_async(endpoints: list[str], request_timeout: float) -> AsyncGatewayOps:
    module = importlib.import_module("httpx")
    return AsyncGatewayOps(HttpxAsyncTransport(module, endpoints, request_timeout), _GW_POLICY)


async def open_gw_httpx2_async(endpoints: list[str], request_timeout: float) -> AsyncGatewayOps:
    module = importlib.import_module("httpx2")
    return AsyncGatewayOps(HttpxAsyncTransport(module, endpoints, request_timeout), _GW_POLICY)


async def open_gw_asyncio(endpoints: list[str], request_timeout: float) -> AsyncGatewayOps:
    return AsyncGatewayOps(AsyncioTransport(endpoints, request_timeout), _GW_POLICY)


# ----------------------------------------------------------------------- grpc clients


def _hostports(endpoints: list[str]) -> list[tuple[str, int]]:
    return [(urlsplit(e).hostname or "", urlsplit(e).port or 2379) for e in endpoints]


class AetcdOps:
    """aetcd 1.x: one ``host``/``port``; the grpc target is ``f"{host}:{port}"``, so all
    endpoints go in as an ``ipv4:a:1,b:2,c`` host + the last port (grpc's default
    pick_first policy: pinned to the first member that connects). Timeout: one value for
    every call of the client (``Client(timeout=)``), no per-request deadline."""

    policy = "grpc pick_first over an ipv4: target smuggled through host=; client-wide timeout"

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        import aetcd
        from aetcd import rpc

        self.rpc = rpc
        hosts = _hostports(endpoints)
        if len(hosts) == 1:
            host, port = hosts[0]
        else:
            last_host, port = hosts[-1]
            host = "ipv4:" + ",".join([f"{h}:{p}" for h, p in hosts[:-1]] + [last_host])
        self.client = aetcd.Client(host=host, port=port, timeout=timeout)  # type: ignore[arg-type]
        self.t = self.client.transactions

    async def grant(self, ttl: int) -> int:
        return int((await self.client.lease(ttl)).id)

    def _acquire_ops(self, key: bytes, value: bytes, lease: int) -> dict[str, Any]:
        t = self.t
        return {
            "compare": [t.create(key) == 0],
            "success": [t.put(key, value, lease=lease)],
            "failure": [t.get(key)],
        }

    async def acquire(self, key: bytes, value: bytes, lease: int) -> tuple[bool, int]:
        ok, responses = await self.client.transaction(**self._acquire_ops(key, value, lease))
        if ok:
            return True, int(responses[0].response_put.header.revision)
        return False, int(responses[0][0][1].create_revision) if responses[0] else 0

    async def release(self, key: bytes, fence: int) -> bool:
        ok, _ = await self.client.transaction(
            compare=[self.t.create(key) == fence], success=[self.t.delete(key)], failure=[]
        )
        return bool(ok)

    async def revoke(self, lease: int) -> None:
        await self.client.revoke_lease(lease)

    async def batch(self, keys: list[bytes], value: bytes, lease: int) -> int:
        nested = [self.t.txn(**self._acquire_ops(k, value, lease)) for k in keys]
        _, responses = await self.client.transaction(compare=[], success=nested, failure=[])
        return sum(1 for r in responses if r.response_txn.succeeded)

    async def served_by(self) -> int:
        await self.client.connect()
        reply = await self.client.kvstub.Range(self.rpc.RangeRequest(key=b"probe"))
        return int(reply.header.member_id)

    async def moves(self) -> int:
        return -1

    async def close(self) -> None:
        await self.client.close()


async def open_aetcd(endpoints: list[str], request_timeout: float) -> AetcdOps:
    ops = AetcdOps(endpoints, request_timeout)
    await ops.client.connect()
    return ops


class Etcd3aioOps:
    """etcd3aio: ``Etcd3Client(endpoints)`` builds one ``ipv4:`` channel with grpc's
    round_robin policy (per call), keepalive 10 s/5 s, and retries UNAVAILABLE and
    DEADLINE_EXCEEDED up to 3 attempts inside one per-call ``timeout=``. Nested txns need
    its private ``etcd3aio._protobuf`` messages (no builder for ``request_txn``)."""

    policy = "grpc round_robin per call (ipv4: target); per-call timeout=; 3 attempts"

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        from etcd3aio import Etcd3Client
        from etcd3aio import _protobuf as pb

        self.pb = pb
        self.timeout = timeout
        self.client = Etcd3Client([f"{h}:{p}" for h, p in _hostports(endpoints)])

    @property
    def kv(self) -> Any:
        return self.client.kv

    def _acquire_txn(self, key: bytes, value: bytes, lease: int) -> dict[str, Any]:
        kv = self.kv
        return {
            "compare": [kv.txn_compare_create_revision(key, 0)],
            "success": [kv.txn_op_put(key, value, lease=lease)],
            "failure": [kv.txn_op_get(key)],
        }

    async def grant(self, ttl: int) -> int:
        assert self.client.lease is not None
        return int((await self.client.lease.grant(ttl, timeout=self.timeout)).ID)

    async def acquire(self, key: bytes, value: bytes, lease: int) -> tuple[bool, int]:
        reply = await self.kv.txn(**self._acquire_txn(key, value, lease), timeout=self.timeout)
        if reply.succeeded:
            return True, int(reply.header.revision)
        kvs = reply.responses[0].response_range.kvs
        return False, int(kvs[0].create_revision) if kvs else 0

    async def release(self, key: bytes, fence: int) -> bool:
        kv = self.kv
        reply = await kv.txn(
            [kv.txn_compare_create_revision(key, fence)],
            [kv.txn_op_delete(key)],
            timeout=self.timeout,
        )
        return bool(reply.succeeded)

    async def revoke(self, lease: int) -> None:
        assert self.client.lease is not None
        await self.client.lease.revoke(lease, timeout=self.timeout)

    async def batch(self, keys: list[bytes], value: bytes, lease: int) -> int:
        nested = [
            self.pb.RequestOp(request_txn=self.pb.TxnRequest(**self._acquire_txn(k, value, lease)))
            for k in keys
        ]
        reply = await self.kv.txn([], nested, timeout=self.timeout)
        return sum(1 for r in reply.responses if r.response_txn.succeeded)

    async def served_by(self) -> int:
        return int((await self.kv.get(b"probe", timeout=self.timeout)).header.member_id)

    async def moves(self) -> int:
        return -1

    async def close(self) -> None:
        await self.client.close()


async def open_etcd3aio(endpoints: list[str], request_timeout: float) -> Etcd3aioOps:
    ops = Etcd3aioOps(endpoints, request_timeout)
    await ops.client.connect()
    return ops


class Python3Etcd3Ops:
    """python3-etcd3 (vimt): ``MultiEndpointEtcd3Client(failover=True)`` starts on a
    random endpoint and stays there; a call failing with UNAVAILABLE/DEADLINE_EXCEEDED/
    INTERNAL marks the endpoint failed for ``time_retry`` seconds (default 300;
    ``--p3-time-retry``, 2 here) and the *next* call goes to another one (no retry of the
    failed call); all marked failed: ``NoServerAvailableError`` until one's time is up.
    Timeout: one value for every call (``timeout=``)."""

    time_retry = 2.0  # set from --p3-time-retry by the worker

    @property
    def policy(self) -> str:
        return (
            "pinned to a random endpoint, next after a failed call (time_retry "
            f"{self.time_retry:g} s; 300 by default); client-wide timeout"
        )

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        import etcd3

        self.etcd3 = etcd3
        eps = [
            etcd3.Endpoint(h, p, secure=False, time_retry=self.time_retry)
            for h, p in _hostports(endpoints)
        ]
        self.client = etcd3.MultiEndpointEtcd3Client(eps, timeout=timeout, failover=True)
        self.t = self.client.transactions
        self.last_endpoint = self.client.endpoint_in_use.netloc
        self.endpoint_moves = 0

    def _note_endpoint(self) -> None:
        now = self.client.endpoint_in_use.netloc
        if now != self.last_endpoint:
            self.endpoint_moves += 1
            self.last_endpoint = now

    def _acquire_ops(self, key: bytes, value: bytes, lease: int) -> dict[str, Any]:
        t = self.t
        return {
            "compare": [t.create(key) == 0],
            "success": [t.put(key, value, lease=lease)],
            "failure": [t.get(key)],
        }

    def grant(self, ttl: int) -> int:
        try:
            return int(self.client.lease(ttl).id)
        finally:
            self._note_endpoint()

    def acquire(self, key: bytes, value: bytes, lease: int) -> tuple[bool, int]:
        try:
            ok, responses = self.client.transaction(**self._acquire_ops(key, value, lease))
        finally:
            self._note_endpoint()
        if ok:
            return True, int(responses[0].response_put.header.revision)
        return False, int(responses[0][0][1].create_revision) if responses[0] else 0

    def release(self, key: bytes, fence: int) -> bool:
        try:
            ok, _ = self.client.transaction(
                compare=[self.t.create(key) == fence], success=[self.t.delete(key)], failure=[]
            )
        finally:
            self._note_endpoint()
        return bool(ok)

    def revoke(self, lease: int) -> None:
        try:
            self.client.revoke_lease(lease)
        finally:
            self._note_endpoint()

    def batch(self, keys: list[bytes], value: bytes, lease: int) -> int:
        nested = [self.t.txn(**self._acquire_ops(k, value, lease)) for k in keys]
        _, responses = self.client.transaction(compare=[], success=nested, failure=[])
        return sum(1 for r in responses if r.response_txn.succeeded)

    def served_by(self) -> int:
        reply = self.client.kvstub.Range(
            self.etcd3.etcdrpc.RangeRequest(key=b"probe"), self.client.timeout
        )
        return int(reply.header.member_id)

    def moves(self) -> int:
        return self.endpoint_moves

    def close(self) -> None:
        self.client.close()


def open_p3(endpoints: list[str], timeout: float) -> Python3Etcd3Ops:
    return Python3Etcd3Ops(endpoints, timeout)


# ------------------------------------------------------------------------- the driver


class Driver:
    """Calls an adapter from plain code: a sync one directly, an async one through one
    ``asyncio.Runner`` (one event loop) kept for the whole run."""

    def __init__(self, cand: Candidate, endpoints: list[str], timeout: float) -> None:
        opener = globals()[cand.opener]
        self.runner: asyncio.Runner | None = None
        if cand.mode == "async":
            self.runner = asyncio.Runner()
            self.ops = self.runner.run(opener(endpoints, timeout))
        else:
            self.ops = opener(endpoints, timeout)

    def __call__(self, op: str, *args: Any) -> Any:
        result = getattr(self.ops, op)(*args)
        if self.runner is not None:
            return self.runner.run(result)
        return result

    def overhead_us(self, n: int = 2000) -> float:
        """What the runner adds to one call (0 for a sync client)."""
        if self.runner is None:
            return 0.0

        async def nothing() -> None:
            return None

        runner = self.runner
        start = time.perf_counter()
        for _ in range(n):
            runner.run(nothing())
        return (time.perf_counter() - start) / n * 1e6

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self("close")
        if self.runner is not None:
            self.runner.close()


def pct(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of ``samples``, in milliseconds."""
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1] * 1000


def short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    details = getattr(exc, "details", None)
    if callable(details):  # grpc errors: the status and details say more than str()
        with contextlib.suppress(Exception):
            text = f"{type(exc).__name__}: {exc.code().name}: {details()}"  # type: ignore[attr-defined]
    return text[:160]


def measure_latency(drv: Driver, prefix: str, iterations: int, ttl: int) -> dict[str, Any]:
    """(a): grant, txn, guarded delete, revoke on one key, ``iterations`` times."""
    key = f"{prefix}/lock".encode()
    names = ("grant", "txn", "release", "revoke", "acquire", "cycle")
    samples: dict[str, list[float]] = {n: [] for n in names}
    fences: list[int] = []
    problems: list[str] = []
    for i in range(iterations + 10):  # 10 warm-up rounds
        t0 = time.perf_counter()
        lease = drv("grant", ttl)
        t1 = time.perf_counter()
        won, fence = drv("acquire", key, VALUE, lease)
        t2 = time.perf_counter()
        released = drv("release", key, fence)
        t3 = time.perf_counter()
        drv("revoke", lease)
        t4 = time.perf_counter()
        if not (won and released):
            problems.append(f"round {i}: won={won} released={released}")
        if i < 10:
            continue
        fences.append(fence)
        for name, value in zip(
            names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t2 - t0, t4 - t0), strict=True
        ):
            samples[name].append(value)
    out: dict[str, Any] = {
        f"{n}_{p}": round(pct(s, p), 2) for n, s in samples.items() for p in (50, 99)
    }
    out["fences_increasing"] = all(a < b for a, b in itertools.pairwise(fences))
    # contention: a second holder loses and sees the first one's fence; a stale fence
    # does not delete; the right one does.
    lease_a, lease_b = drv("grant", ttl), drv("grant", ttl)
    won_a, fence_a = drv("acquire", key, b"A", lease_a)
    won_b, fence_b = drv("acquire", key, b"B", lease_b)
    stale = drv("release", key, fence_a - 1)
    right = drv("release", key, fence_a)
    drv("revoke", lease_a)
    drv("revoke", lease_b)
    out["contention_ok"] = won_a and not won_b and fence_b == fence_a and not stale and right
    out["problems"] = problems[:5]
    return out


def measure_batch(drv: Driver, prefix: str, n: int, reps: int, ttl: int) -> dict[str, Any]:
    """(b): one txn of ``n`` nested claim txns: all win, then the same keys all lose;
    ``n + 1`` must be refused when ``n`` is the limit."""
    lease = drv("grant", max(ttl, 30))
    won_s: list[float] = []
    lost_s: list[float] = []
    wins: list[int] = []
    for r in range(reps):
        keys = [f"{prefix}/batch/{r}/{i}".encode() for i in range(n)]
        t0 = time.perf_counter()
        wins.append(drv("batch", keys, VALUE, lease))
        t1 = time.perf_counter()
        lost = drv("batch", keys, VALUE, lease)
        t2 = time.perf_counter()
        won_s.append(t1 - t0)
        lost_s.append(t2 - t1)
        if lost:
            wins.append(-lost)
    over = None
    try:
        keys = [f"{prefix}/over/{i}".encode() for i in range(n + 1)]
        drv("batch", keys, VALUE, lease)
        over = "accepted"
    except Exception as exc:
        over = short(exc)
    drv("revoke", lease)
    return {
        "n": n,
        "won_p50": round(pct(won_s, 50), 2),
        "won_max": round(max(won_s) * 1000, 2),
        "lost_p50": round(pct(lost_s, 50), 2),
        "all_won": all(w == n for w in wins),
        "over_limit": over,
    }


def probe_errors(drv: Driver, prefix: str, ttl: int) -> dict[str, str]:
    """What "lease not found" looks like through this client."""
    out: dict[str, str] = {}
    lease = drv("grant", ttl)
    drv("revoke", lease)
    for name, call in (
        ("revoke_missing", lambda: drv("revoke", lease)),
        ("put_with_missing_lease", lambda: drv("acquire", f"{prefix}/gone".encode(), VALUE, lease)),
    ):
        try:
            call()
            out[name] = "no error"
        except Exception as exc:
            out[name] = short(exc)
    return out


# ------------------------------------------------------------------ cluster (stdlib)


def raw_post(
    base: str,
    path: str,
    body: Any,
    timeout: float = 2.0,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request with the standard library: (status, headers, body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path,
        data=data if method == "POST" else None,
        method=method,
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def member_status(url: str, timeout: float = 0.5) -> dict[str, Any] | None:
    try:
        status, _, raw = raw_post(url, "/v3/maintenance/status", {}, timeout=timeout)
    except OSError:
        return None
    return json.loads(raw) if status == 200 else None


def member_ids(members: list[dict[str, Any]]) -> dict[int, str]:
    ids = {}
    for m in members:
        st = member_status(m["url"])
        if st:
            ids[int(st["header"]["member_id"])] = m["name"]
    return ids


def find_leader(members: list[dict[str, Any]], wait: float = 15.0) -> dict[str, Any]:
    """The member every live member names as leader (and which answers itself)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        statuses = {m["name"]: member_status(m["url"]) for m in members}
        by_id = {int(s["header"]["member_id"]): n for n, s in statuses.items() if s}
        leaders = {int(s["leader"]) for s in statuses.values() if s and s.get("leader")}
        if len(leaders) == 1 and (lid := leaders.pop()) in by_id:
            return next(m for m in members if m["name"] == by_id[lid])
        time.sleep(0.05)
    raise RuntimeError("no leader")


def healthy(members: list[dict[str, Any]], wait: float = 20.0) -> float:
    """Seconds until every member answers and all name the same leader."""
    start = time.monotonic()
    while time.monotonic() - start < wait:
        statuses = [member_status(m["url"]) for m in members]
        # "leader" is left out while there is none (zero fields are omitted)
        leaders = {s.get("leader") for s in statuses if s}
        if all(statuses) and len(leaders) == 1 and leaders.pop():
            return time.monotonic() - start
        time.sleep(0.05)
    raise RuntimeError("cluster not healthy")


def served_counts(drv: Driver, ids: dict[int, str], n: int = 30) -> dict[str, int]:
    """Which member served each of ``n`` calls (the response header's member_id)."""
    seen: Counter[str] = Counter()
    for _ in range(n):
        try:
            seen[ids.get(drv("served_by"), "?")] += 1
        except Exception:
            seen["error"] += 1
    return dict(sorted(seen.items()))


def measure_failover(
    drv: Driver, members: list[dict[str, Any]], prefix: str, ttl: int, freeze: float
) -> dict[str, Any]:
    """(c): SIGSTOP the leader for ``freeze`` s, count full cycles; SIGCONT; then SIGKILL
    the leader under an acquire loop and measure the gap until a write succeeds again."""
    ids = member_ids(members)
    out: dict[str, Any] = {"served_before": served_counts(drv, ids)}
    errors: Counter[str] = Counter()
    counter = iter(range(10**9))

    def cycle() -> None:
        key = f"{prefix}/fo/{next(counter)}".encode()
        lease = drv("grant", ttl)
        _, fence = drv("acquire", key, VALUE, lease)
        drv("release", key, fence)
        drv("revoke", lease)

    leader = find_leader(members)
    out["stopped"] = leader["name"]
    ok = failed = 0
    os.kill(leader["pid"], signal.SIGSTOP)
    start = time.monotonic()
    try:
        while time.monotonic() - start < freeze:
            try:
                cycle()
                ok += 1
            except Exception as exc:
                failed += 1
                errors[short(exc)[:90]] += 1
    finally:
        os.kill(leader["pid"], signal.SIGCONT)
    out.update(stop_ok=ok, stop_failed=failed)
    cont = time.monotonic()
    out["first_cycle_after_cont_s"] = None
    while time.monotonic() - cont < 15:
        try:
            cycle()
            out["first_cycle_after_cont_s"] = round(time.monotonic() - cont, 2)
            break
        except Exception as exc:
            errors[short(exc)[:90]] += 1
            time.sleep(PACE_S)
    healthy(members)

    leader = find_leader(members)
    out["killed"] = leader["name"]
    oks: list[float] = []
    fences: list[int] = []
    killed_at: float | None = None
    first_ok: float | None = None
    kill_failed = 0
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        if killed_at is None and now - t0 >= 1.0:
            os.kill(leader["pid"], signal.SIGKILL)
            killed_at = now
        if killed_at is not None and (
            (first_ok is not None and now - first_ok > 1.0) or now - killed_at > 20
        ):
            break
        try:
            key = f"{prefix}/kill/{next(counter)}".encode()
            lease = drv("grant", ttl)
            _, fence = drv("acquire", key, VALUE, lease)
            done = time.monotonic()
            oks.append(done)
            fences.append(fence)
            if killed_at is not None and first_ok is None:
                first_ok = done
        except Exception as exc:
            if killed_at is not None:
                kill_failed += 1
            errors[short(exc)[:90]] += 1
        time.sleep(PACE_S)
    assert killed_at is not None
    around = [t for t in oks if t >= killed_at - 1.0]
    out["kill_gap_s"] = round(first_ok - killed_at, 2) if first_ok else None
    gaps = [b - a for a, b in itertools.pairwise(around)]
    out["kill_longest_s"] = round(max(gaps), 2) if gaps else None
    out["kill_failed"] = kill_failed
    out["kill_fences_increasing"] = all(a < b for a, b in itertools.pairwise(fences))
    out["served_after"] = served_counts(drv, ids, 30)
    out["moves"] = drv("moves")
    out["errors"] = dict(errors.most_common(4))
    return out


def worker(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One candidate, in its own process: prints one ``RESULT {...}`` line."""
    cand = BY_NAME[name]
    prefix = f"fleetcron-bench/{name}/{os.urandom(3).hex()}"
    # the leader first: a client that pins the first endpoint starts on the member that
    # the failover test freezes (the worst case for pinning; round robin does not care)
    leader = find_leader(spec["members"])
    endpoints = [leader["url"]] + [m["url"] for m in spec["members"] if m is not leader]
    result: dict[str, Any] = {"client": name, "mode": cand.mode}
    Python3Etcd3Ops.time_retry = spec["p3_time_retry"]
    drv = Driver(cand, endpoints, spec["timeout"])
    result["policy"] = drv.ops.policy
    result["runner_overhead_us"] = round(drv.overhead_us(), 1)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("latency", lambda: measure_latency(drv, prefix, spec["iterations"], spec["ttl"])),
        ("batch", lambda: measure_batch(drv, prefix, spec["batch"], 15, spec["ttl"])),
        ("lease_errors", lambda: probe_errors(drv, prefix, spec["ttl"])),
    ]
    if spec["failover"]:
        steps.append(
            (
                "failover",
                lambda: measure_failover(drv, spec["members"], prefix, spec["ttl"], spec["freeze"]),
            )
        )
    for step, run in steps:
        try:
            result[step] = run()
        except Exception as exc:
            result[step] = {"error": short(exc)}
    result["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    drv.close()
    return result


# --------------------------------------------------------------- the parent: cluster


def spare_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    """Three etcd members on loopback in ``root``; stopped by pid."""

    def __init__(self, etcd: str, root: Path) -> None:
        self.etcd, self.root = etcd, root
        ports = spare_ports(6)
        self.names = ["e1", "e2", "e3"]
        self.client = dict(zip(self.names, ports[:3], strict=True))
        self.peer = dict(zip(self.names, ports[3:], strict=True))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.token = "bench-" + os.urandom(4).hex()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.client[name]}"

    def members(self) -> list[dict[str, Any]]:
        return [{"name": n, "pid": self.procs[n].pid, "url": self.url(n)} for n in self.names]

    def start_member(self, name: str) -> None:
        initial = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        log = (self.root / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [
                self.etcd,
                "--name",
                name,
                "--data-dir",
                str(self.root / name),
                "--listen-client-urls",
                self.url(name),
                "--advertise-client-urls",
                self.url(name),
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.peer[name]}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.peer[name]}",
                "--initial-cluster",
                initial,
                "--initial-cluster-token",
                self.token,
                "--initial-cluster-state",
                "new",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    def start(self) -> float:
        start = time.monotonic()
        for name in self.names:
            self.start_member(name)
        healthy(self.members(), wait=30)
        return time.monotonic() - start

    def repair(self) -> list[str]:
        """SIGCONT everyone, restart the dead; wait until healthy. Returns who restarted."""
        restarted = []
        for name, proc in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            else:
                self.start_member(name)
                restarted.append(name)
        healthy(self.members(), wait=30)
        return restarted

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


# ----------------------------------------------------------- the parent: gateway facts


def gateway_facts(base: str) -> list[str]:
    """Check, on the running etcd, what a gateway backend must handle."""
    facts: list[str] = []

    def post(path: str, body: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
        status, headers, raw = raw_post(base, path, body)
        try:
            return status, headers, json.loads(raw)
        except ValueError:
            return status, headers, {"raw": raw.decode("utf-8", "replace")[:80]}

    def err(reply: dict[str, Any]) -> str:
        return f"code {reply.get('code')} {reply.get('message', reply.get('raw'))!r}"

    codes = {
        p: raw_post(base, f"/{p}/kv/range", {"key": b64(b"x")})[0]
        for p in ("v3", "v3beta", "v3alpha")
    }
    facts.append(f"path prefixes: {codes} (3.4 serves /v3 and /v3beta; 3.5+ drops /v3beta)")
    status = raw_post(base, "/v3/kv/range", b"", method="GET")[0]
    facts.append(f"GET instead of POST: HTTP {status}; every call is a POST with a JSON body")
    version = json.loads(raw_post(base, "/version", b"", method="GET")[2])
    facts.append(f"/version: {version}")

    _, _, grant = post("/v3/lease/grant", {"TTL": 5})
    lease = grant["ID"]
    facts.append(
        "int64 fields are JSON strings: header.revision "
        f"{type(grant['header']['revision']).__name__} {grant['header']['revision']!r}, "
        f"lease ID {lease!r}, TTL {grant['TTL']!r}"
    )
    _, _, one = post("/v3/lease/grant", {"TTL": 1})
    facts.append(f"grant TTL 1 -> TTL {one.get('TTL')!r} (a minimum TTL applies)")
    post("/v3/lease/revoke", {"ID": one["ID"]})

    key = f"facts/{os.urandom(3).hex()}".encode()
    _, _, won = post("/v3/kv/txn", gw_acquire(key, VALUE, int(lease)))
    _, _, lost = post("/v3/kv/txn", gw_acquire(key, VALUE, int(lease)))
    facts.append(
        f"txn won: keys {sorted(won)}; txn lost: keys {sorted(lost)} — 'succeeded' is "
        "left out when false; the put's own header has only 'revision'"
    )
    _, _, miss = post("/v3/kv/range", {"key": b64(b"facts/none")})
    facts.append(f"range miss: keys {sorted(miss)} — 'kvs' and 'count' left out when empty/0")
    _, _, typo = post("/v3/kv/txn", {"comparee": [_create_is(key, 0)], "success": []})
    facts.append(
        f"unknown field ('comparee'): accepted, succeeded={typo.get('succeeded')} — a "
        "misspelt 'compare' is an unconditional txn"
    )
    _, _, camel = post(
        "/v3/kv/txn",
        {"compare": [{"key": b64(key), "target": "CREATE", "createRevision": "0"}]},
    )
    facts.append(
        "camelCase names are accepted too ('createRevision'); compare on an existing key "
        f"-> succeeded={camel.get('succeeded', False)}"
    )
    status, _, _ = post(
        "/v3/kv/txn",
        {
            "compare": [
                {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}
            ]
        },
    )
    facts.append(f"int64 as a JSON number (create_revision: 0): HTTP {status}, accepted")

    keys = [f"facts/batch/{i}".encode() for i in range(128)]
    status, _, nested = post("/v3/kv/txn", gw_batch(keys[:2], VALUE, int(lease)))
    inner = nested["responses"][0]["response_txn"]
    facts.append(
        f"nested txn reply: outer revision {nested['header']['revision']!r}, inner header "
        f"{inner.get('header')!r}, inner put header {inner['responses'][0]}"
    )
    _, _, again = post("/v3/kv/txn", gw_batch(keys[:3], VALUE, int(lease)))
    rng = again["responses"][0]["response_txn"]["responses"][0]["response_range"]
    facts.append(
        f"nested, 2 lose + 1 wins: a loser's range header revision {rng['header']['revision']!r}"
        f" vs the txn's {again['header']['revision']!r} (ranges report the revision read)"
    )
    for n in (127, 128):
        status, _, reply = post("/v3/kv/txn", gw_batch(keys[:n], VALUE, int(lease)))
        what = err(reply) if status != 200 else "ok"
        facts.append(f"{n} nested txns (1 op each): HTTP {status} {what}")
    for n in (128, 129):
        flat = {
            "success": [
                {"request_put": {"key": b64(k + b"/f"), "value": ""}}
                for k in [*keys, b"facts/batch/x"][:n]
            ]
        }
        status, _, reply = post("/v3/kv/txn", flat)
        facts.append(f"{n} flat puts: HTTP {status} {err(reply) if status != 200 else 'ok'}")
    status, _, reply = post(
        "/v3/kv/txn", {"success": [{"request_put": {"key": b64(key), "value": ""}}] * 2}
    )
    facts.append(f"same key twice in one txn: HTTP {status} {err(reply)}")
    dup = gw_batch([b"facts/dup", b"facts/dup"], VALUE, int(lease))
    status, _, reply = post("/v3/kv/txn", dup)
    facts.append(
        f"same key in two nested txns: HTTP {status} {err(reply) if status != 200 else 'accepted'}"
    )

    status, headers, ka = post("/v3/lease/keepalive", {"ID": lease})
    facts.append(
        f"keepalive (a stream): HTTP {status}, Transfer-Encoding "
        f"{headers.get('Transfer-Encoding')!r}, body {{'result': ...}} with TTL "
        f"{ka.get('result', {}).get('TTL')!r}"
    )
    post("/v3/lease/revoke", {"ID": lease})
    status, _, reply = post("/v3/lease/revoke", {"ID": lease})
    facts.append(f"revoke a missing lease: HTTP {status} {err(reply)}")
    status, _, reply = post("/v3/kv/put", {"key": b64(key), "value": "", "lease": lease})
    facts.append(f"put with a missing lease: HTTP {status} {err(reply)}")
    status, _, ka = post("/v3/lease/keepalive", {"ID": lease})
    facts.append(
        f"keepalive of a missing lease: HTTP {status}, result keys "
        f"{sorted(ka.get('result', {}))} — TTL left out (0 = gone), no error"
    )
    status, _, ttl = post("/v3/lease/timetolive", {"ID": lease})
    facts.append(f"timetolive of a missing lease: HTTP {status}, TTL {ttl.get('TTL')!r}")
    for what, bad in (("not base64", "fc/k1"), ("URL-safe base64", "_-8=")):
        status, _, reply = post("/v3/kv/range", {"key": bad})
        facts.append(f"key {what} ({bad!r}): HTTP {status} {err(reply)}")
    status, _, reply = post("/v3/kv/txn", b'{"compare": [')
    facts.append(f"truncated JSON: HTTP {status} {err(reply)}")
    for value in ("1m", "1S"):
        status, _, raw = raw_post(
            base, "/v3/lease/grant", {"TTL": 5}, headers={"Grpc-Timeout": value}
        )
        reply = json.loads(raw)
        what = err(reply) if status != 200 else "ok"
        facts.append(
            f"header 'Grpc-Timeout: {value}' (a server-side deadline): HTTP {status} {what}"
        )
    status, _, raw = raw_post(
        base, "/v3/kv/range", {"key": b64(b"x")}, headers={"Authorization": "x"}
    )
    facts.append(f"an Authorization header while auth is off: HTTP {status} {err(json.loads(raw))}")
    return facts


# ------------------------------------------------------------ the parent: footprint


def importable(module: str) -> bool:
    probe = f"import {module}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode == 0


def import_ms(statement: str, runs: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        times.append(float(done.stdout.strip()) * 1000)
    return statistics.median(times)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirements(dist: str) -> list[str]:
    """Requires-Dist without extras (markers otherwise ignored)."""
    return [r for r in importlib.metadata.requires(dist) or [] if "extra ==" not in r]


def closure(dist: str) -> list[str]:
    """``dist`` and every installed distribution it requires, transitively."""
    seen: list[str] = []
    todo = [dist]
    while todo:
        name = todo.pop()
        try:
            meta = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        canonical = meta.metadata["Name"]
        if canonical in seen:
            continue
        seen.append(canonical)
        for req in requirements(canonical):
            match = _NAME.match(req)
            if match:
                todo.append(match.group(0))
    return seen


def installed_bytes(dist: str) -> int:
    meta = importlib.metadata.distribution(dist)
    total = 0
    for f in meta.files or []:
        path = Path(str(meta.locate_file(f)))
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def footprint(cand: Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {"import_ms": round(import_ms(cand.imports), 1)}
    if cand.dist is None:
        out.update(version="stdlib", size_mb=0.0, closure="-", pins="-")
        return out
    dists = closure(cand.dist)
    sizes = {d: installed_bytes(d) for d in dists}
    out["version"] = importlib.metadata.version(cand.dist)
    out["size_mb"] = round(sum(sizes.values()) / 2**20, 1)
    out["closure"] = ", ".join(
        f"{d} {importlib.metadata.version(d)} ({sizes[d] / 2**20:.1f})" for d in dists
    )
    out["pins"] = "; ".join(r.replace(" ", "") for r in requirements(cand.dist))
    return out


def pypi_facts(dist: str) -> dict[str, Any]:
    """The index's JSON for ``dist``: latest version and dates, authors, maintainers."""
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{dist}/json", timeout=20) as resp:
            data = json.load(resp)
    except (OSError, ValueError) as exc:
        return {"error": str(exc)[:80]}
    info = data["info"]
    uploads = sorted(
        (min(f["upload_time"] for f in files), version)
        for version, files in data["releases"].items()
        if files
    )
    latest = [f["upload_time"] for f in data.get("urls", [])]
    people = {
        (info.get(k) or "").strip()
        for k in ("author", "author_email", "maintainer", "maintainer_email")
    }
    return {
        "latest": info["version"],
        "latest_date": (min(latest) if latest else "?")[:10],
        "first_date": uploads[0][0][:10] if uploads else "?",
        "releases": len(uploads),
        "people": "; ".join(sorted(p for p in people if p)),
        "requires_python": info.get("requires_python"),
    }


# ------------------------------------------------------------------ the parent: report


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(results: list[dict[str, Any]], feet: dict[str, dict[str, Any]]) -> str:
    out = []
    rows = []
    for r in results:
        lat, bat = r.get("latency", {}), r.get("batch", {})
        if "error" in lat:
            rows.append([r["client"], r["mode"], f"error: {lat['error']}"] + [""] * 8)
            continue
        rows.append(
            [
                r["client"],
                r["mode"],
                f"{lat['grant_50']}",
                f"{lat['txn_50']}",
                f"{lat['acquire_50']} / {lat['acquire_99']}",
                f"{lat['cycle_50']} / {lat['cycle_99']}",
                "ok" if lat["fences_increasing"] and lat["contention_ok"] else "FAIL",
                (
                    f"{bat.get('won_p50')} / {bat.get('lost_p50')}"
                    if "error" not in bat
                    else bat["error"]
                ),
                bat.get("over_limit", ""),
                r.get("runner_overhead_us"),
                r.get("rss_mb"),
            ]
        )
    out.append("### (a)+(b) latency, ms (p50 / p99)\n")
    out.append(
        table(
            [
                "client",
                "mode",
                "grant p50",
                "txn p50",
                "grant+txn",
                "full cycle",
                "fences+contention",
                "batch won / lost p50",
                "batch N+1",
                "runner µs",
                "max RSS MB",
            ],
            rows,
        )
    )
    rows = []
    for r in results:
        fo = r.get("failover")
        if fo is None:
            continue
        if "error" in fo:
            rows.append([r["client"], f"error: {fo['error']}"] + [""] * 7)
            continue
        rows.append(
            [
                r["client"],
                fo["served_before"],
                f"{fo['stopped']}: {fo['stop_ok']} ok / {fo['stop_failed']} failed",
                fo["first_cycle_after_cont_s"],
                f"{fo['killed']}: {fo['kill_gap_s']}",
                fo["kill_longest_s"],
                fo["kill_failed"],
                fo["served_after"],
                fo["moves"] if fo["moves"] >= 0 else "n/a",
            ]
        )
    if rows:
        out.append(
            "\n### (c) failover (all 3 endpoints given, the leader first; served by: the"
            " member_id in 30 replies)\n"
        )
        out.append(
            table(
                [
                    "client",
                    "served by (30 calls, before)",
                    "SIGSTOP leader: full cycles in window",
                    "1st cycle after SIGCONT s",
                    "SIGKILL leader: gap to 1st write s",
                    "longest gap s",
                    "failed after kill",
                    "served by (after kill)",
                    "endpoint moves",
                ],
                rows,
            )
        )
        out.append("\nendpoint policy and errors seen:\n")
        for r in results:
            fo = r.get("failover") or {}
            out.append(f"- {r['client']}: {r.get('policy')}; errors {fo.get('errors')}")
    out.append("\n### lease-not-found through each client\n")
    out.extend(f"- {r['client']}: {r.get('lease_errors')}" for r in results)
    rows = []
    seen: set[str] = set()
    for name, f in feet.items():
        cand = BY_NAME[name]
        key = cand.dist or name
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            [
                cand.dist or name,
                f.get("version"),
                f.get("import_ms"),
                f.get("size_mb"),
                f.get("pins"),
                f.get("closure"),
            ]
        )
    out.append("\n### (d) footprint (this interpreter's installs)\n")
    out.append(
        table(
            ["dist", "version", "import ms", "installed MB (closure)", "pins", "closure (MB each)"],
            rows,
        )
    )
    return "\n".join(out)


def run_worker(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--spec", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {
        "client": name,
        "mode": BY_NAME[name].mode,
        "latency": {"error": " / ".join(tail)[:200]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", default=",".join(c.name for c in CANDIDATES))
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch", type=int, default=127)
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL, seconds")
    parser.add_argument("--timeout", type=float, default=1.0, help="per-request, seconds")
    parser.add_argument("--freeze", type=float, default=5.0, help="SIGSTOP window, seconds")
    parser.add_argument(
        "--p3-time-retry",
        type=float,
        default=2.0,
        help="python3-etcd3: seconds a failed endpoint is left out (library default 300)",
    )
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--pypi", action="store_true", help="read the index's JSON metadata")
    parser.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, json.loads(args.spec))), flush=True)
        return 0

    wanted = [BY_NAME[n.strip()] for n in args.clients.split(",") if n.strip()]
    runnable = [c for c in wanted if importable(c.module)]
    missing = [c.name for c in wanted if c not in runnable]
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="etcd-clients-"))
    cluster = Cluster(args.etcd, root)
    results: list[dict[str, Any]] = []
    facts: list[str] = []
    restarts: list[str] = []
    version = subprocess.run(
        [args.etcd, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[0]
    try:
        ready = cluster.start()
        print(
            f"# cluster: 3 members of {version} healthy after {ready:.2f} s in {root}",
            file=sys.stderr,
        )
        facts = gateway_facts(cluster.url("e1"))
        for cand in runnable:
            spec = {
                "members": cluster.members(),
                "iterations": args.iterations,
                "batch": args.batch,
                "ttl": args.ttl,
                "timeout": args.timeout,
                "freeze": args.freeze,
                "p3_time_retry": args.p3_time_retry,
                "failover": not args.no_failover,
            }
            t0 = time.monotonic()
            results.append(run_worker(cand.name, spec))
            try:
                fixed = cluster.repair()
            except RuntimeError as exc:
                restarts.append(f"cluster not repaired after {cand.name} ({exc}): stopped")
                break
            if fixed:
                restarts.append(f"{'+'.join(fixed)} after {cand.name}")
            print(f"# {cand.name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    feet = {c.name: footprint(c) for c in runnable}
    load_after = os.getloadavg()

    print("## etcd clients for fleetcron\n")
    print(
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{version}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
        f"(1 min). {args.iterations} iterations, lease TTL {args.ttl} s, per-request "
        f"timeout {args.timeout} s, batch N={args.batch}, SIGSTOP window {args.freeze} s."
    )
    if missing:
        print(f"\nnot importable here (skipped): {', '.join(missing)}")
    print()
    print(report(results, feet))
    if restarts:
        print(f"\nmembers restarted between clients: {'; '.join(restarts)}")
    print("\n### JSON gateway facts (checked live)\n")
    for fact in facts:
        print(f"- {fact}")
    pypi: dict[str, Any] = {}
    if args.pypi:
        dists = sorted({c.dist for c in runnable if c.dist} | {"grpcio", "protobuf"})
        pypi = {d: pypi_facts(d) for d in dists}
        print("\n### index metadata\n")
        print(
            table(
                [
                    "dist",
                    "latest",
                    "released",
                    "first release",
                    "releases",
                    "requires-python",
                    "authors / maintainers (metadata)",
                ],
                [
                    [
                        d,
                        p.get("latest"),
                        p.get("latest_date"),
                        p.get("first_date"),
                        p.get("releases"),
                        p.get("requires_python"),
                        p.get("people", p.get("error")),
                    ]
                    for d, p in pypi.items()
                ],
            )
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "results": results,
                    "footprint": feet,
                    "gateway_facts": facts,
                    "pypi": pypi,
                    "load": [load_before, load_after],
                    "etcd": version,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
