from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.schedules import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    from_datetime,
    jitter_us,
    parse_timezone,
    preview,
    to_datetime,
    validate_cron,
)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "dst_cases.json").read_text("utf-8"))
SECOND = 1_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


def at(text: str) -> int:
    return from_datetime(datetime.fromisoformat(text))


def utc(moment_us: int) -> str:
    return to_datetime(moment_us).isoformat().replace("+00:00", "Z")


# --- golden corpus: DST and day-matching cases -------------------------------------------


@pytest.mark.parametrize("case", GOLDEN, ids=[case["id"] for case in GOLDEN])
def test_cron_slots_match_the_golden_corpus(case: dict[str, Any]) -> None:
    schedule = CronSchedule(case["expression"], case["timezone"])
    expected = [entry["utc"] for entry in case["expected"]]

    slots = schedule.slots_between(
        at(case["after"]), at("2100-01-01T00:00:00Z"), limit=len(expected)
    )

    assert [utc(slot) for slot in slots] == expected


@pytest.mark.parametrize("case", GOLDEN, ids=[case["id"] for case in GOLDEN])
def test_preview_marks_dst_effects_as_in_the_golden_corpus(case: dict[str, Any]) -> None:
    entries = preview(
        case["expression"], case["timezone"], len(case["expected"]), at(case["after"])
    )

    got = [
        {"utc": utc(entry.slot_us), "local": entry.local.isoformat(), "dst": entry.dst}
        for entry in entries
    ]
    assert got == case["expected"]


@pytest.mark.parametrize("case", GOLDEN, ids=[case["id"] for case in GOLDEN])
def test_next_after_walks_the_same_slots_as_slots_between(case: dict[str, Any]) -> None:
    schedule = CronSchedule(case["expression"], case["timezone"])
    moment = at(case["after"])
    walked = []
    for _ in case["expected"]:
        slot = schedule.next_after(moment)
        assert slot is not None
        assert slot > moment
        walked.append(utc(slot))
        moment = slot
    assert walked == [entry["utc"] for entry in case["expected"]]


def test_a_daily_job_runs_exactly_once_on_both_berlin_change_days() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin")
    for day in ("2025-03-30", "2025-10-26"):
        start = at(f"{day}T00:00:00+01:00") - 2 * HOUR
        slots = schedule.slots_between(start, start + 24 * HOUR, limit=10)
        assert len(slots) == 1, day


def test_next_after_is_strictly_after_a_slot_and_finds_it_from_just_before() -> None:
    schedule = CronSchedule("*/5 * * * *", "Europe/Berlin")
    slot = at("2025-06-01T10:05:00+02:00")

    assert schedule.next_after(slot) == slot + 5 * MINUTE
    assert schedule.next_after(slot - 1) == slot
    assert schedule.next_after(slot - 5 * MINUTE + 1) == slot


def test_next_after_from_inside_a_repeated_hour_never_goes_back_to_the_first_occurrence() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin")
    # 02:15 CET on 2025-10-26 is the second 02:15; the only 02:30 that day was 00:30Z.
    inside_second_pass = at("2025-10-26T02:15:00+01:00")

    assert utc(schedule.next_after(inside_second_pass) or 0) == "2025-10-27T01:30:00Z"


def test_slots_between_is_half_open_oldest_first_and_limited() -> None:
    schedule = CronSchedule("0 * * * *")
    start = at("2025-01-01T00:00:00Z")

    assert schedule.slots_between(start, start + 3 * HOUR, limit=10) == [
        start + HOUR,
        start + 2 * HOUR,
        start + 3 * HOUR,
    ]
    assert schedule.slots_between(start, start + 3 * HOUR, limit=2) == [
        start + HOUR,
        start + 2 * HOUR,
    ]
    assert schedule.slots_between(start, start + 3 * HOUR, limit=0) == []
    assert schedule.slots_between(start + HOUR, start, limit=5) == []


