"""A paged status read: the dashboard's job list, worst first, a page at a time, with every
job counted by state — and a cost that follows the page, not the size of the fleet."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetcron.health import JobHealth
from fleetcron.models import RunFinish, RunOutcome, RunRecord, SlotClaim
from fleetcron.status import ORDER, FleetStatus, Page, read_status, status_json
from fleetcron.stores import SyncStore, open_store, parse_store_url
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import MemoryStore
from fleetcron.stores.sql.statements import Query, QueryBatch, SqlResult
from fleetcron.stores.statements import Statement
from fleetcron.testing import FakeClock

NS = "pages"
S = 1_000_000
MIN = 60 * S
HOUR = 60 * MIN
T0 = 1_800_000_000 * S  # on an hour boundary
HOLDER = "host-a:17:secret"


def _definition(**extra: int) -> str:
    schedule = {"kind": "every", "every_us": HOUR}
    return json.dumps({"schedule": schedule, "timezone": "UTC", **extra})


def _claim(store: SyncStore, job: str, slot_us: int, ttl_us: int = HOUR) -> RunRecord:
    claim = SlotClaim(job=job, slot_us=slot_us, run_id=f"{job}-{slot_us}", exclusive=False)
    [answer] = store.run(store.ops.run_claim(NS, [claim], HOLDER, ttl_us))
    assert answer.run is not None, answer
    return answer.run


def _finish(store: SyncStore, run: RunRecord, state: str = "succeeded") -> None:
    outcome = RunOutcome(state=state, output="a tail of output\n" * 20)
    assert store.run(store.ops.run_finish(NS, run.job, run.slot_us, run.fence, outcome))


OKS = [f"ok-{index:02d}" for index in range(12)]
# Worst first, then by name: what every read of the fleet below must list.
EXPECTED = [
    ("late", "overdue"),
    ("never", "overdue"),
    ("hung", "stuck"),
    ("broken", "failing"),
    ("bare", "unknown"),
    ("busy", "running"),
    *((name, "ok") for name in OKS),
    ("idle", "paused"),
]


@pytest.fixture
def store() -> MemoryStore:
    """One job in each state, and twelve that are fine, at T0 + 30 min."""
    clock = FakeClock(wall_us=T0 - 2 * HOUR)
    store = MemoryStore(clock=clock)
    jobs = [name for name, _ in EXPECTED if name != "bare"]
    rows = [(name, _definition(), "f" * 32) for name in jobs if name != "hung"]
    rows += [("hung", _definition(stuck_after_us=MIN), "f" * 32), ("bare", "{}", "0" * 32)]
    store.run(store.ops.job_register(NS, rows))
    _finish(store, _claim(store, "late", T0 - 2 * HOUR))  # and never again: overdue
    clock.advance(2 * 3600 + 60)  # T0 + 1 min: the hour's slot runs
    for name in [*OKS, "broken", "busy", "hung", "idle"]:
        _finish(store, _claim(store, name, T0))
    _finish(store, _claim(store, "never", T0), "failed")  # never succeeded: overdue
    store.run(store.ops.job_set_paused(NS, "idle", True))
    clock.advance(4 * 60)
    _claim(store, "hung", T0 + 5 * MIN)  # held 25 min, stuck after 1 min
    clock.advance(5 * 60)
    _finish(store, _claim(store, "broken", T0 + 10 * MIN), "failed")
    clock.advance(15 * 60)
    _claim(store, "busy", T0 + 25 * MIN)  # held 5 min
    clock.advance(5 * 60)
    return store


def _page(store: SyncStore, **asked: Any) -> FleetStatus:
    return store.run(read_status(store.ops, NS, page=Page(**asked)))


def test_the_whole_fleet_is_worst_first_then_by_name(store: MemoryStore) -> None:
    whole = store.run(read_status(store.ops, NS))
    assert [(h.job, h.state) for h in whole.jobs] == EXPECTED
    assert whole.page is None
    assert whole.matched == whole.total == len(EXPECTED)
    assert whole.totals == {state: sum(s == state for _, s in EXPECTED) for state in ORDER}
    assert list(whole.totals) == list(ORDER)


@pytest.mark.parametrize("limit", [1, 4, 7, 50])
def test_pages_cut_the_whole_list_where_it_stands_and_count_every_job(
    store: MemoryStore, limit: int
) -> None:
    whole = store.run(read_status(store.ops, NS))
    shown: list[JobHealth] = []
    for offset in range(0, len(EXPECTED) + limit, limit):
        page = _page(store, offset=offset, limit=limit)
        assert len(page.jobs) == min(limit, max(0, len(EXPECTED) - offset))
        assert page.totals == whole.totals
        assert page.matched == len(EXPECTED)
        shown += page.jobs
    # The same health as the whole read, job for job, in the same order.
    assert shown == list(whole.jobs)


def test_a_page_holds_only_the_states_asked_for(store: MemoryStore) -> None:
    trouble = _page(store, states=frozenset({"overdue", "failing"}), limit=2)
    assert [h.job for h in trouble.jobs] == ["late", "never"]
    assert trouble.matched == 3
    assert trouble.total == len(EXPECTED)
    rest = _page(store, states=frozenset({"overdue", "failing"}), offset=2, limit=2)
    assert [h.job for h in rest.jobs] == ["broken"]
    running = _page(store, states=frozenset({"running", "stuck"}))
    assert [(h.job, h.state) for h in running.jobs] == [("hung", "stuck"), ("busy", "running")]
    assert running.jobs[1].running is not None
    assert running.jobs[1].running.holder == HOLDER


def test_past_the_last_page_there_are_no_jobs_but_the_counts(store: MemoryStore) -> None:
    past = _page(store, offset=100, limit=10)
    assert past.jobs == ()
    assert past.matched == len(EXPECTED)
    assert past.totals["ok"] == len(OKS)
    assert past.healthy is False  # judged on every job, not on the page's


def test_the_json_of_a_page_says_which_part_it_is(store: MemoryStore) -> None:
    document = json.loads(
        json.dumps(status_json(_page(store, states=frozenset({"ok"}), offset=10, limit=5)))
    )
    assert document["page"] == {"offset": 10, "limit": 5, "state": ["ok"], "matched": 12}
    assert [job["job"] for job in document["jobs"]] == ["ok-10", "ok-11"]
    assert document["total"] == len(EXPECTED)
    assert document["healthy"] is False
    assert document["totals"] == {
        "overdue": 2, "stuck": 1, "failing": 1, "unknown": 1, "running": 1, "ok": 12,
        "paused": 1,
    }  # fmt: skip
    whole = status_json(store.run(read_status(store.ops, NS)))
    assert whole["page"] is None
    assert whole["totals"] == document["totals"]


def test_a_status_read_leaves_the_runs_output_out(store: MemoryStore) -> None:
    whole = store.run(read_status(store.ops, NS))
    assert all(h.last_run is None or h.last_run.output is None for h in whole.jobs)
    assert store.run(store.ops.run_list(NS, "ok-00", 1))[0].output  # the ledger keeps it


# -- what one read costs ------------------------------------------------------------------
_LEDGER_READS = frozenset({"run_list", "run_list_job", "run_list_many", "run_running"})


def _ledger_rows(statement: Statement, answer: object) -> int:
    """The ledger rows in an answer: a SQL store's rows of a ledger read, or the memory
    store's records."""
    if isinstance(answer, SqlResult):
        assert isinstance(statement, Query | QueryBatch)
        return len(answer.rows) if statement.name in _LEDGER_READS else 0
    if isinstance(answer, RunRecord):
        return 1
    if isinstance(answer, list):
        return sum(_ledger_rows(statement, item) for item in answer)
    return 0


