"""The etcd client's typed values: the members' addresses (:class:`Endpoint`,
:func:`parse_endpoints`), the requests (:class:`Compare`, :class:`Put`, :class:`Range`,
:class:`DeleteRange`, :class:`Txn`) and the replies (:class:`PutResponse`,
:class:`RangeResponse`, :class:`TxnResponse`, :class:`Status`, ...). No JSON here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, TypeAlias, TypeVar

__all__ = [
    "DEFAULT_PORT",
    "Alarm",
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Data",
    "DeleteRange",
    "DeleteRangeResponse",
    "Endpoint",
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


R = TypeVar("R", "PutResponse", "RangeResponse", "DeleteRangeResponse", "TxnResponse")


Data: TypeAlias = bytes | str
"""A key or a value: bytes, or text sent as UTF-8."""

DEFAULT_PORT: Final = 2379
"""etcd's client port, for an endpoint written without one."""


# ---------------------------------------------------------------------------- endpoints


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One member's client address; ``tls``: it speaks HTTPS."""

    host: str
    port: int = DEFAULT_PORT
    tls: bool = False

    @property
    def netloc(self) -> str:
        """``host:port``, an IPv6 address in brackets (the HTTP ``Host`` header)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.netloc}"


def parse_endpoints(hosts: str, *, tls: bool = False) -> tuple[Endpoint, ...]:
    """The endpoints of ``"host:port,host:port"`` (the authority of an ``etcd://`` URL; a
    member may also be written ``http://host:port`` or ``https://host:port``, an IPv6
    address in brackets; the port defaults to 2379). ``tls``: the scheme of members
    written without one. Raises ``ValueError`` naming the member that is wrong."""
    endpoints: list[Endpoint] = []
    for item in hosts.split(","):
        text = item.strip()
        secure = tls
        for scheme, is_tls in (("http://", False), ("https://", True)):
            if text.lower().startswith(scheme):
                text, secure = text[len(scheme) :].rstrip("/"), is_tls
        if text.startswith("["):  # [IPv6]:port
            host, bracket, rest = text[1:].partition("]")
            port_text = rest.removeprefix(":")
            wrong = not bracket or rest[:1] not in ("", ":")
        else:
            host, _, port_text = text.partition(":")
            wrong = False
        if wrong or not host or "/" in host:
            raise ValueError(f"etcd endpoint {item.strip()!r}: expected host:port")
        if port_text and not (
            port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535
        ):
            raise ValueError(
                f"etcd endpoint {item.strip()!r}: the port must be a number from 1 to 65535"
            )
        endpoints.append(Endpoint(host, int(port_text) if port_text else DEFAULT_PORT, secure))
    return tuple(endpoints)


def prefix_end(prefix: Data) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``
    (the prefix with its last byte below 0xff incremented; ``b"\\0"``, every key, for an
    empty or all-0xff prefix)."""
    end = bytearray(_bytes_of(prefix))
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def _bytes_of(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    # bytes(5) would be five NUL bytes, not an error
    raise TypeError(f"a key or value is bytes or str, not {type(data).__name__}")


# ----------------------------------------------------------------------------- requests

CompareTarget: TypeAlias = Literal["create_revision", "mod_revision", "version", "value", "lease"]
"""What of a key a :class:`Compare` looks at."""
CompareOp: TypeAlias = Literal["==", "!=", "<", ">"]
"""How a :class:`Compare` compares it."""

_TARGETS: Final[Mapping[str, str]] = {
    "create_revision": "CREATE",
    "mod_revision": "MOD",
    "version": "VERSION",
    "value": "VALUE",
    "lease": "LEASE",
}
_RESULTS: Final[Mapping[str, str]] = {
    "==": "EQUAL",
    "!=": "NOT_EQUAL",
    "<": "LESS",
    ">": "GREATER",
}


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a txn: ``target`` of ``key`` (or of every key up to
    ``range_end``) compared by ``op`` with ``operand``. Built with the class methods, e.g.
    ``Compare.create_revision(key, "==", 0)`` (the key does not exist)."""

    key: Data
    target: CompareTarget
    op: CompareOp
    operand: int | Data
    range_end: Data | None = None

    def __post_init__(self) -> None:
        if self.target not in _TARGETS:
            raise ValueError(f"compare target {self.target!r}: one of {', '.join(_TARGETS)}")
        if self.op not in _RESULTS:
            raise ValueError(f"compare operator {self.op!r}: one of {', '.join(_RESULTS)}")
        if self.target == "value":
            if not isinstance(self.operand, bytes | str):
                raise TypeError("a value compare takes bytes or str")
        elif isinstance(self.operand, bool) or not isinstance(self.operand, int):
            raise TypeError(f"a {self.target} compare takes an int")

    @classmethod
    def create_revision(cls, key: Data, op: CompareOp, revision: int) -> Compare:
        """The revision that created ``key`` (0: the key does not exist)."""
        return cls(key, "create_revision", op, revision)

    @classmethod
    def mod_revision(cls, key: Data, op: CompareOp, revision: int) -> Compare:
        """The revision of ``key``'s last change (0: the key does not exist)."""
        return cls(key, "mod_revision", op, revision)

    @classmethod
    def version(cls, key: Data, op: CompareOp, version: int) -> Compare:
        """How many times ``key`` was written since it was created (0: it does not exist)."""
        return cls(key, "version", op, version)

    @classmethod
    def value(cls, key: Data, op: CompareOp, value: Data) -> Compare:
        """``key``'s value (a missing key fails every value compare)."""
        return cls(key, "value", op, value)

    @classmethod
    def lease(cls, key: Data, op: CompareOp, lease_id: int) -> Compare:
        """The lease ``key`` is bound to (0: none, or the key does not exist)."""
        return cls(key, "lease", op, lease_id)


@dataclass(frozen=True, slots=True)
class Put:
    """Set ``key`` to ``value``, bound to ``lease`` (0: no lease). ``prev_kv``: answer
    the key as it was."""

    key: Data
    value: Data = b""
    lease: int = 0
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class Range:
    """Read ``key``, or the keys from ``key`` up to (not including) ``range_end``
    (:func:`prefix_end` for a prefix). ``limit``: at most this many (0: all);
    ``revision``: as of this revision (0: the latest); ``keys_only``: leave the values
    out; ``count_only``: only count; ``serializable``: the member answers from its own
    copy without asking the leader (faster, may be stale)."""

    key: Data
    range_end: Data | None = None
    limit: int = 0
    revision: int = 0
    keys_only: bool = False
    count_only: bool = False
    serializable: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Delete ``key``, or the keys from ``key`` up to ``range_end``. ``prev_kv``: answer
    the deleted keys."""

    key: Data
    range_end: Data | None = None
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class Txn:
    """If every condition of ``compare`` holds, run ``success``, else ``failure``: all at
    one revision. As an operation of another txn, a nested txn (its operations count
    against the outer txn's ``--max-txn-ops``)."""

    compare: Sequence[Compare] = ()
    success: Sequence[RequestOp] = ()
    failure: Sequence[RequestOp] = ()


RequestOp: TypeAlias = Put | Range | DeleteRange | Txn
"""An operation of a txn."""


# ---------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """Which member answered (``member_id``), the store's ``revision`` when it did, and
    the raft term. A nested reply's header holds the revision alone (or nothing)."""

    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as stored: ``create_revision`` (the revision that created it; a fence),
    ``mod_revision`` (its last change), ``version`` (writes since created) and ``lease``
    (0: none). ``value`` is empty when the range asked for keys only."""

    key: bytes
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0


@dataclass(frozen=True, slots=True)
class PutResponse:
    """A put's answer; ``prev_kv`` when asked for and the key existed."""

    header: ResponseHeader
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        """The revision of the put."""
        return self.header.revision


@dataclass(frozen=True, slots=True)
class RangeResponse:
    """A range's answer: ``kvs`` (at most ``limit``), ``count`` (every key in the range),
    ``more`` (``kvs`` stopped at the limit)."""

    header: ResponseHeader
    kvs: tuple[KeyValue, ...] = ()
    count: int = 0
    more: bool = False

    @property
    def revision(self) -> int:
        """The revision the range read (inside a txn: the txn's revision)."""
        return self.header.revision


@dataclass(frozen=True, slots=True)
class DeleteRangeResponse:
    """A delete's answer: how many keys it ``deleted``; ``prev_kvs`` when asked for."""

    header: ResponseHeader
    deleted: int = 0
    prev_kvs: tuple[KeyValue, ...] = ()

    @property
    def revision(self) -> int:
        """The revision of the delete."""
        return self.header.revision


@dataclass(frozen=True, slots=True)
class TxnResponse:
    """A txn's answer: whether the compares held (``succeeded``) and one response per
    operation of the branch that ran, in order."""

    header: ResponseHeader
    succeeded: bool = False
    responses: tuple[ResponseOp, ...] = ()

    @property
    def revision(self) -> int:
        """The store's revision after the txn: the txn's own revision when it wrote
        (every put of one txn shares it), the revision it read otherwise."""
        return self.header.revision

    def response(self, index: int, kind: type[R]) -> R:
        """``responses[index]``, checked to be a ``kind`` (``TypeError`` otherwise)."""
        found = self.responses[index]
        if not isinstance(found, kind):
            raise TypeError(f"response {index} is a {type(found).__name__}, not a {kind.__name__}")
        return found


ResponseOp: TypeAlias = PutResponse | RangeResponse | DeleteRangeResponse | TxnResponse
"""The response to one operation of a txn."""


class LeaseGrant(NamedTuple):
    """A granted lease: its ``id`` and ``ttl`` in seconds (etcd may raise a TTL below
    its minimum)."""

    id: int
    ttl: int


@dataclass(frozen=True, slots=True)
class LeaseTimeToLive:
    """A live lease: ``ttl`` seconds left of ``granted_ttl``; ``keys`` bound to it (when
    asked for)."""

    id: int
    ttl: int
    granted_ttl: int
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Status:
    """One member's state (``maintenance/status``): the ``leader`` it follows (0: none
    known), the raft term and indexes, its database size and what of it is in use (the
    quota is checked against ``db_size``), and ``errors`` such as a raised alarm."""

    header: ResponseHeader
    version: str = ""
    db_size: int = 0
    db_size_in_use: int = 0
    leader: int = 0
    raft_index: int = 0
    raft_term: int = 0
    raft_applied_index: int = 0
    errors: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the cluster (``name`` is empty until it has started once)."""

    id: int
    name: str = ""
    peer_urls: tuple[str, ...] = ()
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class Alarm:
    """A raised alarm: ``"NOSPACE"`` (the quota is reached) or ``"CORRUPT"``."""

    member_id: int
    alarm: str
