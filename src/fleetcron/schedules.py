"""Schedules: the instants at which a job's slots fall.

A *slot* is identified by its instant, in integer microseconds since the Unix epoch (UTC).
Every replica computes the same slots from the same definition, so a slot is a key the whole
fleet agrees on.

Three kinds of schedule:

:class:`CronSchedule`
    A 5-field cron expression evaluated with `cronsim <https://github.com/cuu508/cronsim>`_
    in an IANA time zone. cronsim follows Debian cron at daylight-saving transitions:

    * An expression with a fixed minute *and* hour (``30 2 * * *``, ``0 0 * * 1-5``) is
      evaluated on the local wall clock. A wall time that does not exist (spring-forward gap)
      runs at the first instant after the gap (02:30 → 03:00 in Berlin; several gap times
      merge into that one run). A wall time that occurs twice (fall-back) runs once, at its
      first occurrence. So a daily job runs exactly once on both change days.
    * An expression whose minute or hour field starts with ``*`` (``*/15 * * * *``,
      ``0 * * * *``, ``0 */2 * * *``) walks the real timeline: wall times inside a gap never
      happen, and a repeated hour runs again (both 02:00s of an hourly job run).

:class:`EverySchedule`
    A fixed interval aligned to the Unix epoch: the slots are the multiples of the interval,
    whatever the moment a replica starts.

:class:`AtSchedule`
    One instant.

:func:`preview` lists upcoming fire times of a cron expression with the DST effects spelt
out, and :func:`jitter_us` spreads a slot's start deterministically.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Literal, Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from fleetcron.clock import SYSTEM_CLOCK
from fleetcron.durations import format_duration
from fleetcron.errors import ConfigurationError

__all__ = [
    "AtSchedule",
    "CronSchedule",
    "DstNote",
    "EverySchedule",
    "PreviewEntry",
    "Schedule",
    "from_datetime",
    "iso_utc",
    "jitter_us",
    "parse_instant",
    "parse_timezone",
    "preview",
    "schedule_from_definition",
    "to_datetime",
    "validate_cron",
]

_SECOND_US = 1_000_000
_HOUR_US = 3_600 * _SECOND_US
_DAY_US = 24 * _HOUR_US
_YEAR_US = 366 * _DAY_US
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)

# How min_interval_us looks for the shortest gap: a run of consecutive slots gives the
# regular gaps; DST transitions in the following year are then examined one by one, since
# only slots near a transition can be closer together than the regular gaps.
_SAMPLE_SLOTS = 400
_TRANSITION_WINDOW_SLOTS = 5_000
# Rare expressions (the 5th Monday of February) repeat on a 28-year cycle; look no further.
_SAMPLE_HORIZON_US = 60 * 365 * _DAY_US
# Offsets never jump by more than this at a transition, so wall times displaced by a
# transition lie within it on either side.
_TRANSITION_REACH_US = 3 * _HOUR_US

_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
_FIELD_NAMES: dict[int, frozenset[str]] = {
    2: frozenset({"L", "LW"}),
    3: frozenset("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()),
    4: frozenset("SUN MON TUE WED THU FRI SAT L".split()),
}
_TOKEN = re.compile(r"[A-Z]+|\d+")
# A fixed, valid reference instant: CronSim needs one to parse an expression.
_PARSE_REFERENCE = datetime(2000, 1, 1)

DstNote = Literal["gap-shifted", "gap-skipped", "repeat-first", "repeat-once", "repeat-second"]


def to_datetime(moment_us: int) -> datetime:
    """The aware UTC datetime of ``moment_us`` (microseconds since the Unix epoch)."""
    return _EPOCH + timedelta(microseconds=moment_us)


def from_datetime(moment: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ConfigurationError(f"datetime {moment.isoformat()} has no time zone")
    return (moment - _EPOCH) // _ONE_US


def parse_timezone(name: object) -> ZoneInfo:
    """The :class:`~zoneinfo.ZoneInfo` named ``name``, or a :class:`ConfigurationError`."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(
            f"time zone must be an IANA name like 'Europe/Berlin', not {name!r}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigurationError(f"unknown time zone {name!r}") from None


