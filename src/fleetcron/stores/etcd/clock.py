"""The clock of an etcd member, as a client can know it.

etcd has no command that reads its clock, and its lease TTLs count whole seconds. What a
member does say is the time of every HTTP answer of its gateway, in the ``Date`` header:
the member's clock at one instant between the request's sending and its answer, to the
second. One answer bounds the member's clock only to a second; several bound it better,
and an answer whose second differs from what the bounds before it predicted — one that
straddles the member's tick to the next second — narrows them to about one round trip.

:class:`MemberClock` keeps those bounds as an offset from this process's monotonic clock:
``member time ∈ [monotonic + low, monotonic + high)``. Every answer can only narrow them;
the monotonic clock's drift against the member's widens them as they age (``drift``, 200
ppm by default: ten times what NTP keeps a clock within). An answer outside the bounds
means the member's clock stepped (or the client moved to a member whose clock differs):
the bounds start again from that answer alone. No client wall clock enters the bounds; the
store (``store._StoreClock``) takes the host's clock when it lies within them and the low
bound, never ahead of the member, when it does not.
"""

from __future__ import annotations

import email.utils
import math
from dataclasses import dataclass

__all__ = ["DEFAULT_DRIFT", "ClockBounds", "MemberClock", "date_seconds"]

DEFAULT_DRIFT = 200e-6
"""How far the monotonic clock may drift from the member's, as a fraction of elapsed time."""


def date_seconds(header: str) -> int:
    """The epoch second of an HTTP ``Date`` header (``Thu, 03 Dec 2026 19:08:17 GMT``)."""
    parsed = email.utils.parsedate_to_datetime(header)
    return int(parsed.timestamp())


@dataclass(frozen=True, slots=True)
class ClockBounds:
    """The member's clock at monotonic instant ``at`` (seconds): in ``[low, high)``, epoch
    seconds."""

    at: float
    low: float
    high: float

    @property
    def width(self) -> float:
        """How uncertain the member's clock is, in seconds."""
        return self.high - self.low


class MemberClock:
    """Bounds of one member's clock from the ``Date`` headers of its answers (see the
    module's docstring). Not thread-safe: one per client, fed under its lock."""

    __slots__ = ("_drift", "_offsets", "_seen", "steps")

    def __init__(self, *, drift: float = DEFAULT_DRIFT) -> None:
        if not 0 <= drift < 0.01:
            raise ValueError(f"drift must be from 0 to 0.01, not {drift!r}")
        self._drift = drift
        # Bounds of the offset (member time - monotonic) at the monotonic instant ``_seen``;
        # none before the first answer.
        self._offsets: tuple[float, float] | None = None
        self._seen = 0.0
        self.steps = 0
        """How many times an answer fell outside the bounds and they started again."""

    def observe(self, sent: float, received: float, second: int) -> None:
        """An answer sent at monotonic ``sent``, received at ``received`` (seconds), said
        the member's clock was in ``[second, second + 1)`` at some instant between."""
        if received < sent:
            raise ValueError(f"an answer received ({received}) before it was sent ({sent})")
        # member = monotonic + offset at an instant t in [sent, received]:
        # second <= t + offset < second + 1, so offset in [second - received, second + 1 - sent).
        low, high = second - received, second + 1 - sent
        aged = self._aged(received)
        if aged is not None:
            narrowed = max(aged[0], low), min(aged[1], high)
            if narrowed[0] < narrowed[1]:
                low, high = narrowed
            else:  # the member's clock stepped, or another member answered
                self.steps += 1
        self._offsets, self._seen = (low, high), received

    def _aged(self, now: float) -> tuple[float, float] | None:
        """The offset's bounds at ``now``, widened by the drift since they were set."""
        if self._offsets is None:
            return None
        spread = self._drift * max(0.0, now - self._seen)
        return self._offsets[0] - spread, self._offsets[1] + spread

    def bounds(self, now: float) -> ClockBounds | None:
        """The member's clock at monotonic ``now``, or ``None`` before any answer."""
        aged = self._aged(now)
        if aged is None:
            return None
        return ClockBounds(at=now, low=now + aged[0], high=now + aged[1])

    def next_tick(self, now: float) -> float | None:
        """The monotonic instant after ``now`` at which an answer narrows the bounds most
        (``None`` before any answer): when the member's clock turns to its next second
        if the offset is the middle of its bounds. An answer sent then says whether the
        offset is above or below that middle, halving the bounds (less a round trip)."""
        aged = self._aged(now)
        if aged is None:
            return None
        middle = (aged[0] + aged[1]) / 2
        # The member's second boundary k, reached at monotonic k - middle, after now.
        k = math.floor(now + middle) + 1
        return k - middle