def test_a_cron_that_never_fires_again_returns_none() -> None:
    # The 5th Monday of February exists only in some years; near year 9999 none is left.
    schedule = CronSchedule("0 0 * 2 MON#5")
    assert schedule.next_after(at("2025-01-01T00:00:00Z")) is not None
    assert schedule.next_after(at("9990-01-01T00:00:00Z")) is None


# --- shortest interval ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "timezone", "shortest"),
    [
        ("*/5 * * * *", "UTC", 5 * MINUTE),
        ("30 2 * * *", "UTC", 24 * HOUR),
        ("30 2 * * *", "Europe/Berlin", 23 * HOUR + 30 * MINUTE),  # around the spring gap
        ("0 */2 * * *", "Europe/Berlin", HOUR),  # both 02:00s on the fall-back day
        ("0 0 * * *", "America/Santiago", 23 * HOUR),
        ("0 9 * * 1-5", "America/New_York", 24 * HOUR),
        ("0 0 1 1 *", "UTC", 365 * 24 * HOUR),
    ],
)
def test_min_interval_covers_a_year_of_dst_transitions(
    expression: str, timezone: str, shortest: int
) -> None:
    schedule = CronSchedule(expression, timezone)
    assert schedule.min_interval_us(from_us=at("2025-01-01T00:00:00Z")) == shortest


