from __future__ import annotations

import argparse
import json

import pytest

from fleetcron.cli import next_cmd
from fleetcron.errors import ConfigurationError


def parse(*arguments: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetcron")
    commands = parser.add_subparsers(dest="command")
    next_cmd.add_parser(commands, [])
    return parser.parse_args(["next", *arguments])


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> list[str]:
    assert next_cmd.run(parse(*arguments)) == 0
    return capsys.readouterr().out.splitlines()


def test_next_prints_one_line_per_fire_time_with_utc_and_local_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = run(
        capsys,
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--after",
        "2025-03-29T00:00",
        "--count",
        "3",
    )

    assert len(lines) == 3
    assert lines[0] == "2025-03-29T01:30:00Z  2025-03-29 02:30:00+01:00 CET"
    assert lines[1].startswith("2025-03-30T01:00:00Z  2025-03-30 03:00:00+02:00 CEST  DST gap")
    assert "02:30 does not exist; runs at 03:00 instead" in lines[1]
    assert lines[2] == "2025-03-31T00:30:00Z  2025-03-31 02:30:00+02:00 CEST"


def test_next_marks_the_repeated_hour(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(
        capsys,
        "0 * * * *",
        "--timezone",
        "America/New_York",
        "--after",
        "2025-11-02T00:30:00-04:00",
        "--count",
        "3",
    )

    assert "runs at both, this is the first" in lines[0]
    assert "second occurrence" in lines[1]
    assert "EDT" in lines[0]
    assert "EST" in lines[1]
    assert lines[2] == "2025-11-02T07:00:00Z  2025-11-02 02:00:00-05:00 EST"


def test_next_accepts_the_fields_as_separate_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    quoted = run(capsys, "*/15 * * * *", "--after", "2025-01-01T00:00:00Z")
    split = run(capsys, "*/15", "*", "*", "*", "*", "--after", "2025-01-01T00:00:00Z")

    assert quoted == split
    assert len(quoted) == next_cmd.DEFAULT_COUNT
    assert quoted[0].startswith("2025-01-01T00:15:00Z  2025-01-01 00:15:00+00:00 UTC")


def test_next_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(
        capsys,
        "0 0 * * *",
        "--timezone",
        "America/Santiago",
        "--after",
        "2025-09-06T12:00",
        "--count",
        "2",
        "--json",
    )

    rows = json.loads("\n".join(lines))
    assert [row["slot"] for row in rows] == ["2025-09-07T04:00:00Z", "2025-09-08T03:00:00Z"]
    assert rows[0]["local"] == "2025-09-07T01:00:00-03:00"
    assert rows[0]["dst"] == "gap-shifted"
    assert rows[1]["dst"] is None
    assert rows[1]["note"] is None


def test_next_without_after_starts_from_now(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(run(capsys, "* * * * *", "--count", "2")) == 2


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (("0 25 * * *",), "field 'hour' value 25 out of range"),
        (("* * * * *", "--timezone", "Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (("* * * * *", "--count", "0"), "--count must be between 1 and 1000"),
        (("* * * * *", "--count", "1001"), "--count must be between 1 and 1000"),
        (("* * * * *", "--after", "yesterday"), "--after: 'yesterday' is not an ISO 8601"),
    ],
)
def test_next_rejects_bad_input_with_a_configuration_error(
    arguments: tuple[str, ...], fragment: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        next_cmd.run(parse(*arguments))
    assert fragment in caught.value.message
