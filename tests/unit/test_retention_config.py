"""The ``retention`` and ``retention_keep`` keys: in ``[fleetcron]`` for every job, per job
to override, validated at load with the file and key named, and part of a job's definition
only when set."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.jobsfile import load_jobs_file
from fleetcron.jobspec import DEFAULT_RETENTION, Retention
from fleetcron.models import JobRecord
from fleetcron.schedules import from_datetime
from fleetcron.scheduling.retention import manual_rule, registered_retention

HOUR = 3_600_000_000
DAY = 24 * HOUR
NOW = from_datetime(datetime(2025, 1, 1, tzinfo=UTC))
JOB = 'every = "5m"\ncommand = ["true"]\n'


def load(tmp_path: Path, text: str) -> dict[str, Retention]:
    path = tmp_path / "jobs.toml"
    path.write_text(text, "utf-8")
    return {spec.name: spec.retention for spec in load_jobs_file(path, now_us=NOW).jobs}


def load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "jobs.toml"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigurationError) as caught:
        load_jobs_file(path, now_us=NOW)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    return message


def test_without_retention_keys_every_job_keeps_30_days_and_the_newest_100(
    tmp_path: Path,
) -> None:
    assert load(tmp_path, f"[jobs.a]\n{JOB}") == {"a": Retention(30 * DAY, 100)}
    assert DEFAULT_RETENTION == Retention(older_than_us=30 * DAY, keep=100)


def test_the_fleetcron_table_sets_every_job_and_a_job_overrides_each_part(
    tmp_path: Path,
) -> None:
    rules = load(
        tmp_path,
        f"""
[fleetcron]
retention = "7d"
retention_keep = 20

[jobs.plain]
{JOB}
[jobs.longer]
{JOB}retention = "90d"

[jobs.fewer]
{JOB}retention_keep = 0

