from __future__ import annotations

from datetime import timedelta

import pytest

from fleetcron.durations import format_duration, parse_duration, to_micros
from fleetcron.errors import ConfigurationError


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("500ms", 500_000),
        ("90s", 90_000_000),
        ("10m", 600_000_000),
        ("1h30m", 5_400_000_000),
        ("2d", 172_800_000_000),
        ("1.5s", 1_500_000),
        ("250us", 250),
        (" 2M ", 120_000_000),
    ],
)
def test_durations_are_parsed_to_microseconds(text: str, micros: int) -> None:
    assert parse_duration(text) == micros


@pytest.mark.parametrize("text", ["", "10", "10x", "-5s", "s", "1h 30m", "1e3s", "ten seconds"])
def test_malformed_durations_name_the_option(text: str) -> None:
    with pytest.raises(ConfigurationError, match="--lock-at-most"):
        parse_duration(text, what="--lock-at-most")


def test_numbers_and_timedeltas_are_seconds() -> None:
    assert to_micros(2) == 2_000_000
    assert to_micros(0.25) == 250_000
    assert to_micros(timedelta(minutes=1)) == 60_000_000


@pytest.mark.parametrize("value", [True, float("nan"), None, [1]])
def test_non_durations_are_rejected(value: object) -> None:
    with pytest.raises(ConfigurationError):
        to_micros(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("micros", "text"),
    [(0, "0s"), (999, "999us"), (1_500, "1.5ms"), (2_500_000, "2.5s"), (5_400_000_000, "1h30m")],
)
def test_durations_render_compactly(micros: int, text: str) -> None:
    assert format_duration(micros) == text


@pytest.mark.parametrize(
    "value", ["99999999999999d", "1" + "0" * 400 + "s", float("inf"), -1e300, 4e9]
)
def test_a_duration_no_store_could_hold_is_refused(value: object) -> None:
    with pytest.raises(ConfigurationError, match="longer than 100 years"):
        to_micros(value, what="lock_at_most")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["١٠s", "１０s", "1٠m", "۵00ms", "१h", "1.٥s", "²s"])
def test_digits_other_than_ascii_are_refused_and_the_error_says_so(text: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_duration(text, what="every")
    assert raised.value.message == (
        f"every: {text!r} is not a duration (use e.g. 500ms, 90s, 10m, 1h30m, 2d; "
        "write the digits as ASCII 0-9)"
    )


def test_an_error_without_foreign_digits_gives_no_digit_hint() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_duration("10µs", what="every")
    assert "ASCII" not in raised.value.message
