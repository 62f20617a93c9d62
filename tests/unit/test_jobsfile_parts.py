"""A large jobs file is parsed a part at a time, with its jobs sharing equal values, and
reads exactly as the whole document would, errors included."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetcron import toml_parts
from fleetcron.errors import ConfigurationError
from fleetcron.jobsfile import JobsFile, load_jobs_file
from fleetcron.jobspec import CommandTarget
from fleetcron.schedules import from_datetime

NOW = from_datetime(datetime(2025, 1, 1, tzinfo=UTC))
JOBS = 2_000


def jobs_text(count: int, *, first: int = 0) -> str:
    return "".join(
        f'[jobs."report-{i}"]\nschedule = "{i % 60} {i % 24} * * *"\n'
        f'timezone = "Europe/Berlin"\ncommand = ["/usr/bin/report", "--shard", "{i % 7}"]\n'
        'lock_at_most = "20m"\n\n'
        for i in range(first, first + count)
    )


def load(tmp_path: Path, text: str) -> JobsFile:
    path = tmp_path / "jobs.toml"
    path.write_text(text, "utf-8")
    return load_jobs_file(path, now_us=NOW)


def whole(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> JobsFile:
    """The file read as one document, as before parts existed."""
    with monkeypatch.context() as patched:

        def unsplittable(*args: Any, **kwargs: Any) -> Any:
            raise toml_parts.Unsplittable("read whole")
            yield  # a generator, as parts() is

        patched.setattr("fleetcron.jobsfile.parts", unsplittable)
        return load(tmp_path, text)


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of job tables in each document tomllib parses."""
    sizes: list[int] = []
    loads: Callable[..., dict[str, Any]] = tomllib.loads

    def counting(text: str, **kwargs: Any) -> dict[str, Any]:
        document = loads(text, **kwargs)
        jobs = document.get("jobs")
        sizes.append(len(jobs) if isinstance(jobs, dict) else 0)
        return document

    monkeypatch.setattr(tomllib, "loads", counting)
    return sizes


def test_no_parse_holds_more_than_one_part_of_a_large_file(
    tmp_path: Path, parsed: list[int]
) -> None:
    loaded = load(tmp_path, '[fleetcron]\nnamespace = "big"\n\n' + jobs_text(JOBS))

    assert len(loaded.jobs) == JOBS
    assert loaded.namespace == "big"
    assert max(parsed) <= toml_parts.TABLES_PER_PART
    assert sum(parsed) == JOBS


def test_jobs_share_their_equal_values(tmp_path: Path) -> None:
    loaded = load(tmp_path, jobs_text(JOBS))
    first, other = loaded.jobs[0], loaded.jobs[840]  # the same cron line and command
    second = loaded.jobs[1].target
    assert isinstance(first.target, CommandTarget)
    assert isinstance(second, CommandTarget)

    assert first.schedule is other.schedule
    assert first.timezone is other.timezone
    assert first.lock_at_most_us is other.lock_at_most_us
    assert first.catchup_window_us is other.catchup_window_us
    assert first.target is other.target  # the same argv
    assert first.target.argv[0] is second.argv[0]
    assert first.name != other.name


def test_a_file_read_in_parts_reads_as_the_whole_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(toml_parts, "TABLES_PER_PART", 3)
    text = (
        '[fleetcron]\nnamespace = "n"\nretention = "2d"\n\n'
        + jobs_text(10)
        + '[jobs."with.sub"]\nevery = "1m"\ncall = "os:getpid"\n\n'
        + '[queues.mail]\ncall = "os:getpid"\n'
    )

    in_parts, read_whole = load(tmp_path, text), whole(tmp_path, text, monkeypatch)

    assert in_parts == read_whole
    assert [q.name for q in in_parts.queues] == ["mail"]
    assert all(job.retention_us == 2 * 86_400_000_000 for job in in_parts.jobs)


@pytest.mark.parametrize(
    "tail",
    [
        # [fleetcron] after the jobs: its settings are every job's all the same
        '[fleetcron]\nretention = "1d"\n',
        # the super-table defined explicitly after its sub-tables
        '[jobs]\n"late" = { every = "1m", command = ["true"] }\n',
        # a line inside a multi-line string that looks like a header
        '[jobs.text]\nevery = "1m"\ncommand = ["echo", """\n[jobs.not-a-header]\n"""]\n',
        # a sub-table of a job of another part
        '[jobs."report-1".extra]\nx = 1\n',
    ],
)
def test_what_parts_cannot_read_alike_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str
) -> None:
    monkeypatch.setattr(toml_parts, "TABLES_PER_PART", 3)
    text = jobs_text(10) + tail

    def outcome(read: Callable[[], JobsFile]) -> object:
        try:
            return read()
        except ConfigurationError as exc:
            return exc.message

    in_parts = outcome(lambda: load(tmp_path, text))
    assert in_parts == outcome(lambda: whole(tmp_path, text, monkeypatch))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (jobs_text(10) + jobs_text(1, first=2), "job 'report-2' is defined twice"),
        ('jobs = { a = { every = "1m", command = ["true"] } }\n' + jobs_text(10), "'report-0'"),
        (jobs_text(10) + "[[jobs.report-x]]\nevery = 1\n", "report-x"),
        (jobs_text(10) + '[surprise]\nkey = "value"\n', "unknown top-level key 'surprise'"),
        (jobs_text(10) + "[jobs.broken\n", "invalid TOML"),
        ('[jobs.early]\nevery = "1m"\n' + jobs_text(10) + "[jobs.broken\n", "invalid TOML"),
        ('[jobs.early]\nevery = "1m"\n' + jobs_text(10) + "[odd]\nx = 1\n", "'odd'"),
        (jobs_text(10) + '[fleetcron]\nmode = "odd"\n[jobs.late]\nevery = "1m"\n', "'mode'"),
    ],
)
def test_a_mistake_across_parts_is_the_whole_documents_mistake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    monkeypatch.setattr(toml_parts, "TABLES_PER_PART", 3)
    with pytest.raises(ConfigurationError) as in_parts:
        load(tmp_path, text)
    with pytest.raises(ConfigurationError) as read_whole:
        whole(tmp_path, text, monkeypatch)

    assert in_parts.value.message == read_whole.value.message
    assert expected in in_parts.value.message