def _field_problem(index: int, part: str) -> str:
    name, low, high = _FIELDS[index]
    prefix = f"field '{name}'"
    allowed_names = _FIELD_NAMES.get(index, frozenset())
    for term in part.upper().split(","):
        base, _, step = term.partition("/")
        if "/" in term and (not step.isdigit() or int(step) == 0):
            return f"{prefix} step {step!r} must be a positive integer"
        if index == 4 and "#" in base:
            base, _, nth = base.partition("#")
            if not nth.isdigit() or not 1 <= int(nth) <= 5:
                return f"{prefix} '#{nth}' must be #1 to #5"
        for token in _TOKEN.findall(base):
            if token.isdigit():
                if not low <= int(token) <= high:
                    return f"{prefix} value {int(token)} out of range {low}-{high}"
            elif token not in allowed_names:
                return f"{prefix} name {token!r} is not valid here"
        bounds = base.split("-")
        if len(bounds) == 2 and all(bound.isdigit() for bound in bounds):
            if int(bounds[0]) > int(bounds[1]):
                return f"{prefix} range {base} is reversed"
    return f"{prefix} value {part!r} is invalid"


def validate_cron(expression: object) -> str:
    """Check a 5-field cron expression; return it with its whitespace normalised.

    The :class:`ConfigurationError` names the field that is wrong, e.g.
    ``field 'hour' value 25 out of range 0-23``.
    """
    if not isinstance(expression, str):
        raise ConfigurationError(
            f"cron expression must be a string, not {type(expression).__name__}"
        )
    return _validated(expression)


@functools.lru_cache(maxsize=1 << 12)
def _validated(expression: str) -> str:
    """:func:`validate_cron` of a string. Kept per expression: a jobs file of thousands of
    jobs repeats a few hundred expressions (only a valid one is kept: an error raises)."""
    parts = expression.split()
    normalized = " ".join(parts)
    if len(parts) != 5:
        raise ConfigurationError(
            f"invalid cron expression {expression!r}: expected 5 fields "
            f"(minute hour day-of-month month day-of-week), got {len(parts)}"
        )
    try:
        CronSim(normalized, _PARSE_REFERENCE)
    except CronSimError as exc:
        problem = exc
    else:
        return normalized  # each field parses alone when the whole does
    for index, part in enumerate(parts):
        probe = ["*"] * 5
        probe[index] = part
        try:
            CronSim(" ".join(probe), _PARSE_REFERENCE)
        except CronSimError:
            raise ConfigurationError(
                f"invalid cron expression {expression!r}: {_field_problem(index, part)}"
            ) from None
    # Each field parsed alone, so the combination is impossible: a day of month that no
    # selected month has.
    raise ConfigurationError(
        f"invalid cron expression {expression!r}: field 'day-of-month' value "
        f"{parts[2]!r} never occurs in month {parts[3]!r} ({problem})"
    ) from None


