"""The help a user reads: every option that has a default says it, and every usage line
names every option."""

from __future__ import annotations

import pytest

from fleetcron.cli.main import build_parser


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_exec_says_what_lock_at_most_and_lock_at_least_do_and_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys, "exec")

    assert "--lock-at-most D the lease's length" in text
    assert "(default 10m)" in text
    assert "--lock-at-least D hold the lease at least D after the start" in text
    assert "(default 0s)" in text


def test_run_says_its_default_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    assert "runs in flight on this replica (default 16)" in _help(capsys, "run")


def test_the_usage_of_next_names_after_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "next")

    assert text.startswith(
        "usage: fleetcron next CRON [--timezone TZ] [--count N] [--after TIME] [--json]"
    )
