"""Retention in the store, on every backend: ``run_prune_job`` deletes a job's finished
runs that are both old and beyond its newest ``keep``, a bounded number per call, and
``job_delete`` forgets a job that has nothing queued or running.

Every time is the store's clock: the tests wait on it, never on the local one.
"""

from __future__ import annotations

import time

import pytest

from contract.test_ledger import LONG, SHORT, Ledger
from fleetcron import AsyncFleet, Fleet
from fleetcron.errors import ConfigurationError
from fleetcron.jobspec import MAX_COUNT
from fleetcron.models import RunRecord
from fleetcron.stores import SyncStore

AGE = 1_000_000  # far longer than the few statements between the last write and a prune


@pytest.fixture
def ledger(store: SyncStore, namespace: str) -> Ledger:
    return Ledger(store, namespace)


def prune_job(
    ledger: Ledger,
    job: str,
    *,
    keep: int,
    older_than_us: int = AGE,
    limit: int = 100,
    dry_run: bool = False,
) -> int:
    return ledger.store.run(
        ledger.ops.run_prune_job(ledger.namespace, job, keep, older_than_us, limit, dry_run)
    )


def delete_job(ledger: Ledger, job: str, *, dry_run: bool = False) -> bool:
    return ledger.store.run(ledger.ops.job_delete(ledger.namespace, job, dry_run))


def slots(ledger: Ledger, job: str) -> list[int]:
    return sorted(run.slot_us for run in ledger.runs(job))


def wait_older_than_age(ledger: Ledger, *runs: RunRecord | None) -> None:
    """Wait until the store's clock is past the finish of every run by more than AGE."""
    finished = [run.finished_us or run.expires_us or 0 for run in runs if run is not None]
    ledger.wait_until(max(finished) + AGE + 1)


def record_finished(ledger: Ledger, job: str, slot_us: int, state: str = "skipped") -> RunRecord:
    assert ledger.record(job, slot_us, state)
    return ledger.must_get(job, slot_us)


# -- run_prune_job ----------------------------------------------------------------------


def test_run_prune_job_keeps_the_newest_finished_rows_and_deletes_older_old_ones(
    ledger: Ledger,
) -> None:
    s = ledger.past_slots(5)
    rows = [record_finished(ledger, "a", slot) for slot in s]
    others = [record_finished(ledger, "b", slot) for slot in s]
    elsewhere = ledger.elsewhere()
    assert all(elsewhere.record("a", slot, "skipped") for slot in s)
    wait_older_than_age(ledger, *rows, *others)

    assert prune_job(ledger, "a", keep=2) == 3

    assert slots(ledger, "a") == s[3:], "the newest two stay"
    assert slots(ledger, "b") == s, "another job is untouched"
    assert len(elsewhere.runs("a")) == 5, "another namespace is untouched"
    assert prune_job(ledger, "a", keep=2) == 0
    assert prune_job(ledger, "a", keep=10) == 0
    assert prune_job(ledger, "a", keep=0) == 2
    assert ledger.runs("a") == []
    assert prune_job(ledger, "nobody", keep=0) == 0


def test_run_prune_job_keeps_every_young_row_whatever_their_number(ledger: Ledger) -> None:
    s0, s1, s2, s3 = ledger.past_slots(4)
    old = [record_finished(ledger, "a", s0), record_finished(ledger, "a", s1, "missed")]
    wait_older_than_age(ledger, *old)
    record_finished(ledger, "a", s2)
    record_finished(ledger, "a", s3)

    assert prune_job(ledger, "a", keep=0, older_than_us=LONG) == 0, "nothing that old"
    assert slots(ledger, "a") == [s0, s1, s2, s3]
    assert prune_job(ledger, "a", keep=0) == 2, "the young ones stay, though beyond keep"
    assert slots(ledger, "a") == [s2, s3]