@runtime_checkable
class Schedule(Protocol):
    """When a job's slots fall. All instants are microseconds since the Unix epoch (UTC)."""

    def next_after(self, moment_us: int) -> int | None:
        """The first slot strictly after ``moment_us``, or ``None`` when there is none."""
        ...

    def slots_between(self, after_us: int, until_us: int, *, limit: int) -> list[int]:
        """The slots in ``(after_us, until_us]``, oldest first, at most ``limit`` of them."""
        ...

    def at_or_before(self, moment_us: int) -> int | None:
        """The last slot at or before ``moment_us``, or ``None`` when there is none."""
        ...

    def min_interval_us(self, *, from_us: int | None = None) -> int | None:
        """The shortest gap between consecutive slots (``None`` for a one-off).

        For cron this is measured over about a year from ``from_us`` (default: now), DST
        transitions included.
        """
        ...

    def describe(self) -> str:
        """A short human-readable description."""
        ...

    def definition(self) -> Mapping[str, str | int]:
        """The parameters that define the schedule (for fingerprints and registration)."""
        ...


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A 5-field cron expression in an IANA time zone (cronsim / Debian cron semantics)."""

    expression: str
    timezone: str = "UTC"
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expression", validate_cron(self.expression))
        object.__setattr__(self, "zone", parse_timezone(self.timezone))

    def _iter_after(self, moment_us: int) -> Iterator[int]:
        simulator = CronSim(self.expression, to_datetime(moment_us).astimezone(self.zone))
        last = moment_us
        while True:
            try:
                fire = next(simulator)
            except (StopIteration, OverflowError):  # 50 years without a match, or year 9999
                return
            slot = from_datetime(fire)
            # cronsim works on the naive wall clock for fixed-time expressions, so a start
            # inside a repeated hour can yield the first occurrence again: never go back.
            if slot > last:
                last = slot
                yield slot

    def next_after(self, moment_us: int) -> int | None:
        """The first slot strictly after ``moment_us``, or ``None``."""
        return _cron_next_after(self, moment_us)

    def at_or_before(self, moment_us: int) -> int | None:
        """The last slot at or before ``moment_us``, or ``None``."""
        if self.next_after(moment_us - 1) == moment_us:
            return moment_us
        start = to_datetime(moment_us).astimezone(self.zone)
        try:
            fire = next(CronSim(self.expression, start, reverse=True))
        except (StopIteration, OverflowError, ValueError):
            return None
        return from_datetime(fire)

    def slots_between(self, after_us: int, until_us: int, *, limit: int) -> list[int]:
        """The slots in ``(after_us, until_us]``, oldest first, at most ``limit``."""
        slots: list[int] = []
        if limit <= 0 or until_us <= after_us:
            return slots
        for slot in self._iter_after(after_us):
            if slot > until_us:
                break
            slots.append(slot)
            if len(slots) >= limit:
                break
        return slots

    def min_interval_us(self, *, from_us: int | None = None) -> int | None:
        """The shortest gap between consecutive slots over about a year from ``from_us``."""
        start = SYSTEM_CLOCK.wall_us() if from_us is None else from_us
        sample: list[int] = []
        for slot in _take(self._iter_after(start), _SAMPLE_SLOTS):
            sample.append(slot)
            if slot - start > _SAMPLE_HORIZON_US:
                break
        if len(sample) < 2:
            return None
        gaps = [later - earlier for earlier, later in pairwise(sample)]
        shortest, longest = min(gaps), max(gaps)
        if sample[-1] - start >= _YEAR_US + _DAY_US:
            return shortest
        reach = _TRANSITION_REACH_US + longest
        for transition in _transitions(self.zone, start, start + _YEAR_US):
            window = self.slots_between(
                transition - reach, transition + reach, limit=_TRANSITION_WINDOW_SLOTS
            )
            for earlier, later in pairwise(window):
                shortest = min(shortest, later - earlier)
        return shortest

    def describe(self) -> str:
        """E.g. ``cron '30 2 * * *' in Europe/Berlin``."""
        return f"cron {self.expression!r} in {self.timezone}"

    def definition(self) -> Mapping[str, str | int]:
        """``{"kind": "cron", "expression": ..., "timezone": ...}``."""
        return {"kind": "cron", "expression": self.expression, "timezone": self.timezone}


# Jobs that share an expression ask for the same slots: planned together at start-up (the
# slot after the store's time, the slot after that) and at each of their slots. A few
# thousand answers are kept: tens of µs of cronsim each, against a lookup.
@functools.lru_cache(maxsize=1 << 13)
def _cron_next_after(schedule: CronSchedule, moment_us: int) -> int | None:
    return next(schedule._iter_after(moment_us), None)


@dataclass(frozen=True, slots=True)
class EverySchedule:
    """Every ``every_us`` microseconds, aligned to the Unix epoch.

    Slot = floor(t / every) × every, so every replica agrees on slot identity whenever
    it started.
    """

    every_us: int

    def __post_init__(self) -> None:
        if isinstance(self.every_us, bool) or not isinstance(self.every_us, int):
            raise ConfigurationError(f"every must be an integer of microseconds: {self.every_us!r}")
        if self.every_us <= 0:
            raise ConfigurationError(
                f"every must be positive, got {format_duration(self.every_us)}"
            )

    def next_after(self, moment_us: int) -> int:
        """The next multiple of the interval strictly after ``moment_us``."""
        return (moment_us // self.every_us + 1) * self.every_us

    def slots_between(self, after_us: int, until_us: int, *, limit: int) -> list[int]:
        """The multiples of the interval in ``(after_us, until_us]``, at most ``limit``."""
        first = self.next_after(after_us)
        if limit <= 0 or first > until_us:
            return []
        count = min(limit, (until_us - first) // self.every_us + 1)
        return [first + index * self.every_us for index in range(count)]

    def at_or_before(self, moment_us: int) -> int:
        """The last multiple of the interval at or before ``moment_us``."""
        return moment_us // self.every_us * self.every_us

    def min_interval_us(self, *, from_us: int | None = None) -> int:
        """The interval itself."""
        return self.every_us

    def describe(self) -> str:
        """E.g. ``every 30s``."""
        return f"every {format_duration(self.every_us)}"

    def definition(self) -> Mapping[str, str | int]:
        """``{"kind": "every", "every_us": ...}``."""
        return {"kind": "every", "every_us": self.every_us}


@dataclass(frozen=True)
class AtSchedule:
    """A single slot at ``moment_us``."""

    moment_us: int

    def next_after(self, moment_us: int) -> int | None:
        """The one slot if it is strictly after ``moment_us``, else ``None``."""
        return self.moment_us if self.moment_us > moment_us else None

    def at_or_before(self, moment_us: int) -> int | None:
        """The one slot if it is at or before ``moment_us``, else ``None``."""
        return self.moment_us if self.moment_us <= moment_us else None

    def slots_between(self, after_us: int, until_us: int, *, limit: int) -> list[int]:
        """``[moment_us]`` when it lies in ``(after_us, until_us]`` and ``limit`` > 0."""
        if limit > 0 and after_us < self.moment_us <= until_us:
            return [self.moment_us]
        return []

    def min_interval_us(self, *, from_us: int | None = None) -> None:
        """A one-off has no interval."""
        return None

    def describe(self) -> str:
        """E.g. ``once at 2025-01-01T00:00:00Z``."""
        return f"once at {iso_utc(self.moment_us)}"

    def definition(self) -> Mapping[str, str | int]:
        """``{"kind": "at", "moment_us": ...}``."""
        return {"kind": "at", "moment_us": self.moment_us}


def schedule_from_definition(definition: Mapping[str, object]) -> Schedule:
    """Rebuild a schedule from :meth:`Schedule.definition` (as registered in the store)."""
    kind = definition.get("kind")
    try:
        if kind == "cron":
            return CronSchedule(str(definition["expression"]), str(definition["timezone"]))
        if kind == "every":
            return EverySchedule(int(str(definition["every_us"])))
        if kind == "at":
            return AtSchedule(int(str(definition["moment_us"])))
    except (KeyError, ValueError) as exc:
        raise ConfigurationError(f"unreadable schedule definition {dict(definition)!r}") from exc
    raise ConfigurationError(f"unknown schedule kind {kind!r}")


def jitter_us(job: str, slot_us: int, max_jitter_us: int) -> int:
    """A delay in ``[0, max_jitter_us]`` that depends only on ``job`` and ``slot_us``.

    Every replica computes the same delay for a slot, and different slots and jobs spread
    out, without any shared random state.
    """
    if max_jitter_us < 0:
        raise ConfigurationError(f"jitter must not be negative, got {max_jitter_us}us")
    if max_jitter_us == 0:
        return 0
    digest = hashlib.blake2b(
        f"{job}\x00{slot_us}".encode(), digest_size=8, person=b"fleetcron.jit"
    ).digest()
    return int.from_bytes(digest, "big") % (max_jitter_us + 1)


@dataclass(frozen=True)
class PreviewEntry:
    """One upcoming fire time of a cron expression, as :func:`preview` reports it.

    ``dst`` classifies a daylight-saving effect on this fire time, ``note`` explains it:

    * ``gap-shifted``: the scheduled wall time does not exist; it runs at the end of the gap.
    * ``gap-skipped``: wall times just before this one fell in a gap and did not run.
    * ``repeat-first`` / ``repeat-second``: the wall time occurs twice and runs both times.
    * ``repeat-once``: the wall time occurs twice and runs only at its first occurrence.
    """

    slot_us: int
    utc: datetime
    local: datetime
    dst: DstNote | None = None
    note: str = ""


def _take(slots: Iterator[int], count: int) -> Iterator[int]:
    for index, slot in enumerate(slots):
        if index >= count:
            return
        yield slot


def _offset_us(zone: ZoneInfo, moment_us: int) -> int:
    offset = to_datetime(moment_us).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _ONE_US


def _transition_in(zone: ZoneInfo, low_us: int, high_us: int) -> int:
    """The first instant whose offset differs from ``low_us``'s, given that ``high_us``'s does."""
    before = _offset_us(zone, low_us)
    low, high = low_us // _SECOND_US, high_us // _SECOND_US + 1
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_us(zone, middle * _SECOND_US) == before:
            low = middle
        else:
            high = middle
    return high * _SECOND_US


def _transitions(zone: ZoneInfo, start_us: int, end_us: int) -> list[int]:
    # Daily steps: every real offset change lasts far longer than a day.
    found: list[int] = []
    previous = start_us
    previous_offset = _offset_us(zone, previous)
    moment = start_us
    while moment < end_us:
        moment = min(moment + _DAY_US, end_us)
        offset = _offset_us(zone, moment)
        if offset != previous_offset:
            found.append(_transition_in(zone, previous, moment))
        previous, previous_offset = moment, offset
    return found


def parse_instant(text: str, where: str) -> int:
    """An ISO 8601 time given by a user (``where`` names the option or parameter) in µs
    since the epoch; one without an offset is UTC, as slots are. Anything else is a
    :class:`ConfigurationError` that names ``where``."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return from_datetime(moment)
    except ValueError:
        raise ConfigurationError(f"{where}: {text!r} is not an ISO 8601 time") from None


