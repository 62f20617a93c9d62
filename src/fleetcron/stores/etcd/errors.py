"""The etcd client's errors: :class:`EtcdError` and its kinds (each a fleetcron
:class:`~fleetcron.errors.StoreError`), the gRPC codes they carry (:class:`GrpcCode`), and
how etcd's codes and messages map to them.
"""

from __future__ import annotations

import enum
from typing import Any

from fleetcron.errors import StoreError, StoreRefused, StoreUnavailable
from fleetcron.stores.etcd.messages import Endpoint

__all__ = [
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
]


class GrpcCode(enum.IntEnum):
    """The gRPC status codes etcd's errors carry (``EtcdError.code``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class EtcdError(StoreError):
    """etcd did not carry out a call. ``code`` is the gRPC status code
    (:class:`GrpcCode`), ``status`` the HTTP status of the gateway's answer (0 when none
    came), ``reason`` etcd's own message (``"etcdserver: ..."``), ``endpoint`` the member."""

    def __init__(
        self,
        message: str,
        *,
        code: int,
        status: int = 0,
        reason: str = "",
        endpoint: Endpoint | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.reason = reason
        self.endpoint = endpoint

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickling calls the class with ``args`` alone: the keywords go in the state.
        return (_restored, (type(self), self.message), self.__dict__)


def _restored(kind: type[EtcdError], message: str) -> EtcdError:
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error


class EtcdUnavailable(EtcdError, StoreUnavailable):
    """No member could serve the call in time: no connection, no reply by the deadline,
    or the member answered that it cannot serve now (no leader, leader changed, request
    timed out, too many requests). ``outcome_unknown``: the call changes state and was
    sent, so it may or may not have been applied — read the state back before acting."""

    def __init__(
        self,
        message: str,
        *,
        code: int,
        status: int = 0,
        reason: str = "",
        endpoint: Endpoint | None = None,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(message, code=code, status=status, reason=reason, endpoint=endpoint)
        self.outcome_unknown = outcome_unknown


class EtcdRefused(EtcdError, StoreRefused):
    """etcd refused this client: authentication is required or failed, or the user may
    not do this (``PERMISSION_DENIED``, ``UNAUTHENTICATED``). Trying again will not help."""


class EtcdTooManyOps(EtcdError):
    """A txn holds more operations than the cluster's ``--max-txn-ops`` (128 by default;
    a nested txn's operations count against the outer txn's). Nothing was applied: split
    the batch."""


class EtcdDuplicateKey(EtcdError):
    """A txn writes one key twice in one branch (nested txns included). Nothing was
    applied."""


class EtcdCompacted(EtcdError):
    """The revision asked for (a range at a revision, a compaction) is at or below the
    cluster's compacted revision."""


class EtcdLeaseNotFound(EtcdError):
    """The lease named (a put's, a txn's put's, a revoke's) does not exist: expired or
    revoked. Nothing was applied."""


class EtcdNoSpace(EtcdError):
    """The cluster's NOSPACE alarm is raised (the database reached its quota): etcd takes
    reads and deletes, no puts and no lease grants, until an operator compacts,
    defragments and disarms the alarm."""


class EtcdRequestTooLarge(EtcdError):
    """The request is larger than the cluster's ``--max-request-bytes`` (1.5 MiB by
    default). Nothing was applied."""


# Refusals in etcd's words. Some arrive as INVALID_ARGUMENT: matched on the message.
_REFUSALS = (
    "etcdserver: user name is empty",
    "etcdserver: authentication failed",
    "etcdserver: permission denied",
    "etcdserver: invalid auth token",
    "etcdserver: user name not found",
)
_BY_REASON: tuple[tuple[str, type[EtcdError]], ...] = (
    ("too many operations in txn request", EtcdTooManyOps),
    ("duplicate key given in txn request", EtcdDuplicateKey),
    ("required revision has been compacted", EtcdCompacted),
    ("requested lease not found", EtcdLeaseNotFound),
    ("database space exceeded", EtcdNoSpace),
    ("request is too large", EtcdRequestTooLarge),
)
# The gateway's HTTP status for each gRPC code, read back when a reply has no code (a
# proxy's own error page).
_CODE_OF_STATUS = {
    400: GrpcCode.INVALID_ARGUMENT,
    401: GrpcCode.UNAUTHENTICATED,
    403: GrpcCode.PERMISSION_DENIED,
    404: GrpcCode.NOT_FOUND,
    408: GrpcCode.CANCELLED,
    409: GrpcCode.ABORTED,
    412: GrpcCode.FAILED_PRECONDITION,
    429: GrpcCode.RESOURCE_EXHAUSTED,
    501: GrpcCode.UNIMPLEMENTED,
    502: GrpcCode.UNAVAILABLE,
    503: GrpcCode.UNAVAILABLE,
    504: GrpcCode.DEADLINE_EXCEEDED,
}
# Codes saying "this member cannot serve now", not "this request is wrong": the pin moves.
_MOVE_CODES = frozenset({GrpcCode.CANCELLED, GrpcCode.DEADLINE_EXCEEDED, GrpcCode.UNAVAILABLE})


def _refusal(code: int, reason: str) -> bool:
    return code in (GrpcCode.PERMISSION_DENIED, GrpcCode.UNAUTHENTICATED) or any(
        reason.startswith(words) for words in _REFUSALS
    )
