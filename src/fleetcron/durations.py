"""Durations as users write them: ``500ms``, ``90s``, ``10m``, ``1h30m``, ``2d``.

Internally every duration is an integer number of microseconds, so no float rounding
enters lease arithmetic.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta

from fleetcron.errors import ConfigurationError

__all__ = ["DurationLike", "format_duration", "parse_duration", "to_micros"]

DurationLike = str | int | float | timedelta

_UNITS_US = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}
# Longer than any lease, schedule or retention a user means, and small enough for every
# store's 64-bit microsecond columns once added to the current time.
MAX_DURATION_US = 100 * 365 * 86_400_000_000
# [0-9], not \d: \d (and float(), and int()) take every script's digits — "١٠s" and
# "１０s" would be ten seconds — so a duration would mean something no reader of the file
# or of a log line sees at a glance.
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(us|ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:us|ms|s|m|h|d))+")


def parse_duration(text: str, *, what: str = "duration") -> int:
    """Parse ``text`` (e.g. ``"1h30m"``) into microseconds.

    Raises :class:`ConfigurationError` naming ``what`` when the text is not a duration.
    A bare number is rejected: the unit must be explicit. The digits are ASCII ``0-9``
    only; a digit of another script (``١٠s``, ``１０s``) is refused, and the error says so.
    """
    total = _parsed(text.strip().lower())
    if total is None:
        foreign = any(c.isdigit() and not c.isascii() for c in text)
        hint = "; write the digits as ASCII 0-9" if foreign else ""
        raise ConfigurationError(
            f"{what}: {text!r} is not a duration (use e.g. 500ms, 90s, 10m, 1h30m, 2d{hint})"
        )
    return _bounded(total, text, what)


@functools.lru_cache(maxsize=512)
def _parsed(cleaned: str) -> float | None:
    """The microseconds ``cleaned`` says, or ``None``: made once per text (a fleet's jobs
    repeat the same few durations, defaults included, thousands of times)."""
    if not cleaned or not _WHOLE.fullmatch(cleaned):
        return None
    total = 0.0
    for number, unit in _PART.findall(cleaned):
        total += float(number) * _UNITS_US[unit]
    return total


def to_micros(value: DurationLike, *, what: str = "duration") -> int:
    """Convert a duration given as text, seconds (int/float) or timedelta to microseconds."""
    if isinstance(value, timedelta):
        return _bounded(value / timedelta(microseconds=1), value, what)
    if isinstance(value, bool):
        raise ConfigurationError(f"{what}: {value!r} is not a duration")
    if isinstance(value, int | float):
        if value != value:  # NaN
            raise ConfigurationError(f"{what}: NaN is not a duration")
        return _bounded(value * 1_000_000, value, what)
    if isinstance(value, str):
        return parse_duration(value, what=what)
    raise ConfigurationError(f"{what}: {value!r} is not a duration")


def _bounded(micros: float, given: object, what: str) -> int:
    """Round to whole microseconds, refusing what no store column could hold."""
    if abs(micros) > MAX_DURATION_US:
        raise ConfigurationError(f"{what}: {given!r} is longer than 100 years")
    return round(micros)


def format_duration(micros: int) -> str:
    """Render microseconds compactly, e.g. ``1h30m``, ``2.5s``, ``300ms``."""
    if micros < 0:
        return "-" + format_duration(-micros)
    if micros == 0:
        return "0s"
    if micros < 1_000:
        return f"{micros}us"
    if micros < 1_000_000:
        return f"{micros / 1_000:g}ms"
    if micros < 60_000_000:
        return f"{micros / 1_000_000:.3g}s"
    seconds = micros // 1_000_000
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)
