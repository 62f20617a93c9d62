"""``fleetcron runs`` rows: what a user reads of a ledger row."""

from __future__ import annotations

from fleetcron.cli.scheduler_cmds import _row
from fleetcron.models import RunRecord

T = 1_796_400_000_000_000  # 2026-12-04T16:00:00Z, a whole second


def _run(slot_us: int, trigger: str) -> RunRecord:
    return RunRecord(
        namespace="ns",
        job="report",
        slot_us=slot_us,
        state="queued",
        attempt=0,
        fence=0,
        holder="",
        run_id="r",
        trigger=trigger,
        started_us=None,
        finished_us=None,
        expires_us=None,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=None,
        output=None,
        now_us=T,
    )


def test_two_triggers_in_one_second_show_as_two_slots() -> None:
    first, second = _row(_run(T + 120_001, "manual")), _row(_run(T + 480_500, "manual"))

    assert first["slot"] == "2026-12-04T16:00:00.120001Z"
    assert second["slot"] == "2026-12-04T16:00:00.480500Z"


def test_a_scheduled_slot_on_a_whole_second_shows_no_fraction() -> None:
    assert _row(_run(T, "schedule"))["slot"] == "2026-12-04T16:00:00Z"