def test_min_interval_of_every_and_at() -> None:
    assert EverySchedule(30 * SECOND).min_interval_us() == 30 * SECOND
    one_off: Schedule = AtSchedule(at("2030-01-01T00:00:00Z"))
    assert one_off.min_interval_us() is None


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 25 * * *", "field 'hour' value 25 out of range 0-23"),
        ("60 * * * *", "field 'minute' value 60 out of range 0-59"),
        ("0 0 32 * *", "field 'day-of-month' value 32 out of range 1-31"),
        ("0 0 * 13 *", "field 'month' value 13 out of range 1-12"),
        ("0 0 * * 8", "field 'day-of-week' value 8 out of range 0-7"),
        ("0 0 * FOO *", "field 'month' name 'FOO' is not valid here"),
        ("*/0 * * * *", "field 'minute' step '0' must be a positive integer"),
        ("0 5-1 * * *", "field 'hour' range 5-1 is reversed"),
        ("0 0 * * MON#6", "field 'day-of-week' '#6' must be #1 to #5"),
        ("0 0 30 2 *", "field 'day-of-month' value '30' never occurs in month '2'"),
        ("* * * *", "expected 5 fields"),
        ("0 * * * * *", "expected 5 fields"),
        ("@daily", "expected 5 fields"),
    ],
)
def test_invalid_cron_names_the_wrong_field(expression: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        CronSchedule(expression)
    assert message in caught.value.message
    assert "\n" not in caught.value.message


def test_cron_whitespace_is_normalised_and_names_are_accepted() -> None:
    assert validate_cron("  0   9 * JAN-MAR mon-fri ") == "0 9 * JAN-MAR mon-fri"
    assert CronSchedule("0 9 * * 1") == CronSchedule(" 0 9  * * 1 ")


@pytest.mark.parametrize("name", ["Europe/Berln", "", "Not/AZone", "Europe", "../etc/passwd"])
def test_unknown_time_zones_are_configuration_errors(name: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_timezone(name)
    with pytest.raises(ConfigurationError):
        CronSchedule("* * * * *", name)


@pytest.mark.parametrize("every", [0, -SECOND])
def test_every_must_be_positive(every: int) -> None:
    with pytest.raises(ConfigurationError, match="every must be positive"):
        EverySchedule(every)


# --- every / at ----------------------------------------------------------------------------------


def test_every_slots_are_aligned_to_the_epoch_whatever_the_start() -> None:
    schedule = EverySchedule(30 * SECOND)
    base = at("2025-06-01T12:00:00Z")
    until = base + 10 * MINUTE
    reference = schedule.slots_between(base, until, limit=100)

    for offset in (1, 7 * SECOND, 29 * SECOND + 999_999):
        later = schedule.slots_between(base + offset, until, limit=100)
        assert later == reference
    for slot in reference:
        assert slot % (30 * SECOND) == 0
    assert reference[0] == base + 30 * SECOND
    assert len(reference) == 20


def test_every_next_after_is_strictly_after_and_handles_times_before_the_epoch() -> None:
    schedule = EverySchedule(7 * SECOND)
    assert schedule.next_after(14 * SECOND) == 21 * SECOND
    assert schedule.next_after(14 * SECOND - 1) == 14 * SECOND
    assert schedule.next_after(-1) == 0
    assert schedule.next_after(-8 * SECOND) == -7 * SECOND


def test_every_slots_between_respects_limit_and_bounds() -> None:
    schedule = EverySchedule(SECOND)
    assert schedule.slots_between(0, 5 * SECOND, limit=3) == [SECOND, 2 * SECOND, 3 * SECOND]
    assert schedule.slots_between(0, 5 * SECOND, limit=100)[-1] == 5 * SECOND
    assert schedule.slots_between(0, SECOND - 1, limit=100) == []


def test_at_is_a_single_slot() -> None:
    moment = at("2030-01-01T09:00:00+01:00")
    schedule = AtSchedule(moment)

    assert schedule.next_after(moment - 1) == moment
    assert schedule.next_after(moment) is None
    assert schedule.slots_between(moment - HOUR, moment, limit=5) == [moment]
    assert schedule.slots_between(moment, moment + HOUR, limit=5) == []
    assert schedule.slots_between(moment - HOUR, moment, limit=0) == []
    assert schedule.describe() == "once at 2030-01-01T08:00:00Z"


def test_every_schedule_kind_satisfies_the_protocol() -> None:
    schedules: list[Schedule] = [CronSchedule("* * * * *"), EverySchedule(SECOND), AtSchedule(0)]
    for schedule in schedules:
        assert isinstance(schedule, Schedule)
        assert schedule.describe()
        assert schedule.definition()["kind"] in ("cron", "every", "at")


# --- jitter ---------------------------------------------------------------------------


def test_jitter_is_deterministic_per_job_and_slot() -> None:
    assert jitter_us("report", 1_000, 20 * SECOND) == jitter_us("report", 1_000, 20 * SECOND)


def test_jitter_stays_within_bounds_and_spreads_out() -> None:
    limit = 20 * SECOND
    values = [jitter_us("report", slot * MINUTE, limit) for slot in range(500)]

    assert all(0 <= value <= limit for value in values)
    assert len(set(values)) > 450
    assert min(values) < limit / 10
    assert max(values) > limit * 9 / 10


def test_jitter_differs_between_jobs_and_is_zero_without_a_maximum() -> None:
    assert jitter_us("a", 0, 10**9) != jitter_us("b", 0, 10**9)
    assert jitter_us("a", 12345, 0) == 0
    assert jitter_us("a", 12345, 1) in (0, 1)
    with pytest.raises(ConfigurationError):
        jitter_us("a", 0, -1)


# --- preview notes ----------------------------------------------------------------------


def test_preview_explains_a_shifted_gap_time_and_a_time_that_runs_once() -> None:
    spring = preview("30 2 * * *", "Europe/Berlin", 1, at("2025-03-30T00:00:00+01:00"))[0]
    assert spring.note == (
        "DST gap 02:00–03:00 on 2025-03-30: 02:30 does not exist; runs at 03:00 instead"
    )
    fall = preview("30 2 * * *", "Europe/Berlin", 1, at("2025-10-26T00:00:00+02:00"))[0]
    assert fall.note == "02:30 occurs twice as DST ends; runs once, at the first"


def test_preview_of_an_ordinary_day_has_no_notes() -> None:
    entries = preview("0 12 * * *", "Europe/Berlin", 5, at("2025-06-01T00:00:00Z"))
    assert [entry.dst for entry in entries] == [None] * 5
    assert all(entry.note == "" for entry in entries)
    assert entries[0].local.isoformat() == "2025-06-01T12:00:00+02:00"
