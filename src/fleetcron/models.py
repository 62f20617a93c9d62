"""Frozen value objects shared by the stores and the public API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["LeaseRecord", "micros_to_datetime"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_to_datetime(micros: int) -> datetime:
    """Convert microseconds since the Unix epoch to an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """A lease row as the store holds it. All times are the store's clock, in µs since epoch.

    ``now_us`` is the store's clock when the record was read, so callers can compute
    "held for" and "expires in" without consulting their own clock.
    """

    namespace: str
    name: str
    holder: str
    fence: int
    acquired_us: int
    expires_us: int
    min_until_us: int
    now_us: int

    @property
    def held(self) -> bool:
        """Whether the lease is valid at ``now_us`` (a lease is free at its expiry)."""
        return self.expires_us > self.now_us

    @property
    def acquired_at(self) -> datetime:
        return micros_to_datetime(self.acquired_us)

    @property
    def expires_at(self) -> datetime:
        return micros_to_datetime(self.expires_us)

    @property
    def holder_display(self) -> str:
        """``host:pid`` without the secret per-acquisition token."""
        host, _, rest = self.holder.rpartition(":")
        return host if host else rest
