"""Minimal reproductions of the defects the model-based test (test_store_model.py) found,
kept as regression tests: each runs on every backend and holds the behaviour of the
reference store (the backend that broke it is named in the test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetcron.models import LeaseRecord
from fleetcron.stores import SyncStore, open_store, parse_store_url

SECOND = 1_000_000


@pytest.fixture
def store(backend_url: str) -> Iterator[SyncStore]:
    opened = open_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        opened.close()


def test_the_runs_of_a_deleted_job_are_still_listed_and_pruned_namespace_wide(
    store: SyncStore, namespace: str
) -> None:
    # Model: record(j1, skipped); delete_job(j1); list_everything() -> run_list(None) == [].
    # Redis found a namespace's runs by SCAN of its job rows: once job_delete removed the
    # row, run_list/run_due/run_prune of every job missed the job's runs.
    ops = store.ops
    slot = store.run(ops.store_now()) - 60 * SECOND
    assert store.run(ops.run_record(namespace, "job", slot, "skipped", None, "schedule"))
    assert store.run(ops.job_delete(namespace, "job"))  # nothing queued or running
    assert [r.slot_us for r in store.run(ops.run_list(namespace, "job", 10))] == [slot]

    listed = store.run(ops.run_list(namespace, None, 10))

    assert [(r.job, r.slot_us) for r in listed] == [("job", slot)], "job_delete leaves the runs"
    assert store.run(ops.run_prune(namespace, 0, 0)) == 1
    assert store.run(ops.run_list(namespace, "job", 10)) == []


def test_an_extension_within_lock_at_least_answers_the_store_clock_of_the_call(
    store: SyncStore, namespace: str
) -> None:
    # Model: acquire(a, ttl=10m, least=40ms); extend(a, ttl=1µs) -> now_us after the call.
    # MySQL answered now_us = expires - ttl, which is min_until - ttl, later than the
    # store's clock, when min_until was later than now + ttl.
    ops = store.ops
    first = store.run(ops.lease_acquire(namespace, "job", "h1", 60 * SECOND, 30 * SECOND))
    assert first is not None

    before = store.run(ops.store_now())
    extended = store.run(ops.lease_extend(namespace, "job", "h1", first.fence, 1))
    after = store.run(ops.store_now())

    assert isinstance(extended, LeaseRecord)
    assert extended.expires_us == first.min_until_us, "never before lock_at_least"
    assert before <= extended.now_us <= after, "now_us is the store's clock of the call"