def _counted(operation: Operation[Any], tally: Counter[str]) -> Operation[Any]:
    """``operation`` as it is, counting its round trips, the statements they run (SQLite
    runs a batch as one statement per item) and the ledger rows they bring."""
    try:
        statement = operation.send(None)
        while True:
            answer = yield statement
            tally["round trips"] += 1
            tally["statements"] += len(statement.batch) if isinstance(statement, QueryBatch) else 1
            tally["ledger rows"] += _ledger_rows(statement, answer)
            statement = operation.send(answer)
    except StopIteration as stop:
        return stop.value


def _fleet(store: SyncStore, jobs: int) -> None:
    """``jobs`` jobs that ran their last three slots fine, one job running and one that
    never succeeded, in a fresh namespace on the store's own clock."""
    names = [f"job-{index:05d}" for index in range(jobs)]
    rows = [(name, _definition(), "f" * 32) for name in [*names, "never-fine"]]
    store.run(store.ops.job_register(NS, rows))
    now = store.run(store.ops.store_now())
    for back in (3, 2, 1):
        slot = now - now % HOUR - back * HOUR
        claims = [SlotClaim(job=n, slot_us=slot, run_id=f"{n}-{slot}") for n in names]
        answers = store.run(store.ops.run_claim(NS, claims, HOLDER, HOUR))
        done = RunOutcome(state="succeeded")
        finishes = [
            RunFinish(job=a.job, slot_us=a.slot_us, fence=a.run.fence, outcome=done)
            for a in answers
            if a.run is not None
        ]
        assert len(finishes) == jobs
        assert all(store.run(store.ops.run_finish_many(NS, finishes)))
    slot = now - now % HOUR
    _claim(store, names[0], slot)  # in progress
    failed = SlotClaim(job="never-fine", slot_us=slot, run_id="never-fine")
    [answer] = store.run(store.ops.run_claim(NS, [failed], HOLDER, HOUR))
    assert answer.run is not None
    _finish(store, answer.run, "failed")


def _cost(store: SyncStore, page: Page | None) -> tuple[Counter[str], FleetStatus]:
    tally: Counter[str] = Counter()
    status = store.run(_counted(read_status(store.ops, NS, page=page), tally))
    return tally, status


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[SyncStore]]:
    """Two empty stores of one kind."""
    if request.param == "memory":
        yield [MemoryStore(), MemoryStore()]
        return
    opened = [open_store(parse_store_url(f"sqlite:///{tmp_path / f'{n}.db'}")) for n in (1, 2)]
    try:
        yield opened
    finally:
        for store in opened:
            store.close()


def test_a_page_costs_the_same_round_trips_and_ledger_rows_at_ten_times_the_jobs(
    stores: list[SyncStore],
) -> None:
    small, large = stores
    _fleet(small, 100)
    _fleet(large, 1_000)
    page = Page(limit=20)

    small_cost, small_status = _cost(small, page)
    large_cost, large_status = _cost(large, page)

    assert small_status.total == 101
    assert large_status.total == 1_001
    assert [(h.job, h.state) for h in large_status.jobs[:2]] == [
        ("never-fine", "failing"),
        ("job-00000", "running"),
    ]
    assert large_cost == small_cost, (small_cost, large_cost)
    # The page's 20 jobs and the two whose row cannot tell, three rows each, and the run
    # in progress found among them: nothing of the other jobs' ledger.
    assert large_cost["ledger rows"] <= 22 * 4 + 1
    whole_cost, _ = _cost(large, None)
    assert whole_cost["ledger rows"] >= 3 * 1_000  # what every job's health reads