[jobs.own]
{JOB}retention = "1h"
retention_keep = 5
""",
    )

    assert rules == {
        "plain": Retention(7 * DAY, 20),
        "longer": Retention(90 * DAY, 20),
        "fewer": Retention(7 * DAY, 0),
        "own": Retention(HOUR, 5),
    }


def test_one_part_in_the_table_leaves_the_other_at_its_default(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(f"[fleetcron]\nretention_keep = 3\n\n[jobs.a]\n{JOB}", "utf-8")

    loaded = load_jobs_file(path, now_us=NOW)

    assert loaded.jobs[0].retention == Retention(30 * DAY, 3)
    assert (loaded.retention_us, loaded.retention_keep) == (None, 3)


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('retention = "-1d"', "[fleetcron]: key 'retention': negative duration '-1d'"),
        ("retention = 30", "[fleetcron]: key 'retention': 30 is not a duration"),
        ('retention = "a month"', "[fleetcron]: key 'retention': 'a month' is not a duration"),
        ("retention_keep = -1", "[fleetcron]: key 'retention_keep': must be at least 0, got -1"),
        ('retention_keep = "100"', "[fleetcron]: key 'retention_keep': must be an integer"),
        ("retention_keep = true", "[fleetcron]: key 'retention_keep': must be an integer"),
        ("retention_keep = 1.5", "[fleetcron]: key 'retention_keep': must be an integer"),
    ],
)
def test_bad_table_values_are_refused_naming_the_file_and_the_key(
    tmp_path: Path, table: str, fragment: str
) -> None:
    message = load_error(tmp_path, f"[fleetcron]\n{table}\n\n[jobs.a]\n{JOB}")
    assert fragment in message, message


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        ('retention = "-5m"', "job 'a': key 'retention': negative duration '-5m'"),
        ('retention = ""', "job 'a': key 'retention': '' is not a duration"),
        ("retention_keep = -3", "job 'a': key 'retention_keep': must be at least 0, got -3"),
        ('retention_keep = "all"', "job 'a': key 'retention_keep': must be an integer"),
    ],
)
def test_bad_job_values_are_refused_naming_the_file_the_job_and_the_key(
    tmp_path: Path, key: str, fragment: str
) -> None:
    message = load_error(tmp_path, f"[jobs.a]\n{JOB}{key}\n")
    assert fragment in message, message


def test_a_good_table_value_does_not_excuse_a_bad_job_value(tmp_path: Path) -> None:
    message = load_error(
        tmp_path, f'[fleetcron]\nretention = "7d"\n\n[jobs.a]\n{JOB}retention = "-7d"\n'
    )
    assert "job 'a': key 'retention'" in message


def test_a_job_without_retention_keeps_the_fingerprint_it_had_before_the_keys_existed() -> None:
    plain = job_spec("report", where="t", every="5m", command=["true"], now_us=NOW)

    assert "retention_us" not in plain.definition()
    assert "retention_keep" not in plain.definition()
    # The fingerprint of this very job as computed before retention existed.
    assert plain.fingerprint() == "d58baaaf19faf0f6f78098171d964313"


def test_a_job_that_sets_retention_has_it_in_its_definition_and_fingerprint() -> None:
    plain = job_spec("report", where="t", every="5m", command=["true"], now_us=NOW)
    kept = job_spec("report", where="t", every="5m", command=["true"], retention_keep=7, now_us=NOW)
    aged = job_spec("report", where="t", every="5m", command=["true"], retention="2d", now_us=NOW)

    assert kept.definition()["retention_keep"] == 7
    assert "retention_us" not in kept.definition()
    assert aged.definition()["retention_us"] == 2 * DAY
    assert len({plain.fingerprint(), kept.fingerprint(), aged.fingerprint()}) == 3


def test_python_values_are_accepted_and_checked() -> None:
    spec = job_spec(
        "report",
        where="Fleet.job",
        every="5m",
        command=["true"],
        retention=timedelta(hours=6),
        retention_keep=10,
        now_us=NOW,
    )
    assert spec.retention == Retention(6 * HOUR, 10)
    with pytest.raises(ConfigurationError, match=r"Fleet\.job: job 'x': key 'retention_keep'"):
        job_spec("x", where="Fleet.job", every="5m", command=["true"], retention_keep=-1)
    with pytest.raises(ConfigurationError, match="key 'retention': negative duration"):
        job_spec("x", where="Fleet.job", every="5m", command=["true"], retention=-60)


def _row(definition: str) -> JobRecord:
    return JobRecord(
        namespace="ns",
        job="j",
        paused=False,
        definition=definition,
        fingerprint="fp",
        high_water_us=None,
        last_success_us=None,
        last_failure_us=None,
        updated_us=NOW,
        now_us=NOW,
    )


def test_the_registered_definition_carries_the_rule_to_replicas_and_the_cli() -> None:
    spec = job_spec("j", where="t", every="5m", command=["true"], retention="1d", retention_keep=4)
    stored = json.dumps(spec.definition(), sort_keys=True)

    assert registered_retention(_row(stored)) == Retention(DAY, 4)
    assert registered_retention(_row('{"retention_keep": 9}')) == Retention(30 * DAY, 9)
    assert registered_retention(_row("{}")) == DEFAULT_RETENTION
    assert registered_retention(_row("not json")) == DEFAULT_RETENTION
    assert registered_retention(_row('{"retention_us": -1, "retention_keep": true}')) == (
        DEFAULT_RETENTION
    )


def test_a_rule_given_by_hand_replaces_the_parts_given_and_refuses_bad_ones() -> None:
    base = Retention(DAY, 4)

    assert manual_rule(base, None, None) == base
    assert manual_rule(base, "0s", None) == Retention(0, 4)
    assert manual_rule(base, "2h", 0) == Retention(2 * HOUR, 0)
    with pytest.raises(ConfigurationError, match="older_than must not be negative"):
        manual_rule(base, "-1d", None)
    with pytest.raises(ConfigurationError, match="keep must be an integer, 0 or more"):
        manual_rule(base, None, -1)
    with pytest.raises(ConfigurationError, match="not a duration"):
        manual_rule(base, "soon", None)
