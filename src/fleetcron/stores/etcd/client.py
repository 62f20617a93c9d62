"""The blocking etcd v3 client, :class:`EtcdClient`: one persistent ``http.client``
connection, which the calls of all threads share under a lock.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
import time
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
from fleetcron.stores.sql.watchdog import deadline as socket_deadline
from fleetcron.stores.url import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S

__all__ = ["EtcdClient"]

T = TypeVar("T")


def _stale(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: the member closed it (end of
    file) or sent what no request asked for. Either way it is not used again, so that a
    write never goes out on a connection that is already gone."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):
        return True


class EtcdClient(Pinned):
    """A blocking etcd v3 client (see the package's docstring for the endpoint policy and
    the deadlines). Thread-safe: the calls of all threads share one connection, one at a
    time, each ending within ``timeout`` of its start, the wait for the connection
    included. Close it (or use it as a context manager) when done.

    One connection under a lock rather than one per thread: fleetcron's sync stores run
    one call at a time anyway (each store serialises its calls), so more connections
    would add no concurrency — only sockets that outlive their threads, a ``close`` that
    cannot reach them, and one pin per thread to keep in step."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint | tuple[str, int]],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``endpoints``: every member's client address, in the order to try them;
        ``timeout`` bounds each call, ``connect_timeout`` each connect (seconds);
        ``ssl_context`` for ``https`` endpoints (the system's trust store by default)."""
        super().__init__(
            endpoints, timeout=timeout, connect_timeout=connect_timeout, ssl_context=ssl_context
        )
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._conn_index = -1
        self._conn_pid = 0

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (after the call in flight, if any); calls made after
        this raise :class:`EtcdUnavailable`."""
        self._closed = True
        with self._lock:
            self._drop()

    # -- the API (each method's contract: AsyncEtcdClient's twin says the same)

    def grant(self, ttl_s: int, *, lease_id: int = 0) -> LeaseGrant:
        """Grant a lease of ``ttl_s`` seconds (``lease_id``: this ID, 0 for etcd's
        choice; etcd refuses one that exists). Not sent twice after a failure: a lost
        answer leaves a lease that expires unused."""
        return self._call(_grant(ttl_s, lease_id))

    def revoke(self, lease_id: int) -> bool:
        """Revoke a lease, deleting its keys; ``False`` when there was no such lease
        (expired, revoked — perhaps by this call's own first attempt)."""
        try:
            self._call(_revoke(lease_id))
        except EtcdLeaseNotFound:
            return False
        return True

    def keepalive_once(self, lease_id: int) -> int | None:
        """Refresh a lease to its full TTL: the TTL, or ``None`` when the lease is gone."""
        return self._call(_keepalive_once(lease_id))

    def time_to_live(self, lease_id: int, *, keys: bool = False) -> LeaseTimeToLive | None:
        """A lease's remaining TTL (and its keys when ``keys``); ``None`` when it is gone."""
        return self._call(_ttl_of(lease_id, keys))

    def range(
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
        return self._call(_range(rng))

    def put(self, key: Data, value: Data, lease: int = 0, *, prev_kv: bool = False) -> PutResponse:
        """Set a key (see :class:`Put`)."""
        return self._call(_put(Put(key, value, lease, prev_kv)))

    def delete_range(
        self, key: Data, range_end: Data | None = None, *, prev_kv: bool = False
    ) -> DeleteRangeResponse:
        """Delete a key or a range of keys (see :class:`DeleteRange`)."""
        return self._call(_delete_range(DeleteRange(key, range_end, prev_kv)))

    def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[RequestOp] = (),
        failure: Sequence[RequestOp] = (),
    ) -> TxnResponse:
        """Run a txn (see :class:`Txn`); its revision is the answer's ``revision``."""
        return self._call(_txn(Txn(compare, success, failure)))

    def compact(self, revision: int, *, physical: bool = False) -> None:
        """Forget the history before ``revision`` (:class:`EtcdCompacted` when it is
        already forgotten). ``physical``: answer once the space is freed."""
        self._call(_compact(revision, physical))

    def status(self) -> Status:
        """The pinned member's status (leader, raft term, database size, alarms)."""
        return self._call(_STATUS)

    def alarm_list(self) -> tuple[Alarm, ...]:
        """The alarms raised in the cluster (``NOSPACE``: the quota is reached)."""
        return self._call(_ALARMS)

    def member_list(self) -> tuple[Member, ...]:
        """The members of the cluster."""
        return self._call(_MEMBERS)

    # -- I/O

    def _call(self, rpc: _Rpc[T]) -> T:
        deadline = time.monotonic() + self.timeout
        if self._closed:
            raise self._closed_error(rpc)
        if not self._lock.acquire(timeout=self.timeout):
            raise self._lock_timeout(rpc)
        try:
            return self._attempts(rpc, deadline)
        finally:
            self._lock.release()

    def _attempts(self, rpc: _Rpc[T], deadline: float) -> T:
        errors: list[EtcdUnavailable] = []
        for _ in self.endpoints:  # each member at most once per call
            if self._closed:
                raise self._closed_error(rpc)
            index = self._pinned
            try:
                status, raw = self._exchange(index, rpc, deadline)
            except _NoReply as failure:
                error = self._no_reply(index, rpc, failure)
                errors.append(error)
                if self._retry(rpc, failure.sent, deadline - time.monotonic()):
                    continue
                raise self._gave_up(errors) from failure.cause
            try:
                return self._answer(index, rpc, status, raw)
            except EtcdUnavailable as error:
                errors.append(error)
                moved = self._pinned != index  # not when only overloaded: same member
                if moved and self._retry(rpc, True, deadline - time.monotonic()):
                    continue
                raise self._gave_up(errors) from None
        raise self._gave_up(errors)

    def _connection(self, index: int, deadline: float) -> http.client.HTTPConnection:
        """The connection to member ``index``, made within ``connect_timeout`` (and the
        call's deadline) when there is none or it cannot be used again."""
        conn = self._conn
        if conn is not None and (
            self._conn_index != index
            or self._conn_pid != os.getpid()  # inherited across a fork: never shared
            or conn.sock is None
            or _stale(conn.sock)
        ):
            self._drop()
            conn = None
        if conn is not None:
            return conn
        endpoint = self.endpoints[index]
        left = deadline - time.monotonic()
        limit = min(self.connect_timeout, left)
        if limit <= 0:
            raise _NoReply("timeout", sent=False)
        context = self._tls_context(endpoint)
        if context is not None:
            conn = http.client.HTTPSConnection(
                endpoint.host, endpoint.port, timeout=limit, context=context
            )
        else:
            conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=limit)
        try:
            conn.connect()  # TCP, and the TLS handshake on https
        except TimeoutError as exc:
            conn.close()
            stage = "connect-timeout" if limit < left else "timeout"
            raise _NoReply(stage, sent=False, cause=exc) from exc
        except OSError as exc:
            conn.close()
            raise _NoReply("connect", sent=False, cause=exc) from exc
        self._conn, self._conn_index, self._conn_pid = conn, index, os.getpid()
        return conn

    def _exchange(self, index: int, rpc: _Rpc[Any], deadline: float) -> tuple[int, bytes]:
        """One request and its whole reply (status, body) by ``deadline``."""
        conn = self._connection(index, deadline)
        left = deadline - time.monotonic()
        sock = conn.sock
        if left <= 0 or sock is None:
            raise _NoReply("timeout", sent=False)
        headers = {
            "Content-Type": "application/json",
            "Grpc-Timeout": self._grpc_timeout(left),
        }
        # Each socket operation waits the time left at most, and the watchdog shuts the
        # socket down at the deadline: a reply trickling in, byte by byte, cannot keep
        # the call past it. The watchdog gets a descriptor of its own, which no other
        # socket can be given while it is armed.
        sock.settimeout(left)
        watched = os.dup(sock.fileno())
        cut = socket_deadline(watched, left)
        try:
            with cut:
                sent = time.monotonic()
                conn.request("POST", rpc.path, rpc.payload, headers)
                response = conn.getresponse()
                raw = response.read()
                self._dated(index, sent, time.monotonic(), response.getheader("Date"))
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            stage = "timeout" if cut.expired or isinstance(exc, TimeoutError) else "lost"
            raise _NoReply(stage, sent=True, cause=exc) from exc
        finally:
            os.close(watched)
        if cut.expired or response.will_close:
            self._drop()  # shut down by the watchdog just as the reply ended, or closing
        return response.status, raw

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
