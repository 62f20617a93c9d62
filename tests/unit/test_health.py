"""The dead man's switch: a job's health from its store row and ledger alone."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fleetcron.health import MIN_GRACE_US, assess, expected_slot
from fleetcron.models import JobRecord, RunRecord
from fleetcron.schedules import CronSchedule, EverySchedule, from_datetime

S = 1_000_000
MIN = 60 * S
T0 = 1_800_000_000 * S  # a round number of seconds, on a minute boundary


def job(*, every_us: int | None = 5 * MIN, grace_us: int | None = None, **fields: Any) -> JobRecord:
    schedule: dict[str, object] = {"kind": "every", "every_us": every_us}
    definition = {"schedule": schedule, "timezone": "UTC", "grace_us": grace_us}
    definition.update(fields.pop("definition_extra", {}))
    values: dict[str, Any] = {
        "namespace": "ns",
        "job": "report",
        "paused": False,
        "definition": json.dumps(definition),
        "fingerprint": "f" * 32,
        "high_water_us": None,
        "last_success_us": None,
        "last_failure_us": None,
        "updated_us": T0,
        "now_us": T0,
    }
    values.update(fields)
    return JobRecord(**values)


def run(slot_us: int, state: str, *, started: int | None = None, took: int = 10 * S,
        error: str | None = None, now_us: int = T0) -> RunRecord:  # fmt: skip
    start = slot_us if started is None else started
    final = state not in ("running", "queued")
    return RunRecord(
        namespace="ns",
        job="report",
        slot_us=slot_us,
        state=state,
        attempt=1,
        fence=slot_us,
        holder="host:1",
        run_id="r",
        trigger="schedule",
        started_us=start if state != "skipped" else None,
        finished_us=start + took if final and state != "skipped" else None,
        expires_us=None if final else now_us + 10 * MIN,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=error,
        output=None,
        now_us=now_us,
    )


def test_a_job_registered_just_now_is_not_overdue() -> None:
    health = assess(job(now_us=T0 + 2 * MIN), [])
    assert health.state == "ok"
    assert health.expected_slot_us is None


def test_no_success_by_the_next_slot_makes_a_job_overdue() -> None:
    # Registered at T0; the slot T0+5m had until T0+10m (one interval) to succeed.
    now = T0 + 10 * MIN + S
    health = assess(job(now_us=now), [])
    assert health.state == "overdue"
    assert health.expected_slot_us == T0 + 5 * MIN
    assert "no success since the slot of" in health.reasons[0]


def test_a_success_since_the_expected_slot_clears_it() -> None:
    now = T0 + 10 * MIN + S
    health = assess(job(now_us=now, last_success_us=T0 + 5 * MIN + 20 * S), [])
    assert health.state == "ok"


def test_every_slot_skipped_is_still_overdue() -> None:
    now = T0 + 30 * MIN + S
    skipped = [run(T0 + k * 5 * MIN, "skipped", error="previous run still running")
               for k in range(6, 0, -1)]  # fmt: skip
    health = assess(job(now_us=now, last_success_us=T0 - MIN, high_water_us=T0 + 30 * MIN),
                    skipped)  # fmt: skip
    assert health.state == "overdue"
    assert health.starved


def test_a_store_that_was_down_leaves_no_rows_and_the_job_is_overdue() -> None:
    # The last success is an hour old; nothing at all was recorded since.
    now = T0 + 60 * MIN
    health = assess(job(now_us=now, last_success_us=T0 + 2 * S, high_water_us=T0), [])
    assert health.state == "overdue"


def test_an_explicit_grace_replaces_the_interval() -> None:
    now = T0 + 7 * MIN
    late = job(now_us=now, grace_us=90 * S, updated_us=T0 - S)
    assert assess(late, []).expected_slot_us == T0 + 5 * MIN
    assert assess(late, []).state == "overdue"
    generous = job(now_us=now, grace_us=20 * MIN, updated_us=T0 - 30 * MIN)
    assert assess(generous, []).expected_slot_us == T0 - 15 * MIN


def test_the_default_grace_is_at_least_a_minute() -> None:
    schedule = EverySchedule(10 * S)
    slot = expected_slot(schedule, None, T0 + 65 * S, T0 - 10 * MIN)
    assert slot is not None
    assert slot + MIN_GRACE_US <= T0 + 65 * S < slot + MIN_GRACE_US + 10 * S


def test_a_cron_job_uses_the_gap_to_its_next_slot_as_grace() -> None:
    schedule = CronSchedule("0 9 * * 1-5", "Europe/Berlin")  # weekdays 09:00
    friday = from_datetime(
        __import__("datetime").datetime.fromisoformat("2027-01-08T08:00:00+00:00")
    )
    sunday = friday + 2 * 24 * 3600 * S
    # Friday's slot is expected by Monday's: not yet due on Sunday.
    thursday_slot = expected_slot(schedule, None, sunday, friday - 7 * 24 * 3600 * S)
    assert thursday_slot == friday - 24 * 3600 * S


def test_a_failure_not_followed_by_a_success_is_failing() -> None:
    now = T0 + 6 * MIN
    health = assess(job(now_us=now, last_success_us=T0 + MIN, last_failure_us=T0 + 5 * MIN + S),
                    [run(T0 + 5 * MIN, "failed")])  # fmt: skip
    assert health.state == "failing"
    recovered = assess(
        job(now_us=now, last_success_us=T0 + 5 * MIN + 30 * S, last_failure_us=T0 + 5 * MIN + S),
        [run(T0 + 5 * MIN, "succeeded")],
    )
    assert recovered.state == "ok"


def test_a_paused_job_is_neither_overdue_nor_failing() -> None:
    health = assess(job(now_us=T0 + 60 * MIN, paused=True, last_failure_us=T0), [])
    assert health.state == "paused"
    assert not health.overdue


def test_a_run_held_far_longer_than_usual_is_stuck() -> None:
    now = T0 + 60 * MIN
    history = [run(T0 + k * 5 * MIN, "succeeded", took=20 * S) for k in range(10, 0, -1)]
    running = run(now - 30 * S, "running", now_us=now)
    fresh = assess(job(now_us=now, last_success_us=now - MIN), [running, *history])
    assert fresh.state == "running"
    assert fresh.stuck_after_us == 20 * S + MIN
    later = replace(running, now_us=now + 2 * MIN)
    stuck = assess(job(now_us=now + 2 * MIN, last_success_us=now - MIN), [later, *history])
    assert stuck.state == "stuck"
    assert stuck.lease_age_us == 2 * MIN + 30 * S


def test_stuck_after_set_on_the_job_wins() -> None:
    now = T0 + 60 * MIN
    running = run(T0 + 59 * MIN, "running", now_us=now)
    health = assess(
        job(now_us=now, last_success_us=now - MIN, definition_extra={"stuck_after_us": 30 * S}),
        [running],
    )
    assert health.state == "stuck"


def test_a_job_without_a_registered_schedule_is_unknown_not_ok() -> None:
    bare = replace(job(now_us=T0 + 60 * MIN), definition="{}")
    assert assess(bare, []).state == "unknown"
    failing = replace(bare, last_failure_us=T0)
    assert assess(failing, []).state == "failing"
