"""The asyncio etcd v3 client, :class:`AsyncEtcdClient`: one asyncio stream, which the
calls of all tasks share under a lock; and its reader of HTTP/1.1 replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from typing import Any, TypeVar

from fleetcron.stores.etcd.errors import EtcdLeaseNotFound, EtcdUnavailable
from fleetcron.stores.etcd.messages import (
    Alarm,
    Compare,
    Data,
    DeleteRange,
    DeleteRangeResponse,
    Endpoint,
    LeaseGrant,
    LeaseTimeToLive,
    Member,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    RequestOp,
    Status,
    Txn,
    TxnResponse,
)
from fleetcron.stores.etcd.pinned import Pinned
from fleetcron.stores.etcd.wire import (
    _ALARMS,
    _MEMBERS,
    _STATUS,
    _BadReply,
    _compact,
    _delete_range,
    _grant,
    _keepalive_once,
    _NoReply,
    _put,
    _range,
    _revoke,
    _Rpc,
    _ttl_of,
    _txn,
)
from fleetcron.stores.url import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S

__all__ = ["AsyncEtcdClient"]

T = TypeVar("T")


# -------------------------------------------------------------------------- async client


class AsyncEtcdClient(Pinned):
    """:class:`EtcdClient`'s asyncio twin, for one event loop: one connection, the calls
    of all tasks one at a time (an :class:`asyncio.Lock`), each ending within ``timeout``
    of its start, the wait for the lock included.

    Serialised rather than pipelined: a call given up on (its deadline, a cancelled task)
    leaves its reply unread on the connection, which must then be closed — with
    pipelining, every call queued behind it would fail with it."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint | tuple[str, int]],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """As :class:`EtcdClient`'s."""
        super().__init__(
            endpoints, timeout=timeout, connect_timeout=connect_timeout, ssl_context=ssl_context
        )
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn_index = -1

    async def __aenter__(self) -> AsyncEtcdClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (after the call in flight, if any); calls made after
        this raise :class:`EtcdUnavailable`."""
        self._closed = True
        async with self._lock:
            writer = self._writer
            self._drop()
            if writer is not None:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def grant(self, ttl_s: int, *, lease_id: int = 0) -> LeaseGrant:
        """Grant a lease of ``ttl_s`` seconds (``lease_id``: this ID, 0 for etcd's
        choice; etcd refuses one that exists). Not sent twice after a failure: a lost
        answer leaves a lease that expires unused."""
        return await self._call(_grant(ttl_s, lease_id))

    async def revoke(self, lease_id: int) -> bool:
        """Revoke a lease, deleting its keys; ``False`` when there was no such lease
        (expired, revoked — perhaps by this call's own first attempt)."""
        try:
            await self._call(_revoke(lease_id))
        except EtcdLeaseNotFound:
            return False
        return True

    async def keepalive_once(self, lease_id: int) -> int | None:
        """Refresh a lease to its full TTL: the TTL, or ``None`` when the lease is gone."""
        return await self._call(_keepalive_once(lease_id))

    async def time_to_live(self, lease_id: int, *, keys: bool = False) -> LeaseTimeToLive | None:
        """A lease's remaining TTL (and its keys when ``keys``); ``None`` when it is gone."""
        return await self._call(_ttl_of(lease_id, keys))

    async def range(
        self,
        key: Data,
        range_end: Data | None = None,
        limit: int = 0,
        keys_only: bool = False,
        revision: int = 0,
        *,
        count_only: bool = False,
        serializable: bool = False,
    ) -> RangeResponse:
        """Read a key or a range of keys (see :class:`Range`)."""
        rng = Range(key, range_end, limit, revision, keys_only, count_only, serializable)
        return await self._call(_range(rng))

    async def put(
        self, key: Data, value: Data, lease: int = 0, *, prev_kv: bool = False
    ) -> PutResponse:
        """Set a key (see :class:`Put`)."""
        return await self._call(_put(Put(key, value, lease, prev_kv)))

    async def delete_range(
        self, key: Data, range_end: Data | None = None, *, prev_kv: bool = False
    ) -> DeleteRangeResponse:
        """Delete a key or a range of keys (see :class:`DeleteRange`)."""
        return await self._call(_delete_range(DeleteRange(key, range_end, prev_kv)))

    async def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[RequestOp] = (),
        failure: Sequence[RequestOp] = (),
    ) -> TxnResponse:
        """Run a txn (see :class:`Txn`); its revision is the answer's ``revision``."""
        return await self._call(_txn(Txn(compare, success, failure)))

    async def compact(self, revision: int, *, physical: bool = False) -> None:
        """Forget the history before ``revision`` (:class:`EtcdCompacted` when it is
        already forgotten). ``physical``: answer once the space is freed."""
        await self._call(_compact(revision, physical))

    async def status(self) -> Status:
        """The pinned member's status (leader, raft term, database size, alarms)."""
        return await self._call(_STATUS)

    async def alarm_list(self) -> tuple[Alarm, ...]:
        """The alarms raised in the cluster (``NOSPACE``: the quota is reached)."""
        return await self._call(_ALARMS)

    async def member_list(self) -> tuple[Member, ...]:
        """The members of the cluster."""
        return await self._call(_MEMBERS)

    # -- I/O

    async def _call(self, rpc: _Rpc[T]) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if self._closed:
            raise self._closed_error(rpc)
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            raise self._lock_timeout(rpc) from None
        try:
            return await self._attempts(rpc, deadline)
        finally:
            self._lock.release()

    async def _attempts(self, rpc: _Rpc[T], deadline: float) -> T:
        loop = asyncio.get_running_loop()
        errors: list[EtcdUnavailable] = []
        for _ in self.endpoints:  # each member at most once per call
            if self._closed:
                raise self._closed_error(rpc)
            index = self._pinned
            try:
                status, raw = await self._exchange(index, rpc, deadline)
            except _NoReply as failure:
                error = self._no_reply(index, rpc, failure)
                errors.append(error)
                if self._retry(rpc, failure.sent, deadline - loop.time()):
                    continue
                raise self._gave_up(errors) from failure.cause
            try:
                return self._answer(index, rpc, status, raw)
            except EtcdUnavailable as error:
                errors.append(error)
                moved = self._pinned != index  # not when only overloaded: same member
                if moved and self._retry(rpc, True, deadline - loop.time()):
                    continue
                raise self._gave_up(errors) from None
        raise self._gave_up(errors)

    async def _connection(
        self, index: int, deadline: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The connection to member ``index``, made within ``connect_timeout`` (and the
        call's deadline) when there is none or it cannot be used again."""
        reader, writer = self._reader, self._writer
        if reader is not None and writer is not None:
            if self._conn_index == index and not writer.is_closing() and not reader.at_eof():
                return reader, writer
            self._drop()
        endpoint = self.endpoints[index]
        left = deadline - asyncio.get_running_loop().time()
        limit = min(self.connect_timeout, left)
        if limit <= 0:
            raise _NoReply("timeout", sent=False)
        context = self._tls_context(endpoint)
        try:
            async with asyncio.timeout(limit):
                reader, writer = await asyncio.open_connection(
                    endpoint.host,
                    endpoint.port,
                    ssl=context,
                    server_hostname=endpoint.host if context is not None else None,
                )
        except TimeoutError as exc:
            raise _NoReply(
                "connect-timeout" if limit < left else "timeout", sent=False, cause=exc
            ) from None
        except OSError as exc:
            raise _NoReply("connect", sent=False, cause=exc) from exc
        self._reader, self._writer, self._conn_index = reader, writer, index
        return reader, writer

    async def _exchange(self, index: int, rpc: _Rpc[Any], deadline: float) -> tuple[int, bytes]:
        """One request and its whole reply (status, body) by ``deadline``."""
        reader, writer = await self._connection(index, deadline)
        left = deadline - asyncio.get_running_loop().time()
        head = (
            f"POST {rpc.path} HTTP/1.1\r\n"
            f"Host: {self.endpoints[index].netloc}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(rpc.payload)}\r\n"
            f"Grpc-Timeout: {self._grpc_timeout(max(left, 0.001))}\r\n"
            "\r\n"
        )
        sent = False
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                writer.write(head.encode("ascii") + rpc.payload)
                sent = True
                # The loop's clock is the monotonic clock the member's is bounded against.
                sent_at = loop.time()
                await writer.drain()
                status, raw, keep, date = await _read_response(reader)
                self._dated(index, sent_at, loop.time(), date)
        except TimeoutError as exc:
            self._drop()
            raise _NoReply("timeout", sent=sent, cause=exc) from None
        except (OSError, EOFError, ValueError, _BadReply) as exc:
            self._drop()
            raise _NoReply("lost", sent=sent, cause=exc) from exc
        except BaseException:
            self._drop()  # cancelled: the reply may still come, unread
            raise
        if not keep:
            self._drop()
        return status, raw

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


# ----------------------------------------------------- HTTP/1.1 replies, for asyncio

_MAX_HEADER_LINES = 100


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    """Header (or trailer) lines up to the empty one, names in lower case."""
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise EOFError("the connection closed within the headers")
        if line in (b"\r\n", b"\n"):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise _BadReply(f"a header line without a colon: {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    raise _BadReply(f"more than {_MAX_HEADER_LINES} header lines")


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body; the trailer after it (error replies carry one) is read and
    dropped."""
    parts: list[bytes] = []
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise EOFError("the connection closed within a chunked body")
        size = int(line.split(b";", 1)[0].strip(), 16)  # ";..." is a chunk extension
        if size < 0:
            raise _BadReply(f"a chunk size of {size}")
        if size == 0:
            break
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise _BadReply("a chunk not followed by CRLF")
    await _read_headers(reader)
    return b"".join(parts)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool, str | None]:
    """(status, body, whether the connection can carry another request, its Date header)
    of one reply."""
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise EOFError("the connection closed before a reply")
        version, _, rest = line.decode("latin-1").partition(" ")
        status_text = rest.strip().partition(" ")[0]
        if not version.startswith("HTTP/1.") or not status_text.isdigit():
            raise _BadReply(f"not an HTTP/1.x status line: {line[:60]!r}")
        status = int(status_text)
        headers = await _read_headers(reader)
        if not 100 <= status < 200:
            break  # an interim reply (100 Continue) is followed by the real one
    keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    coding = headers.get("transfer-encoding", "").lower()
    if coding:
        if coding.rsplit(",", 1)[-1].strip() != "chunked":
            raise _BadReply(f"a transfer coding of {coding!r}")
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        length = headers["content-length"]
        if not length.isdigit():
            raise _BadReply(f"a Content-Length of {length!r}")
        body = await reader.readexactly(int(length))
    else:
        body, keep = await reader.read(), False  # the body ends with the connection
    return status, body, keep, headers.get("date")
