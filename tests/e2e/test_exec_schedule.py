"""``fleetcron exec --schedule``: duplicate triggers of one slot, from any host, run once."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error
from fleetcron.cli.exec import latest_slot
from fleetcron.schedules import CronSchedule, EverySchedule

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
    db = Path(sqlite_cli.backend.removeprefix("sqlite://"))
    bad = [
        (("--schedule", "*/5 * * 13 *"), "field 'month' value 13"),
        (("--schedule", "* * * * *", "--timezone", "Mars/Base"), "unknown time zone"),
        (("--timezone", "UTC"), "--timezone needs --schedule"),
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
