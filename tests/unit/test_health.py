"""The dead man's switch: a job's health from its store row and ledger alone."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from fleetcron.health import MIN_GRACE_US, assess, expected_slot, row_state
from fleetcron.models import TRIGGERS, JobRecord, RunRecord
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


def test_backfilled_rows_do_not_date_a_new_job_back_to_their_slots() -> None:
    # Registered 22 minutes ago, every hour with a 10 minute grace; then three days of
    # past slots were backfilled: queued, one of them already run. The job was first
    # seen at its registration, not at the oldest backfilled slot.
    now = T0 + 22 * MIN
    hour = 60 * MIN
    backfilled = [
        replace(run(T0 - k * hour, "queued" if k > 48 else "succeeded"), trigger="backfill")
        for k in range(48, 72 + 1)
    ]
    triggered = [replace(run(T0 - 80 * hour, "succeeded"), trigger="manual")]
    row = job(every_us=hour, grace_us=10 * MIN, updated_us=now - MIN, now_us=now,
              last_success_us=now - 30 * S)  # fmt: skip
    for ledger in (backfilled, backfilled + triggered):
        health = assess(row, ledger)
        assert (health.state, health.expected_slot_us) == ("ok", None)
        never_ran = replace(row, last_success_us=None)
        assert assess(never_ran, ledger).state == "ok"
    # A slot the scheduler recorded still counts: the job was there days ago.
    missed = sorted([run(T0 - 50 * hour, "missed"), *backfilled], key=lambda r: -r.slot_us)
    assert assess(replace(row, last_success_us=None), missed).state == "overdue"


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


def test_the_row_alone_tells_the_state_of_a_job_that_succeeded_before() -> None:
    now = T0 + 60 * MIN
    healthy = job(now_us=now, last_success_us=now - 2 * MIN, high_water_us=now - 5 * MIN)
    assert row_state(healthy) == "ok"
    late = job(now_us=now, last_success_us=T0 + 2 * S, high_water_us=T0)
    assert row_state(late) == "overdue"
    failed = job(now_us=now, last_success_us=now - 4 * MIN, last_failure_us=now - 2 * MIN)
    assert row_state(failed) == "failing"
    assert row_state(replace(late, paused=True)) == "paused"
    assert row_state(replace(late, definition="{}")) == "unknown"
    never = job(now_us=now, last_failure_us=now - MIN)
    assert row_state(never) is None, "first seen depends on the ledger's oldest rows"


_SCHEDULES = [
    {"kind": "every", "every_us": 30 * S},
    {"kind": "every", "every_us": 5 * MIN},
    {"kind": "every", "every_us": 60 * MIN},
    {"kind": "cron", "expression": "*/10 * * * *", "timezone": "UTC"},
    {"kind": "cron", "expression": "30 2 * * *", "timezone": "Europe/Berlin"},
    {"kind": "cron", "expression": "0 9 * * 1-5", "timezone": "America/New_York"},
]
# Around T0, and around the night Berlin's clocks go forward (2027-03-28).
_NOWS = [T0, 1_806_195_600 * S]


@st.composite
def _rows_and_ledgers(draw: st.DrawFn) -> tuple[JobRecord, list[RunRecord], int]:
    now = draw(st.sampled_from(_NOWS)) + draw(st.integers(0, 3 * 24 * 3600)) * S

    def moment() -> int | None:  # often within the last hours, when most verdicts turn
        back = st.sampled_from([3 * MIN, 2 * 3600 * S, 3 * 24 * 3600 * S])
        return draw(st.one_of(st.none(), back.flatmap(lambda b: st.integers(now - b, now))))

    definition: dict[str, object] = {
        "schedule": draw(st.sampled_from(_SCHEDULES)),
        "grace_us": draw(st.sampled_from([None, 30 * S, 2 * MIN, 90 * MIN])),
    }
    row = JobRecord(
        namespace="ns",
        job="report",
        paused=draw(st.integers(0, 9)) == 0,
        definition=json.dumps(definition) if draw(st.integers(0, 9)) else "{}",
        fingerprint="f" * 32,
        high_water_us=moment(),
        last_success_us=moment(),
        last_failure_us=moment(),
        updated_us=draw(st.integers(now - 4 * 24 * 3600 * S, now)),
        now_us=now,
    )
    slots = sorted(
        draw(st.sets(st.integers(now - 5 * 24 * 3600 * S, now), max_size=8)), reverse=True
    )
    states = ["succeeded", "failed", "skipped", "missed", "lost", "queued", "running"]
    ledger = []
    for slot in slots:
        made = run(slot, draw(st.sampled_from(states)), now_us=now)
        made = replace(made, trigger=draw(st.sampled_from(TRIGGERS)))
        if made.state == "running":  # a run whose holder vanished: its lease expired
            made = replace(made, expires_us=now - draw(st.integers(0, 60)) * S)
        ledger.append(made)
    return row, ledger, now + draw(st.integers(0, 5)) * S


@settings(max_examples=400, deadline=None)
@given(_rows_and_ledgers())
def test_the_state_from_the_row_is_the_state_assess_gives_while_no_run_holds_the_job(
    case: tuple[JobRecord, list[RunRecord], int],
) -> None:
    row, ledger, now = case
    state = row_state(row, now_us=now)
    whole = assess(row, ledger, now_us=now)
    event(f"{state} / {whole.state}")
    if state is None:
        assert row.last_success_us is None
        assert not row.paused
        assert row.definition != "{}"
    else:
        assert state == whole.state
