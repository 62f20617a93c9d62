"""Minimal reproductions of the defects the model-based test (test_store_model.py) found.

Each runs on every backend and holds the behaviour of the reference store; the backend that
does not keep it is marked ``xfail(strict=True)`` until the defect is fixed — then the test
passes there, the strict marker fails it, and the marker (and the model's emulation of the
defect, if any) is to be removed.
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


def known_defect(request: pytest.FixtureRequest, backend_url: str, kind: str, why: str) -> None:
    if parse_store_url(backend_url).kind == kind:
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))


def test_the_runs_of_a_deleted_job_are_still_listed_and_pruned_namespace_wide(
    store: SyncStore, namespace: str, backend_url: str, request: pytest.FixtureRequest
) -> None:
    # Model: record(j1, skipped); delete_job(j1); list_everything() -> run_list(None) == [].
    known_defect(
        request,
        backend_url,
        "redis",
        "Redis finds a namespace's runs by SCAN of its job rows: once job_delete removed "
        "the row, run_list/run_due/run_prune of every job miss the job's runs",
    )
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
    store: SyncStore, namespace: str, backend_url: str, request: pytest.FixtureRequest
) -> None:
    # Model: acquire(a, ttl=10m, least=40ms); extend(a, ttl=1µs) -> now_us after the call.
    known_defect(
        request,
        backend_url,
        "mysql",
        "MySQL's lease_extend answers now_us = expires - ttl, which is min_until - ttl, "
        "later than the store's clock, when min_until is later than now + ttl",
    )
    ops = store.ops
    first = store.run(ops.lease_acquire(namespace, "job", "h1", 60 * SECOND, 30 * SECOND))
    assert first is not None

    before = store.run(ops.store_now())
    extended = store.run(ops.lease_extend(namespace, "job", "h1", first.fence, 1))
    after = store.run(ops.store_now())

    assert isinstance(extended, LeaseRecord)
    assert extended.expires_us == first.min_until_us, "never before lock_at_least"
    assert before <= extended.now_us <= after, "now_us is the store's clock of the call"
