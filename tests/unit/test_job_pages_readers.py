"""The readers of every job row of a namespace hold one page of rows at a time, without
the definitions where they read only progress or signs of life: the retention pass's
orphan report, ``fleetcron prune``, a standby following the leader, the CLI's count."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fleetcron.job_options import job_spec
from fleetcron.models import JobRecord
from fleetcron.scheduling.definitions import Definitions
from fleetcron.scheduling.leadership import follow_leader
from fleetcron.scheduling.planning import PlannedJob
from fleetcron.scheduling.retention import Pruner, prune_jobs_plan, prune_runs_plan, run_plan
from fleetcron.stores import job_pages
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import MemoryStore
from fleetcron.testing import FakeClock
from unit.fakes import Recorded

NS = "pages"
PAGE = 40
JOBS = 250  # six pages and a short one
T0 = 1_800_000_000_000_000
DAY_S = 86_400
LISTINGS = ("job_list", "job_page")


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_pages, "JOB_PAGE", PAGE)


def fleet() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(wall_us=T0)
    store = MemoryStore(clock=clock)
    definition = '{"retention_keep": 5, "pad": "' + "x" * 400 + '"}'
    jobs = [(f"job-{i:04d}", definition, f"fp{i}") for i in range(JOBS)]
    store.run(store.ops.job_register(NS, jobs))
    return store, clock


def listed(answers: dict[str, list[Any]]) -> list[list[JobRecord]]:
    return [rows for name in LISTINGS for rows in answers.get(name, [])]


class RecordingSync:
    """A sync store's ``run`` that notes each listing's answer."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.answers: dict[str, list[Any]] = {}

    def run(self, operation: Operation[Any]) -> Any:
        name = getattr(operation, "__name__", "")
        result = self.store.run(operation)
        self.answers.setdefault(name, []).append(result)
        return result


async def test_the_orphan_report_reads_a_page_of_rows_at_a_time_without_definitions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = fleet()
    clock.advance(8 * DAY_S)
    recorded = Recorded(store)
    specs = {"job-0000": job_spec("job-0000", where="t", every="1m", command=["true"])}

    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        await Pruner(recorded, NS, specs).prune()

    pages = listed(recorded.answers)
    assert max(len(rows) for rows in pages) <= PAGE
    assert all(row.definition == "" for rows in pages for row in rows)
    said = [r for r in caplog.records if getattr(r, "action", "") == "job_orphaned"]
    orphans = [getattr(r, "job", "") for r in said]
    assert orphans == [f"job-{i:04d}" for i in range(1, JOBS)]


async def test_a_standby_follows_the_leader_a_page_at_a_time() -> None:
    store, _clock = fleet()
    for i in range(0, JOBS, 7):
        store.run(
            store.ops.run_record(NS, f"job-{i:04d}", T0 - 10_000 + i, "skipped", None, "schedule")
        )
    recorded = Recorded(store)
    specs = [job_spec(f"job-{i:04d}", where="t", every="1m", command=["true"]) for i in range(JOBS)]
    jobs = {spec.name: PlannedJob(spec=spec, cursor_us=T0 - 20_000) for spec in specs}
    definitions = Definitions({spec.name: f"fp{i}" for i, spec in enumerate(specs)})

    await follow_leader(recorded, NS, jobs, definitions)

    pages = listed(recorded.answers)
    assert max(len(rows) for rows in pages) <= PAGE
    assert all(row.definition == "" for rows in pages for row in rows)
    moved = {name for name, job in jobs.items() if job.cursor_us != T0 - 20_000}
    assert moved == {f"job-{i:04d}" for i in range(0, JOBS, 7)}
    assert all(jobs[name].cursor_us == T0 - 10_000 + int(name[4:]) for name in moved)


def test_prune_reads_the_job_rows_a_page_at_a_time() -> None:
    store, clock = fleet()
    clock.advance(8 * DAY_S)
    recording = RecordingSync(store)

    orphans = run_plan(prune_jobs_plan(store.ops, NS, 7 * DAY_S * 10**6), recording)  # type: ignore[arg-type]
    pruned = run_plan(prune_runs_plan(store.ops, NS), recording)  # type: ignore[arg-type]

    assert len(orphans) == JOBS
    assert pruned == {}
    pages = listed(recording.answers)
    assert len(pages) > JOBS // PAGE, "every job listed, a page at a time"
    assert max(len(rows) for rows in pages) <= PAGE


def test_prune_of_runs_reads_each_jobs_own_rule_from_its_page() -> None:
    store, clock = fleet()
    for _ in range(8):
        clock.advance(60)
        store.run(
            store.ops.run_record(NS, "job-0249", clock.wall_us(), "skipped", None, "schedule")
        )
    clock.advance(40 * DAY_S)
    recording = RecordingSync(store)

    pruned = run_plan(prune_runs_plan(store.ops, NS), recording)  # type: ignore[arg-type]

    assert pruned == {"job-0249": 3}, "its registered retention_keep of 5"
    assert max(len(rows) for rows in listed(recording.answers)) <= PAGE
