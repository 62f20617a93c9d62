"""The etcd backend (``etcd://``, :mod:`~fleetcron.stores.etcd.store`): every operation an
optimistic txn over the rows it reads (:mod:`~fleetcron.stores.etcd.view`), a held
lease's key bound to an etcd lease. Its client speaks the v3 API through etcd's JSON
gateway (``POST /v3/...``) with the standard library alone, sync and async, pinned to one
member at a time.

The client's modules, whose public names are all importable from here:
:mod:`~fleetcron.stores.etcd.messages` (endpoints, requests, replies),
:mod:`~fleetcron.stores.etcd.errors` (:class:`EtcdError` and its kinds),
:mod:`~fleetcron.stores.etcd.wire` (the gateway's JSON and the calls, free of I/O),
:mod:`~fleetcron.stores.etcd.pinned` (what the two clients share: the pin, the deadlines,
the reading of answers), :mod:`~fleetcron.stores.etcd.client` (:class:`EtcdClient`) and
:mod:`~fleetcron.stores.etcd.async_client` (:class:`AsyncEtcdClient`).

Every member serves the v3 API as ``POST /v3/<service>/<method>`` with a JSON body (the
gRPC gateway, on by default since etcd 3.4). :class:`EtcdClient` speaks it over one
persistent ``http.client`` connection, :class:`AsyncEtcdClient` over one asyncio stream;
the requests, the replies and the errors are the same typed values for both.

**Endpoints.** A client is given every member's client address and *pins* one: every call
goes there until the member fails to serve one — no connection, no reply by the deadline,
or an answer that it cannot serve now (HTTP 503, gRPC ``UNAVAILABLE``: no leader, leader
changed, request timed out; ``DEADLINE_EXCEEDED``). Then the pin moves to the next member
in the list, for good: there is no round robin per call (a frozen member would then fail
every third call) and no member is left out for a time (the next failure moves the pin
again, whichever member it is).

**Deadlines.** Each call ends within the client's ``timeout`` (the backend URL's): waiting
for the client's lock, connecting, sending, and reading the whole reply. A connect is also
bounded by ``connect_timeout``. etcd is told the time left (``Grpc-Timeout``), so a member
that cannot reach its leader answers ``DEADLINE_EXCEEDED`` before the client gives up and
the connection stays usable. A call that failed before anything was sent is tried on the
next member while time is left, and so is a read or a call that may be sent twice (lease
keep-alive, revoke, compaction); a write that was sent is never sent again — its
:class:`EtcdUnavailable` says that the outcome is unknown (``outcome_unknown``). The sync
client resolves a host name with the system's resolver, which no deadline bounds: give
members as addresses where DNS may hang.

**The gateway's JSON**, handled here so that callers never see it: int64 fields travel as
strings; fields equal to zero, false or empty are left out (``succeeded``, ``kvs``,
``count``, a missing lease's ``TTL``); keys and values are standard base64; streaming
calls (lease keep-alive) answer ``{"result": ...}`` in chunks; errors are ``{"error",
"message", "code"}`` with the gRPC code, in chunks ending with a trailer. The gateway
ignores fields it does not know — a misspelt ``compare`` would make a txn unconditional —
so requests are built from the typed values here (:class:`Compare`, :class:`Put`,
:class:`Range`, :class:`DeleteRange`, :class:`Txn`), never from dictionaries.

TLS (``https`` endpoints, :class:`ssl.SSLContext`) goes through the same paths; etcd
authentication (user and password, a token per member) is not implemented yet: a member
that asks for it refuses the calls (:class:`EtcdRefused`).
"""

from __future__ import annotations

from fleetcron.stores.etcd.async_client import AsyncEtcdClient
from fleetcron.stores.etcd.client import EtcdClient
from fleetcron.stores.etcd.errors import (
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
)
from fleetcron.stores.etcd.messages import (
    DEFAULT_PORT,
    Alarm,
    Compare,
    CompareOp,
    CompareTarget,
    Data,
    DeleteRange,
    DeleteRangeResponse,
    Endpoint,
    KeyValue,
    LeaseGrant,
    LeaseTimeToLive,
    Member,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    Status,
    Txn,
    TxnResponse,
    parse_endpoints,
    prefix_end,
)

__all__ = [
    "DEFAULT_PORT",
    "Alarm",
    "AsyncEtcdClient",
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Data",
    "DeleteRange",
    "DeleteRangeResponse",
    "Endpoint",
    "EtcdClient",
    "EtcdCompacted",
    "EtcdDuplicateKey",
    "EtcdError",
    "EtcdLeaseNotFound",
    "EtcdNoSpace",
    "EtcdRefused",
    "EtcdRequestTooLarge",
    "EtcdTooManyOps",
    "EtcdUnavailable",
    "GrpcCode",
    "KeyValue",
    "LeaseGrant",
    "LeaseTimeToLive",
    "Member",
    "Put",
    "PutResponse",
    "Range",
    "RangeResponse",
    "RequestOp",
    "ResponseHeader",
    "ResponseOp",
    "Status",
    "Txn",
    "TxnResponse",
    "parse_endpoints",
    "prefix_end",
]
