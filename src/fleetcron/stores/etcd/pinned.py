"""What the sync and the async etcd clients share (:class:`Pinned`): the endpoints and the
pin, the deadlines, and the reading of answers and failures into values or errors.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from fleetcron.stores.etcd.clock import ClockBounds, MemberClock, date_seconds
from fleetcron.stores.etcd.errors import (
    _BY_REASON,
    _MOVE_CODES,
    EtcdError,
    EtcdRefused,
    EtcdUnavailable,
    GrpcCode,
    _refusal,
)
from fleetcron.stores.etcd.messages import Endpoint
from fleetcron.stores.etcd.wire import _BadReply, _error_fields, _first_json, _NoReply, _Rpc

__all__ = ["Pinned"]

log = logging.getLogger("fleetcron")

T = TypeVar("T")


class Pinned:
    """What the two clients share: the endpoints and the pin, the deadlines, and the
    reading of answers and failures into values or errors. No I/O here."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint | tuple[str, int]],
        *,
        timeout: float,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.endpoints: tuple[Endpoint, ...] = tuple(
            e if isinstance(e, Endpoint) else Endpoint(e[0], e[1]) for e in endpoints
        )
        if not self.endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        if not (timeout > 0 and connect_timeout > 0):
            raise ValueError("timeout and connect_timeout are positive numbers of seconds")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self._ssl_context = ssl_context
        self._pinned = 0
        self._closed = False
        # Each member's clock, as the Date headers of its answers bound it.
        self._clocks = tuple(MemberClock() for _ in self.endpoints)

    @property
    def endpoint(self) -> Endpoint:
        """The member calls go to now."""
        return self.endpoints[self._pinned]

    def clock(self, now: float | None = None) -> ClockBounds | None:
        """The clock of the member calls go to now, at monotonic ``now`` (default: this
        instant), as its answers bound it; ``None`` before it answered
        (:mod:`fleetcron.stores.etcd.clock`)."""
        return self._clocks[self._pinned].bounds(time.monotonic() if now is None else now)

    def next_tick(self, now: float | None = None) -> float | None:
        """When an answer of the pinned member would narrow its clock's bounds most."""
        return self._clocks[self._pinned].next_tick(time.monotonic() if now is None else now)

    def _dated(self, index: int, sent: float, received: float, date: str | None) -> None:
        """Bound member ``index``'s clock by an answer's Date header (if it has a valid
        one: an answer without is no error, only no reading)."""
        if not date:
            return
        try:
            second = date_seconds(date)
        except (TypeError, ValueError):
            return
        self._clocks[index].observe(sent, received, second)

    def _tls_context(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        if not endpoint.tls:
            return None
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def _move(self, index: int, why: str) -> None:
        """Leave member ``index`` for the next one, if the pin is still there."""
        if self._pinned != index:
            return
        self._pinned = (index + 1) % len(self.endpoints)
        if len(self.endpoints) > 1:
            log.warning(
                "etcd member %s failed (%s): calls go to %s now",
                self.endpoints[index],
                why,
                self.endpoint,
                extra={"action": "store_endpoint_moved", "store": str(self.endpoints[index])},
            )

    def _grpc_timeout(self, remaining: float) -> str:
        """The ``Grpc-Timeout`` header: a little less than the time left, so that etcd's
        ``DEADLINE_EXCEEDED`` arrives before the client stops waiting for it."""
        margin = min(0.2, remaining / 10)
        millis = max(1, int((remaining - margin) * 1000))
        if millis < 10**8:  # at most 8 digits
            return f"{millis}m"
        return f"{min(int(remaining), 10**8 - 1)}S"

    def _closed_error(self, rpc: _Rpc[Any]) -> EtcdUnavailable:
        return EtcdUnavailable(
            f"the etcd client is closed; {rpc.name} was not sent", code=GrpcCode.CANCELLED
        )

    def _lock_timeout(self, rpc: _Rpc[Any]) -> EtcdUnavailable:
        return EtcdUnavailable(
            f"{rpc.name} waited {self.timeout:g} s (the backend URL's timeout) behind other "
            f"calls to etcd at {self.endpoint} and was not sent",
            code=GrpcCode.DEADLINE_EXCEEDED,
            endpoint=self.endpoint,
        )

    def _unknown(self, rpc: _Rpc[Any], sent: bool) -> str:
        if rpc.writes and sent:
            return (
                f"; the outcome is unknown: the {rpc.name} may or may not have been "
                "applied (read the state back before acting on it)"
            )
        return ""

    def _no_reply(self, index: int, rpc: _Rpc[Any], failure: _NoReply) -> EtcdUnavailable:
        """The error of a call that got no answer from member ``index``, which is left."""
        endpoint = self.endpoints[index]
        cause = f": {failure.cause}" if failure.cause and str(failure.cause) else ""
        if failure.stage == "connect":
            text = f"cannot connect to etcd at {endpoint}{cause}"
        elif failure.stage == "connect-timeout":
            text = (
                f"cannot connect to etcd at {endpoint} within {self.connect_timeout:g} s "
                "(the backend URL's connect_timeout)"
            )
        elif failure.stage == "timeout":
            text = (
                f"etcd at {endpoint} did not answer {rpc.name} within {self.timeout:g} s "
                "(the backend URL's timeout)"
            )
        else:
            name = type(failure.cause).__name__ if failure.cause else "closed"
            text = f"the connection to etcd at {endpoint} broke during {rpc.name} ({name}{cause})"
        self._move(index, failure.stage)
        timed_out = failure.stage in ("timeout", "connect-timeout")
        return EtcdUnavailable(
            text + self._unknown(rpc, failure.sent),
            code=GrpcCode.DEADLINE_EXCEEDED if timed_out else GrpcCode.UNAVAILABLE,
            endpoint=endpoint,
            outcome_unknown=rpc.writes and failure.sent,
        )

    def _answer(self, index: int, rpc: _Rpc[T], status: int, raw: bytes) -> T:
        """The value of member ``index``'s answer, or the error it carries (a member that
        cannot serve now is left)."""
        endpoint = self.endpoints[index]
        if status == 200:
            try:
                body = _first_json(raw)
                if not isinstance(body, dict):
                    raise _BadReply(f"a JSON {type(body).__name__}, not an object")
                if not isinstance(body.get("error"), dict):
                    result = body.get("result", body)  # a stream's message is wrapped
                    return rpc.decode(result if isinstance(result, dict) else {})
            except (ValueError, _BadReply) as exc:
                raise EtcdError(
                    f"etcd at {endpoint} answered {rpc.name} with a reply fleetcron cannot "
                    f"read ({exc}); the {rpc.name} was carried out",
                    code=GrpcCode.INTERNAL,
                    status=status,
                    endpoint=endpoint,
                ) from None
        code, reason = _error_fields(status, raw)
        said = f"{reason or 'no reason given'} (gRPC code {code}, HTTP {status})"
        if code in _MOVE_CODES or status in (502, 503, 504):
            self._move(index, reason or f"HTTP {status}")
            raise EtcdUnavailable(
                f"etcd at {endpoint} could not serve {rpc.name}: {said}" + self._unknown(rpc, True),
                code=code,
                status=status,
                reason=reason,
                endpoint=endpoint,
                outcome_unknown=rpc.writes,
            )
        if reason.endswith("too many requests"):  # refused before it was proposed
            raise EtcdUnavailable(
                f"etcd at {endpoint} is overloaded and refused {rpc.name}: {said}",
                code=code,
                status=status,
                reason=reason,
                endpoint=endpoint,
            )
        kind: type[EtcdError] = EtcdError
        if _refusal(code, reason):
            kind = EtcdRefused
        else:
            kind = next((k for words, k in _BY_REASON if words in reason), EtcdError)
        raise kind(
            f"etcd at {endpoint} refused {rpc.name}: {said}",
            code=code,
            status=status,
            reason=reason,
            endpoint=endpoint,
        )

    def _retry(self, rpc: _Rpc[Any], sent: bool, left: float) -> bool:
        """Whether to try the next member after a failure: nothing was sent (or the call
        may be sent twice) and time is left."""
        return left > 0.001 and (rpc.resendable or not sent) and not self._closed

    @staticmethod
    def _gave_up(errors: list[EtcdUnavailable]) -> EtcdUnavailable:
        """The error of a call that failed on more than one member: the last one's,
        naming the members tried."""
        last = errors[-1]
        if len(errors) == 1:
            return last
        tried = ", ".join(str(e.endpoint) for e in errors)
        unknown = any(e.outcome_unknown for e in errors)
        return EtcdUnavailable(
            f"no etcd member could serve the call (tried {tried}); last: {last.message}"
            + (
                "; an earlier attempt's outcome is unknown"
                if unknown and not last.outcome_unknown
                else ""
            ),
            code=last.code,
            status=last.status,
            reason=last.reason,
            endpoint=last.endpoint,
            outcome_unknown=unknown,
        )
