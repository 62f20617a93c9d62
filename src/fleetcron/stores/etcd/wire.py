"""The etcd client's wire format, free of I/O: the JSON gateway's requests built from the
typed values, its replies read back into them, each call described as an :class:`_Rpc`, and
the reading of error replies. Only the clients use these: nothing here is public.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from fleetcron.stores.etcd.errors import _CODE_OF_STATUS, GrpcCode
from fleetcron.stores.etcd.messages import (
    _RESULTS,
    _TARGETS,
    Alarm,
    Compare,
    Data,
    DeleteRange,
    DeleteRangeResponse,
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
    _bytes_of,
)

__all__: list[str] = []

T = TypeVar("T")


# ---------------------------------------------------------------------- wire: requests


def _b64(data: Data) -> str:
    return base64.b64encode(_bytes_of(data)).decode("ascii")


def _compare_json(compare: Compare) -> dict[str, object]:
    operand = compare.operand
    out: dict[str, object] = {
        "key": _b64(compare.key),
        "target": _TARGETS[compare.target],
        "result": _RESULTS[compare.op],
        # The field is named after the target; int64s go as strings.
        compare.target: _b64(operand) if isinstance(operand, bytes | str) else str(operand),
    }
    if compare.range_end is not None:
        out["range_end"] = _b64(compare.range_end)
    return out


def _put_json(put: Put) -> dict[str, object]:
    out: dict[str, object] = {"key": _b64(put.key), "value": _b64(put.value)}
    if put.lease:
        out["lease"] = str(put.lease)
    if put.prev_kv:
        out["prev_kv"] = True
    return out


def _range_json(rng: Range) -> dict[str, object]:
    out: dict[str, object] = {"key": _b64(rng.key)}
    if rng.range_end is not None:
        out["range_end"] = _b64(rng.range_end)
    if rng.limit:
        out["limit"] = str(rng.limit)
    if rng.revision:
        out["revision"] = str(rng.revision)
    for flag in ("keys_only", "count_only", "serializable"):
        if getattr(rng, flag):
            out[flag] = True
    return out


def _delete_json(delete: DeleteRange) -> dict[str, object]:
    out: dict[str, object] = {"key": _b64(delete.key)}
    if delete.range_end is not None:
        out["range_end"] = _b64(delete.range_end)
    if delete.prev_kv:
        out["prev_kv"] = True
    return out


def _txn_json(txn: Txn) -> dict[str, object]:
    return {
        "compare": [_compare_json(c) for c in txn.compare],
        "success": [_op_json(op) for op in txn.success],
        "failure": [_op_json(op) for op in txn.failure],
    }


def _op_json(op: RequestOp) -> dict[str, object]:
    match op:
        case Put():
            return {"request_put": _put_json(op)}
        case Range():
            return {"request_range": _range_json(op)}
        case DeleteRange():
            return {"request_delete_range": _delete_json(op)}
        case Txn():
            return {"request_txn": _txn_json(op)}
    raise TypeError(f"not a txn operation: {op!r}")


def _reads_only(txn: Txn) -> bool:
    """Whether ``txn`` only reads, whichever branch runs (it may then be sent again)."""
    return all(
        isinstance(op, Range) or (isinstance(op, Txn) and _reads_only(op))
        for op in (*txn.success, *txn.failure)
    )


# --------------------------------------------------------------------- wire: responses


class _BadReply(Exception):
    """A reply that is not what the gateway sends."""


def _int(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    if value is None:
        return 0  # left out: zero
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _BadReply(f"{name} is {value!r}, not an integer")
    try:
        return int(value)
    except ValueError:
        raise _BadReply(f"{name} is {value!r}, not an integer") from None


def _data(obj: Mapping[str, Any], name: str) -> bytes:
    return _unb64(obj.get(name), name)


def _unb64(value: object, name: str) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise _BadReply(f"{name} is {value!r}, not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _BadReply(f"{name} is not base64: {value[:40]!r}") from None


def _object(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _BadReply(f"{name} is {value!r}, not an object")
    return value


def _list(obj: Mapping[str, Any], name: str) -> list[Any]:
    value = obj.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _BadReply(f"{name} is {value!r}, not a list")
    return value


def _texts(obj: Mapping[str, Any], name: str) -> tuple[str, ...]:
    return tuple(str(item) for item in _list(obj, name))


def _header(obj: Mapping[str, Any]) -> ResponseHeader:
    header = _object(obj, "header")
    return ResponseHeader(
        cluster_id=_int(header, "cluster_id"),
        member_id=_int(header, "member_id"),
        revision=_int(header, "revision"),
        raft_term=_int(header, "raft_term"),
    )


def _kv(obj: Mapping[str, Any]) -> KeyValue:
    return KeyValue(
        key=_data(obj, "key"),
        value=_data(obj, "value"),
        create_revision=_int(obj, "create_revision"),
        mod_revision=_int(obj, "mod_revision"),
        version=_int(obj, "version"),
        lease=_int(obj, "lease"),
    )


def _put_response(obj: Mapping[str, Any]) -> PutResponse:
    prev = obj.get("prev_kv")
    return PutResponse(_header(obj), _kv(prev) if isinstance(prev, dict) else None)


def _range_response(obj: Mapping[str, Any]) -> RangeResponse:
    return RangeResponse(
        _header(obj),
        kvs=tuple(_kv(kv) for kv in _list(obj, "kvs")),
        count=_int(obj, "count"),
        more=bool(obj.get("more", False)),
    )


def _delete_response(obj: Mapping[str, Any]) -> DeleteRangeResponse:
    return DeleteRangeResponse(
        _header(obj),
        deleted=_int(obj, "deleted"),
        prev_kvs=tuple(_kv(kv) for kv in _list(obj, "prev_kvs")),
    )


def _txn_response(obj: Mapping[str, Any]) -> TxnResponse:
    return TxnResponse(
        _header(obj),
        succeeded=bool(obj.get("succeeded", False)),
        responses=tuple(_response_op(op) for op in _list(obj, "responses")),
    )


_RESPONSE_OPS: Final[tuple[tuple[str, Callable[[Mapping[str, Any]], ResponseOp]], ...]] = (
    ("response_put", _put_response),
    ("response_range", _range_response),
    ("response_delete_range", _delete_response),
    ("response_txn", _txn_response),
)


def _response_op(obj: Any) -> ResponseOp:
    if isinstance(obj, dict):
        for name, decode in _RESPONSE_OPS:
            if name in obj:
                return decode(_object(obj, name))
    raise _BadReply(f"a txn response of no known kind: {str(obj)[:80]}")


def _lease_grant(obj: Mapping[str, Any]) -> LeaseGrant:
    return LeaseGrant(_int(obj, "ID"), _int(obj, "TTL"))


def _keepalive(obj: Mapping[str, Any]) -> int | None:
    # A lease that is gone is answered without a TTL (zero, left out), not with an error.
    ttl = _int(obj, "TTL")
    return ttl if ttl > 0 else None


def _time_to_live(obj: Mapping[str, Any]) -> LeaseTimeToLive | None:
    ttl = _int(obj, "TTL")
    if ttl < 0:  # -1: no such lease
        return None
    keys = tuple(_unb64(key, "keys") for key in _list(obj, "keys"))
    return LeaseTimeToLive(_int(obj, "ID"), ttl, _int(obj, "grantedTTL"), keys)


def _status(obj: Mapping[str, Any]) -> Status:
    # The message's own field names (camelCase here), as the gateway writes them.
    return Status(
        _header(obj),
        version=str(obj.get("version", "")),
        db_size=_int(obj, "dbSize"),
        db_size_in_use=_int(obj, "dbSizeInUse"),
        leader=_int(obj, "leader"),
        raft_index=_int(obj, "raftIndex"),
        raft_term=_int(obj, "raftTerm"),
        raft_applied_index=_int(obj, "raftAppliedIndex"),
        errors=_texts(obj, "errors"),
        is_learner=bool(obj.get("isLearner", False)),
    )


def _members(obj: Mapping[str, Any]) -> tuple[Member, ...]:
    return tuple(
        Member(
            id=_int(m, "ID"),
            name=str(m.get("name", "")),
            peer_urls=_texts(m, "peerURLs"),
            client_urls=_texts(m, "clientURLs"),
            is_learner=bool(m.get("isLearner", False)),
        )
        for m in _list(obj, "members")
    )


def _alarms(obj: Mapping[str, Any]) -> tuple[Alarm, ...]:
    return tuple(
        Alarm(_int(a, "memberID"), str(a.get("alarm", "NONE"))) for a in _list(obj, "alarms")
    )


def _nothing(_obj: Mapping[str, Any]) -> None:
    return None


# ---------------------------------------------------------------------------- the calls


@dataclass(frozen=True, slots=True)
class _Rpc(Generic[T]):
    """One call, free of I/O: what to send, how to read the answer, and what a failure
    means. ``writes``: it changes state (a failure after sending leaves the outcome
    unknown); ``resendable``: sending it twice does no harm (reads; keep-alives)."""

    name: str
    path: str
    payload: bytes
    decode: Callable[[Mapping[str, Any]], T]
    writes: bool
    resendable: bool


def _rpc(
    name: str,
    path: str,
    body: Mapping[str, object],
    decode: Callable[[Mapping[str, Any]], T],
    *,
    writes: bool,
    resendable: bool | None = None,
) -> _Rpc[T]:
    payload = json.dumps(body, separators=(",", ":")).encode()
    again = (not writes) if resendable is None else resendable
    return _Rpc(name, path, payload, decode, writes, again)


def _grant(ttl_s: int, lease_id: int) -> _Rpc[LeaseGrant]:
    if ttl_s <= 0:
        raise ValueError(f"a lease TTL is a positive number of seconds, not {ttl_s!r}")
    body = {"TTL": str(ttl_s), "ID": str(lease_id)}
    return _rpc("lease grant", "/v3/lease/grant", body, _lease_grant, writes=True)


def _revoke(lease_id: int) -> _Rpc[None]:
    # Sending it again revokes nothing more: the second answer is "lease not found".
    body = {"ID": str(lease_id)}
    return _rpc("lease revoke", "/v3/lease/revoke", body, _nothing, writes=True, resendable=True)


def _keepalive_once(lease_id: int) -> _Rpc[int | None]:
    body = {"ID": str(lease_id)}
    return _rpc(
        "lease keep-alive", "/v3/lease/keepalive", body, _keepalive, writes=True, resendable=True
    )


def _ttl_of(lease_id: int, keys: bool) -> _Rpc[LeaseTimeToLive | None]:
    body = {"ID": str(lease_id), "keys": keys}
    return _rpc("lease time-to-live", "/v3/lease/timetolive", body, _time_to_live, writes=False)


def _range(rng: Range) -> _Rpc[RangeResponse]:
    return _rpc("range", "/v3/kv/range", _range_json(rng), _range_response, writes=False)


def _put(put: Put) -> _Rpc[PutResponse]:
    return _rpc("put", "/v3/kv/put", _put_json(put), _put_response, writes=True)


def _delete_range(delete: DeleteRange) -> _Rpc[DeleteRangeResponse]:
    body = _delete_json(delete)
    return _rpc("delete", "/v3/kv/deleterange", body, _delete_response, writes=True)


def _txn(txn: Txn) -> _Rpc[TxnResponse]:
    writes = not _reads_only(txn)
    return _rpc("txn", "/v3/kv/txn", _txn_json(txn), _txn_response, writes=writes)


def _compact(revision: int, physical: bool) -> _Rpc[None]:
    body = {"revision": str(revision), "physical": physical}
    return _rpc("compaction", "/v3/kv/compaction", body, _nothing, writes=True, resendable=True)


_STATUS: Final = _rpc("status", "/v3/maintenance/status", {}, _status, writes=False)
_ALARMS: Final = _rpc(
    "alarm list", "/v3/maintenance/alarm", {"action": "GET"}, _alarms, writes=False
)
_MEMBERS: Final = _rpc("member list", "/v3/cluster/member/list", {}, _members, writes=False)


# ---------------------------------------------------------------------- answers, errors


class _NoReply(Exception):
    """No answer came. ``stage``: "connect" (refused or unreachable), "connect-timeout",
    "timeout" (the call's deadline), "lost" (the connection broke or the reply was not
    HTTP). ``sent``: the request may have reached the member."""

    def __init__(self, stage: str, *, sent: bool, cause: BaseException | None = None) -> None:
        super().__init__(stage)
        self.stage = stage
        self.sent = sent
        self.cause = cause


def _first_json(raw: bytes) -> Any:
    """The first JSON value of ``raw`` (a stream's reply may hold more than one)."""
    text = raw.decode("utf-8", "replace").lstrip()
    if not text:
        return {}
    value, _ = json.JSONDecoder().raw_decode(text)
    return value


def _error_fields(status: int, raw: bytes) -> tuple[int, str]:
    """(gRPC code, etcd's message) of an error reply; a stream's errors come inside a
    200 as ``{"error": {"grpc_code", "message", ...}}``."""
    try:
        body = _first_json(raw)
    except ValueError:
        body = None
    code: object = None
    reason = ""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict):
            code, reason = inner.get("grpc_code"), str(inner.get("message", ""))
        else:
            code, reason = body.get("code"), str(body.get("message") or inner or "")
    else:
        reason = raw[:200].decode("utf-8", "replace").strip()
    if isinstance(code, int) and not isinstance(code, bool) and code:
        return code, reason
    return _CODE_OF_STATUS.get(status, GrpcCode.UNKNOWN), reason
