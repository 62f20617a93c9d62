"""Helpers for users' tests: a controllable clock and an in-memory store."""

from __future__ import annotations

import threading

from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore

__all__ = ["AsyncMemoryStore", "FakeClock", "MemoryStore"]


class FakeClock:
    """A clock that moves only when told. Both readings advance together."""

    def __init__(
        self, *, wall_us: int = 1_700_000_000_000_000, monotonic_us: int = 1_000_000
    ) -> None:
        self._wall = wall_us
        self._mono = monotonic_us
        self._lock = threading.Lock()

    def monotonic_us(self) -> int:
        with self._lock:
            return self._mono

    def wall_us(self) -> int:
        with self._lock:
            return self._wall

    def advance(self, seconds: float = 0, *, micros: int = 0) -> None:
        """Move both clocks forward."""
        step = round(seconds * 1_000_000) + micros
        if step < 0:
            raise ValueError("a FakeClock does not go backwards")
        with self._lock:
            self._wall += step
            self._mono += step
