"""The bounds of an etcd member's clock from its answers' Date headers
(:mod:`fleetcron.stores.etcd.clock`), against a simulated member whose clock is the
monotonic clock plus a hidden offset."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcron.stores.etcd.clock import MemberClock, date_seconds


def _answer(offset: float, sent: float, delay: float, at: float) -> tuple[float, float, int]:
    """A request sent at ``sent``, answered ``delay`` later; the member stamps it at the
    fraction ``at`` of the way, with its clock ``monotonic + offset``."""
    stamped = sent + delay * at
    return sent, sent + delay, math.floor(stamped + offset)


@settings(max_examples=300, deadline=None)
@given(
    offset=st.floats(min_value=1.7e9, max_value=1.8e9),
    start=st.floats(min_value=0, max_value=1e5),
    answers=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=3.0),  # pause before the request
            st.floats(min_value=0.0001, max_value=0.05),  # round trip
            st.floats(min_value=0.0, max_value=1.0),  # where in it the member stamps
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_the_bounds_always_hold_the_members_clock(
    offset: float, start: float, answers: list[tuple[float, float, float]]
) -> None:
    clock = MemberClock(drift=0.0)
    now = start
    for pause, delay, at in answers:
        now += pause
        clock.observe(*_answer(offset, now, delay, at))
        now += delay
        bounds = clock.bounds(now)
        assert bounds is not None
        assert bounds.low <= now + offset < bounds.high
    assert clock.steps == 0


@settings(max_examples=200, deadline=None)
@given(
    offset=st.floats(min_value=1.7e9, max_value=1.8e9),
    delay=st.floats(min_value=0.0005, max_value=0.01),
    at=st.floats(min_value=0.0, max_value=1.0),
)
def test_answers_asked_at_the_predicted_ticks_narrow_the_bounds_to_a_round_trip(
    offset: float, delay: float, at: float
) -> None:
    clock = MemberClock(drift=0.0)
    now = 10.0
    clock.observe(*_answer(offset, now, delay, at))
    for _ in range(16):
        now = max(now + delay, clock.next_tick(now) or now)
        clock.observe(*_answer(offset, now, delay, at))
    bounds = clock.bounds(now)
    assert bounds is not None
    assert bounds.low <= now + offset < bounds.high
    # Two round trips, and what 16 halvings leave of the first answer's second.
    assert bounds.width <= 2 * delay + 2**-14


def test_the_bounds_widen_with_the_drift_as_they_age() -> None:
    clock = MemberClock(drift=100e-6)
    clock.observe(0.0, 0.01, 1_000)
    fresh = clock.bounds(0.01)
    aged = clock.bounds(3_600.01)
    assert fresh is not None
    assert aged is not None
    assert aged.width == pytest.approx(fresh.width + 2 * 100e-6 * 3_600)


def test_an_answer_outside_the_bounds_is_a_step_and_starts_them_again() -> None:
    clock = MemberClock(drift=0.0)
    clock.observe(0.0, 0.01, 1_000)  # offset in [999.99, 1001)
    clock.observe(5.0, 5.01, 2_000)  # the member's clock jumped ~995 s ahead
    assert clock.steps == 1
    bounds = clock.bounds(5.01)
    assert bounds is not None
    assert bounds.low == pytest.approx(2_000)
    assert bounds.high == pytest.approx(2_001.01)


def test_no_bounds_before_an_answer_and_nonsense_refused() -> None:
    clock = MemberClock()
    assert clock.bounds(1.0) is None
    assert clock.next_tick(1.0) is None
    with pytest.raises(ValueError, match="before it was sent"):
        clock.observe(2.0, 1.0, 5)
    with pytest.raises(ValueError, match="drift"):
        MemberClock(drift=0.5)


def test_date_headers_are_read_as_epoch_seconds() -> None:
    assert date_seconds("Thu, 03 Dec 2026 19:08:17 GMT") == 1_796_324_897
