"""``fleetcron exec --schedule``: duplicate triggers of one slot, from any host, run once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error
from fleetcron.cli.exec import latest_slot
from fleetcron.health import assess
from fleetcron.schedules import CronSchedule, EverySchedule
from fleetcron.stores import open_store, parse_store_url

MINUTE_US = 60_000_000

RECORD = 'echo "$FLEETCRON_SLOT $FLEETCRON_ATTEMPT $FLEETCRON_FENCE" >> "$0"; sleep 1'


@CROSS_PROCESS_BACKENDS
def test_duplicate_triggers_of_a_slot_run_it_once_and_the_ledger_records_it(
    cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "ran.txt"
    argv = ("exec", "report", "--schedule", "* * * * *", "--", "sh", "-c", RECORD, str(out))
    racers = [cli.spawn(*argv) for _ in range(6)]
    results = [racer.wait(timeout=90) for racer in racers]

    assert all(result.returncode == 0 for result in results), [r.stderr for r in results]
    lines = out.read_text().splitlines()
    slots = [line.split()[0] for line in lines]
    assert lines
    assert len(slots) == len(set(slots))
    assert all(line.split()[1] == "1" for line in lines)  # first attempts
    runs = json.loads(cli.run("runs", "report", "--json").stdout)
    assert sorted(r["slot"] for r in runs) == sorted(slots)
    assert all(r["state"] == "succeeded" and r["trigger"] == "exec" for r in runs)

    again = cli.run(*argv, "--skipped-exit-code", "3")
    if again.returncode == 3:  # still the same minute: already ran, skipped
        assert out.read_text().splitlines() == lines


def test_a_failing_command_is_recorded_failed_with_its_exit_status(sqlite_cli: Cli) -> None:
    result = sqlite_cli.run("exec", "job", "--schedule", "* * * * *", "--", "sh", "-c", "exit 7")
    assert result.returncode == 7
    (run,) = json.loads(sqlite_cli.run("runs", "--json").stdout)
    assert (run["state"], run["exit_code"], run["error"]) == ("failed", 7, "exit status 7")


def test_bad_schedules_are_refused_before_the_store_is_touched(sqlite_cli: Cli) -> None:
    db = Path(sqlite_cli.backend.removeprefix("sqlite:///"))
    bad = [
        (("--schedule", "*/5 * * 13 *"), "field 'month' value 13"),
        (("--schedule", "* * * * *", "--timezone", "Mars/Base"), "unknown time zone"),
        (("--timezone", "UTC"), "--timezone needs --schedule"),
        (("--grace", "10m"), "--grace needs --schedule"),
        (("--stuck-after", "1h"), "--stuck-after needs --schedule"),
        (("--schedule", "* * * * *", "--grace", "-5m"), "--grace must be positive"),
        (("--schedule", "* * * * *", "--stuck-after", "0s"), "--stuck-after must be positive"),
    ]
    for options, message in bad:
        result = sqlite_cli.run("exec", "job", *options, "--", "true")
        assert_clean_error(result, 2, message)
    assert not db.exists()


def test_the_slot_is_the_latest_one_the_clock_has_reached() -> None:
    hourly = CronSchedule("0 * * * *", "UTC")
    ten_past = 1_795_960_000_000_000 - 1_795_960_000_000_000 % 3_600_000_000 + 600_000_000
    assert latest_slot(hourly, ten_past) == ten_past - 600_000_000
    assert latest_slot(hourly, ten_past - 600_000_000) == ten_past - 600_000_000  # at the slot
    assert latest_slot(EverySchedule(7_000_000), 70_000_001) == 70_000_000
    yearly = CronSchedule("0 0 1 1 *", "UTC")
    assert latest_slot(yearly, ten_past) is not None


def _status_of(cli: Cli, job: str) -> dict[str, Any]:
    result = cli.run("status", "--json", job)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["jobs"]
    assert isinstance(row, dict)
    return row


@CROSS_PROCESS_BACKENDS
def test_an_exec_job_is_registered_judged_by_its_schedule_and_a_redefinition_is_loud(
    cli: Cli,
) -> None:
    first = cli.run(
        "exec", "report", "--schedule", "*/5 * * * *", "--grace", "10m",
        "--stuck-after", "1h", "--", "true",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "job_definition_conflict" not in first.stderr
    assert "replaced" not in first.stderr  # nothing registered before: nothing to say

    shown = _status_of(cli, "report")
    assert shown["schedule"] == "cron '*/5 * * * *' in UTC"
    assert shown["timezone"] == "UTC"
    assert shown["state"] == "ok"
    assert shown["next_slot"] is not None
    assert shown["grace_s"] == 600

    store = open_store(parse_store_url(cli.backend))
    try:
        row = store.run(store.ops.job_get(cli.namespace, "report"))
        runs = store.run(store.ops.run_list(cli.namespace, "report", 50))
    finally:
        store.close()
    assert row is not None
    (run,) = runs
    assert row.last_success_us is not None
    # The dead man's switch on the stored row, at crafted times of the store's clock: the
    # next slot (run.slot + 5m) has until +10m (--grace, not the default one interval).
    in_grace = assess(replace(row, now_us=run.slot_us + 15 * MINUTE_US - 1), runs)
    assert in_grace.state == "ok", in_grace.reasons
    late = assess(replace(row, now_us=row.last_success_us + 30 * MINUTE_US), runs)
    assert late.state == "overdue", late.reasons
    assert late.expected_slot_us is not None
    assert late.expected_slot_us > row.last_success_us
    assert late.stuck_after_us == 60 * MINUTE_US  # --stuck-after, not the p95 default

    # Another crontab line defines the job differently: its run replaces the definition
    # and says so at the default level, naming the one it replaced.
    second = cli.run("exec", "report", "--schedule", "* * * * *", "--", "sh", "-c", "exit 0")
    assert second.returncode == 0, second.stderr
    assert (
        f"replaced a different one (cron '*/5 * * * *' in UTC, {row.fingerprint[:12]}; "
        "differs in: command, grace, schedule, stuck_after)"
    ) in second.stderr
    assert _status_of(cli, "report")["schedule"] == "cron '* * * * *' in UTC"