def test_run_prune_job_never_deletes_a_row_that_is_not_final_nor_counts_it_in_keep(
    ledger: Ledger,
) -> None:
    s = ledger.past_slots(7)
    failed = ledger.must_claim("a", s[0])
    assert ledger.finish(failed, "failed", exit_code=1)  # final: no retry
    succeeded = ledger.must_claim("a", s[1])
    assert ledger.finish(succeeded)
    running = ledger.must_claim("a", s[2], exclusive=False, ttl_us=LONG)
    expired = ledger.must_claim("a", s[3], exclusive=False, ttl_us=SHORT)  # stays running
    retrying = ledger.must_claim("a", s[4], exclusive=False, max_attempts=2)
    assert ledger.finish(retrying, "failed", retry_after_us=LONG)  # a retry is pending
    skipped = record_finished(ledger, "a", s[5])
    assert ledger.record("a", s[6], "queued", trigger="manual")
    wait_older_than_age(
        ledger,
        ledger.must_get("a", s[0]),
        ledger.must_get("a", s[1]),
        ledger.must_get("a", s[4]),
        expired,
        skipped,
    )
    assert ledger.must_get("a", s[3]).state == "running", "no replica recovered it"

    # The newest finished row is s[5]: the queued row after it does not count.
    assert prune_job(ledger, "a", keep=1) == 2

    assert slots(ledger, "a") == s[2:]
    assert prune_job(ledger, "a", keep=0, older_than_us=0) == 1
    states = {run.slot_us: run.state for run in ledger.runs("a")}
    assert states == {
        s[2]: "running",
        s[3]: "running",
        s[4]: "failed",
        s[6]: "queued",
    }
    assert ledger.must_get("a", s[2]).fence == running.fence


def test_run_prune_job_deletes_at_most_limit_rows_a_call_oldest_slot_first(
    ledger: Ledger,
) -> None:
    s = ledger.past_slots(7)
    rows = [record_finished(ledger, "a", slot) for slot in s]
    wait_older_than_age(ledger, *rows)

    assert prune_job(ledger, "a", keep=0, limit=3) == 3
    assert slots(ledger, "a") == s[3:]
    assert prune_job(ledger, "a", keep=0, limit=3) == 3
    assert slots(ledger, "a") == s[6:]
    assert prune_job(ledger, "a", keep=0, limit=3) == 1
    assert prune_job(ledger, "a", keep=0, limit=3) == 0
    assert prune_job(ledger, "a", keep=0, limit=0) == 0


def test_run_prune_jobs_applies_each_jobs_rule_in_one_round_trip(ledger: Ledger) -> None:
    s = ledger.past_slots(5)
    rows = [record_finished(ledger, job, slot) for job in ("a", "b", "c") for slot in s]
    wait_older_than_age(ledger, *rows)
    young = [record_finished(ledger, "c", slot) for slot in ledger.past_slots(2, step_us=1)]

    counts = ledger.store.run(
        ledger.ops.run_prune_jobs(
            ledger.namespace,
            [("a", 2, AGE), ("b", 0, AGE), ("c", 0, AGE), ("nobody", 0, AGE), ("b", 0, AGE)],
            4,
        )
    )

    assert counts == [3, 4, 4, 0, 1]  # b: 4 (the limit), then the last one
    assert slots(ledger, "a") == s[3:]
    assert slots(ledger, "b") == []
    assert slots(ledger, "c") == sorted([s[4], *(run.slot_us for run in young)])
    assert ledger.store.run(ledger.ops.run_prune_jobs(ledger.namespace, [], 4)) == []


def test_run_prune_job_dry_run_counts_up_to_the_limit_and_deletes_nothing(
    ledger: Ledger,
) -> None:
    s = ledger.past_slots(5)
    rows = [record_finished(ledger, "a", slot) for slot in s]
    wait_older_than_age(ledger, *rows)
    before = ledger.runs("a")

    assert prune_job(ledger, "a", keep=1, dry_run=True) == 4
    assert prune_job(ledger, "a", keep=1, limit=2, dry_run=True) == 2
    assert prune_job(ledger, "a", keep=0, older_than_us=LONG, dry_run=True) == 0

    assert [run.slot_us for run in ledger.runs("a")] == [run.slot_us for run in before]
    assert prune_job(ledger, "a", keep=1) == 4


# -- job_delete ---------------------------------------------------------------------------


def test_job_delete_forgets_the_job_row_and_leaves_its_runs(ledger: Ledger) -> None:
    s0, s1 = ledger.past_slots(2)
    assert ledger.register("gone", '{"every_us": 60000000}', "fp") is None
    record_finished(ledger, "gone", s0)
    retrying = ledger.must_claim("gone", s1, max_attempts=2)
    assert ledger.finish(retrying, "failed", retry_after_us=LONG)
    ledger.register("kept", "{}", "fp")

    assert delete_job(ledger, "gone", dry_run=True)
    assert ledger.job("gone") is not None, "a dry run changes nothing"

    assert delete_job(ledger, "gone"), "a pending retry does not keep the job"
    assert ledger.job("gone") is None
    assert [job.job for job in ledger.jobs()] == ["kept"]
    assert slots(ledger, "gone") == [s0, s1], "its runs stay until pruned"
    assert not delete_job(ledger, "gone"), "no row any more"
    assert not delete_job(ledger, "never")
    assert ledger.elsewhere().jobs() == []