def iso_utc(moment_us: int) -> str:
    """``2026-12-01T07:37:12Z``: how fleetcron writes an instant (µs shown when not 0)."""
    text = to_datetime(moment_us).isoformat()
    return text.removesuffix("+00:00") + "Z"


def _wall(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S" if moment.second else "%H:%M")


def _matches(expression: str, wall: datetime) -> bool:
    return next(CronSim(expression, wall - timedelta(seconds=1)), None) == wall


def _is_repeated(local: datetime) -> bool:
    # Within a real (non-gap) moment, the other fold having another offset means the wall
    # time occurs twice.
    return local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset()


def _gap_note(
    schedule: CronSchedule, previous_us: int, slot_us: int, local: datetime
) -> tuple[DstNote, str] | None:
    zone = schedule.zone
    low = max(previous_us, slot_us - 2 * _DAY_US)
    offset_before = _offset_us(zone, low)
    offset_after = _offset_us(zone, slot_us)
    if offset_after <= offset_before:
        return None
    transition = _transition_in(zone, low, slot_us)
    gap_start = (to_datetime(transition + offset_before)).replace(tzinfo=None)
    gap_end = (to_datetime(transition + offset_after)).replace(tzinfo=None)
    missing: list[datetime] = []
    for wall in CronSim(schedule.expression, gap_start - timedelta(seconds=1)):
        if wall >= gap_end or len(missing) >= 6:
            break
        missing.append(wall)
    if not missing:
        return None
    times = ", ".join(_wall(wall) for wall in missing)
    day = gap_start.date().isoformat()
    gap = f"DST gap {_wall(gap_start)}–{_wall(gap_end)} on {day}"
    wall_now = local.replace(tzinfo=None)
    plural = len(missing) > 1
    if _matches(schedule.expression, wall_now):
        verb = "were" if plural else "was"
        return "gap-skipped", f"{gap}: {times} did not occur and {verb} skipped"
    verb = "do" if plural else "does"
    return "gap-shifted", f"{gap}: {times} {verb} not exist; runs at {_wall(wall_now)} instead"


def _repeat_note(schedule: CronSchedule, slot_us: int, local: datetime) -> tuple[DstNote, str]:
    wall = _wall(local)
    if local.fold == 1:
        return "repeat-second", f"repeated {wall} after DST ended: second occurrence"
    other = local.replace(fold=1).utcoffset()
    this = local.utcoffset()
    assert other is not None
    assert this is not None
    twin = slot_us + (this - other) // _ONE_US
    if schedule.next_after(twin - 1) == twin:
        return "repeat-first", f"{wall} occurs twice as DST ends; runs at both, this is the first"
    return "repeat-once", f"{wall} occurs twice as DST ends; runs once, at the first"


def preview(expression: str, timezone: str, count: int, after_us: int) -> list[PreviewEntry]:
    """The next ``count`` fire times of ``expression`` in ``timezone`` after ``after_us``.

    Each entry carries the UTC slot, the local wall time and, where daylight saving
    changes what happens, a :data:`DstNote` and an explanation.
    """
    schedule = CronSchedule(expression, timezone)
    entries: list[PreviewEntry] = []
    previous = after_us
    for slot in _take(schedule._iter_after(after_us), count):
        local = to_datetime(slot).astimezone(schedule.zone)
        found = _gap_note(schedule, previous, slot, local)
        if found is None and _is_repeated(local):
            found = _repeat_note(schedule, slot, local)
        dst, note = found if found is not None else (None, "")
        entries.append(
            PreviewEntry(slot_us=slot, utc=to_datetime(slot), local=local, dst=dst, note=note)
        )
        previous = slot
    return entries
