"""Input that once was taken and quietly meant something else is refused: one line on
stderr naming what is wrong and where (the URL redacted), exit 2, and nothing touched —
no SQLite file, no command started."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.helpers import Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_USAGE


@pytest.mark.parametrize("every", ["١٠s", "１０s"])
def test_a_jobs_file_duration_in_digits_other_than_ascii_is_refused(
    sqlite_cli: Cli, tmp_path: Path, every: str
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[jobs.tick]\nevery = "{every}"\ncommand = ["true"]\n', encoding="utf-8")

    result = sqlite_cli.run("run", str(jobs), timeout=20)

    assert_clean_error(
        result, EXIT_USAGE, "job 'tick'", "'every'", repr(every), "write the digits as ASCII 0-9"
    )
    assert not (tmp_path / "fleetcron.db").exists()


def test_an_exec_duration_in_digits_other_than_ascii_is_refused(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"

    result = sqlite_cli.run("exec", "job", "--lock-at-most", "١٠m", "--", "touch", str(marker))

    assert_clean_error(result, EXIT_USAGE, "--lock-at-most", "write the digits as ASCII 0-9")
    assert not marker.exists()
    assert not (tmp_path / "fleetcron.db").exists()