def test_job_delete_refuses_a_job_with_a_queued_or_running_run(ledger: Ledger) -> None:
    s0, s1 = ledger.past_slots(2)
    ledger.register("queued", "{}", "fp")
    assert ledger.record("queued", s0, "queued", trigger="manual")
    running = ledger.must_claim("running", s1)

    for job in ("queued", "running"):
        assert not delete_job(ledger, job, dry_run=True)
        assert not delete_job(ledger, job)
        assert ledger.job(job) is not None, job

    assert ledger.finish(running)
    assert delete_job(ledger, "running")
    assert ledger.job("running") is None
    assert ledger.must_get("running", s1).state == "succeeded"


def test_a_deleted_job_whose_runs_are_pruned_leaves_nothing_listed(ledger: Ledger) -> None:
    s = ledger.past_slots(3)
    for slot in s:
        assert ledger.finish(ledger.must_claim("gone", slot))
    ledger.register("gone", "{}", "fp")
    ledger.wait_until((ledger.must_get("gone", s[-1]).finished_us or 0) + 1)

    assert delete_job(ledger, "gone")
    assert prune_job(ledger, "gone", keep=0, older_than_us=0) == 3

    assert ledger.runs() == []
    assert ledger.jobs() == []
    assert ledger.lease("gone") is not None, "the job lease keeps its fences"


# -- the fleet's face ---------------------------------------------------------------------


async def test_the_async_fleet_prunes_runs_then_forgets_the_idle_job(
    async_fleet: AsyncFleet,
) -> None:
    store, ops, ns = async_fleet.store, async_fleet.store.ops, async_fleet.namespace
    await store.run(ops.job_register(ns, [("a", '{"retention_keep": 1}', "fp")]))
    now = await store.run(ops.store_now())
    for back in (3, 2, 1):
        assert await store.run(ops.run_record(ns, "a", now - back, "skipped", None, "schedule"))
    (newest,) = await async_fleet.runs("a", limit=1)
    give_up = time.monotonic() + 10
    while await store.run(ops.store_now()) <= (newest.finished_us or 0) + 1_000:
        assert time.monotonic() < give_up, "the store clock did not move"

    assert await async_fleet.prune_runs(older_than="0s", dry_run=True) == {"a": 2}
    assert len(await async_fleet.runs("a")) == 3
    assert await async_fleet.prune_runs(older_than="0s") == {"a": 2}, "its registered keep"
    assert [run.slot_us for run in await async_fleet.runs("a")] == [newest.slot_us]
    with pytest.raises(ConfigurationError, match="no job 'nope'"):
        await async_fleet.prune_runs(job="nope")

    (dry,) = await async_fleet.prune_jobs("1ms", dry_run=True)
    assert (dry.job, dry.deleted, dry.runs) == ("a", True, 1)
    assert dry.idle_us > 1_000
    (done,) = await async_fleet.prune_jobs("1ms")
    assert (done.job, done.deleted, done.runs) == ("a", True, 1)
    assert await async_fleet.runs() == []
    assert await store.run(ops.job_list(ns)) == []


def test_a_count_no_store_can_take_is_refused_before_the_store_is_asked(fleet: Fleet) -> None:
    # Past MAX_COUNT every store took some and failed on others with its driver's error:
    # Redis from 2**53 (a script's double), SQLite and PostgreSQL past 2**63 - 1.
    store, ops, ns = fleet.store, fleet.store.ops, fleet.namespace
    store.run(ops.job_register(ns, [("a", "{}", "fp")]))
    now = store.run(ops.store_now())
    assert store.run(ops.run_record(ns, "a", now - 1, "skipped", None, "schedule"))

    for count in (MAX_COUNT + 1, 2**63 - 1, 2**63, 2**70):
        for job in (None, "a"):
            with pytest.raises(ConfigurationError, match=f"^limit must be 1 to {MAX_COUNT}, got"):
                fleet.runs(job, limit=count)
        with pytest.raises(ConfigurationError, match=f"^keep must be 0 to {MAX_COUNT}, got"):
            fleet.prune_runs(keep=count, older_than="0s")

    assert len(fleet.runs(limit=MAX_COUNT)) == len(fleet.runs("a", limit=MAX_COUNT)) == 1
    fleet.prune_runs(keep=MAX_COUNT, older_than="0s")
    assert len(fleet.runs("a")) == 1, "the newest MAX_COUNT runs stay"
