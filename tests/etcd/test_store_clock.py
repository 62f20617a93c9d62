"""The etcd store's clock: the host's clock inside the member's bounds, else their low
bound, never going back."""

from __future__ import annotations

from fleetcron.stores.etcd.clock import ClockBounds
from fleetcron.stores.etcd.store import _StoreClock


class _Client:
    """A client whose pinned member's clock is bounded by ``bounds``."""

    def __init__(self, low: float, high: float) -> None:
        self.bounds: ClockBounds | None = ClockBounds(at=0.0, low=low, high=high)

    def clock(self) -> ClockBounds | None:
        return self.bounds


class _Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_host_clock_inside_the_bounds_is_the_store_clock() -> None:
    wall = _Wall(1000.4)
    clock = _StoreClock(wall)
    # Two clients of one host, bounds a second wide and unlike: the same instant.
    assert clock.now(_Client(1000.0, 1001.0)) == 1_000_400_000  # type: ignore[arg-type]
    other = _StoreClock(wall)
    assert other.now(_Client(1000.3, 1000.45)) == 1_000_400_000  # type: ignore[arg-type]


def test_a_host_clock_outside_the_bounds_gives_their_low_bound() -> None:
    ahead = _StoreClock(_Wall(1600.0))
    assert ahead.now(_Client(1000.0, 1000.02)) == 1_000_000_000  # type: ignore[arg-type]
    behind = _StoreClock(_Wall(400.0))
    assert behind.now(_Client(1000.0, 1000.02)) == 1_000_000_000  # type: ignore[arg-type]
    # The high bound is outside ([low, high)): a host clock there is not used either.
    edge = _StoreClock(_Wall(1000.02))
    assert edge.now(_Client(1000.0, 1000.02)) == 1_000_000_000  # type: ignore[arg-type]


def test_the_store_clock_never_goes_back() -> None:
    wall = _Wall(1000.9)
    clock = _StoreClock(wall)
    client = _Client(1000.0, 1001.0)
    assert clock.now(client) == 1_000_900_000  # type: ignore[arg-type]
    wall.now = 990.0  # the host's clock stepped back, out of the bounds
    assert clock.now(client) == 1_000_900_000  # type: ignore[arg-type]
    wall.now = 1000.95
    assert clock.now(client) == 1_000_950_000  # type: ignore[arg-type]


def test_no_answer_yet_is_no_time() -> None:
    client = _Client(0.0, 1.0)
    client.bounds = None
    assert _StoreClock(_Wall(0.5)).now(client) is None  # type: ignore[arg-type]
