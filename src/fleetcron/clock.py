"""Injected clocks.

Lease expiry is decided by the *store's* clock; the only clock the client itself reads is
a monotonic one, for its local deadline (send time + ttl - margin). Logic takes a
:class:`Clock` so tests can drive time with :class:`fleetcron.testing.FakeClock`.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Source of time for fleetcron's logic."""

    def monotonic_us(self) -> int:
        """Microseconds on a clock that never steps (local deadlines only)."""
        ...

    def wall_us(self) -> int:
        """Microseconds since the Unix epoch (display and the memory store only)."""
        ...


class SystemClock:
    """The process's real clocks."""

    def monotonic_us(self) -> int:
        return time.monotonic_ns() // 1_000

    def wall_us(self) -> int:
        return time.time_ns() // 1_000


SYSTEM_CLOCK: Clock = SystemClock()
