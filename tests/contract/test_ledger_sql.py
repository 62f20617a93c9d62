"""The run ledger on PostgreSQL and MySQL/MariaDB, held to the reference rules
(``fleetcron.stores.ledger``, ``docs/design/ledger.md``) including under contention.

The cross-backend contract suite is ``test_ledger.py``; this file checks what only the
server backends can get wrong: locking between processes, the store's clock and the
one-round-trip batch.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import pytest

from contract.contract_support import run_together
from fleetcron.models import RunOutcome, RunRecord, SlotClaim, job_lease_name
from fleetcron.stores import SyncStore
from fleetcron.stores.base import Operations
from fleetcron.stores.ledger import LOST_ERROR

pytestmark = pytest.mark.parametrize("backend_url", ["postgres", "mysql"], indirect=True)

HOLDER = "host-a:1:tok-a"
OTHER = "host-b:2:tok-b"
LONG_US = 30_000_000
SHORT_US = 300_000


def ledger(store: SyncStore) -> Operations:
    """The store's operations."""
    return store.ops


def now_us(store: SyncStore) -> int:
    return store.run(ledger(store).store_now())


def claim(
    store: SyncStore,
    namespace: str,
    claims: list[SlotClaim],
    *,
    holder: str = HOLDER,
    ttl_us: int = LONG_US,
) -> list[RunRecord]:
    answers = store.run(ledger(store).run_claim(namespace, claims, holder, ttl_us))
    return [answer.run for answer in answers if answer.run is not None]


def one(
    store: SyncStore,
    namespace: str,
    job: str,
    slot_us: int,
    *,
    holder: str = HOLDER,
    ttl_us: int = LONG_US,
    **options: Any,
) -> RunRecord | None:
    claimed = claim(
        store,
        namespace,
        [SlotClaim(job=job, slot_us=slot_us, run_id=f"run-{random.random()}", **options)],
        holder=holder,
        ttl_us=ttl_us,
    )
    assert len(claimed) <= 1
    return claimed[0] if claimed else None


def get(store: SyncStore, namespace: str, job: str, slot_us: int) -> RunRecord | None:
    return store.run(ledger(store).run_get(namespace, job, slot_us))


def finish(store: SyncStore, run: RunRecord, outcome: RunOutcome) -> bool:
    return store.run(
        ledger(store).run_finish(run.namespace, run.job, run.slot_us, run.fence, outcome)
    )


def wait_until(store: SyncStore, target_us: int, *, timeout: float = 10.0) -> None:
    """Sleep until the store's clock reaches ``target_us``."""
    give_up = time.monotonic() + timeout
    while (current := now_us(store)) < target_us:
        assert time.monotonic() < give_up, "the store clock did not reach the target"
        time.sleep(min(max((target_us - current) / 1e6, 0.001), 0.05))


def test_a_slot_in_the_future_of_the_store_clock_is_not_claimed_and_leaves_no_rows(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) + 60_000_000

    assert one(store, namespace, "job", slot) is None
    assert get(store, namespace, "job", slot) is None
    assert store.run(store.ops.lease_get(namespace, job_lease_name("job"))) is None


def test_a_claim_returns_the_attempt_and_takes_the_job_lease_with_its_fence(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) - 1_000_000

    run = one(store, namespace, "job", slot, least_us=2_000_000)

    assert run is not None
    assert (run.state, run.attempt, run.holder, run.trigger) == ("running", 1, HOLDER, "schedule")
    assert run.started_us == run.now_us
    assert run.expires_us == run.now_us + LONG_US
    assert run.fence >= run.now_us
    assert _same(get(store, namespace, "job", slot), run)
    lease = store.run(store.ops.lease_get(namespace, job_lease_name("job")))
    assert lease is not None
    assert (lease.holder, lease.fence, lease.acquired_us) == (HOLDER, run.fence, run.now_us)
    assert lease.expires_us == run.now_us + LONG_US
    assert lease.min_until_us == run.now_us + 2_000_000
    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.high_water_us == slot
    assert job.definition == "{}"


def _fields(run: RunRecord) -> dict[str, object]:
    return {name: getattr(run, name) for name in run.__slots__}


def _same(left: RunRecord | None, right: RunRecord | None) -> bool:
    assert left is not None
    assert right is not None
    a, b = _fields(left), _fields(right)
    a.pop("now_us"), b.pop("now_us")
    return a == b


def test_a_batch_claims_in_input_order_and_skips_what_it_cannot_claim(
    store: SyncStore, namespace: str
) -> None:
    now = now_us(store)
    claims = [
        SlotClaim(job="b", slot_us=now - 3, run_id="r1"),
        SlotClaim(job="a", slot_us=now + 60_000_000, run_id="r2"),  # future
        SlotClaim(job="a", slot_us=now - 2, run_id="r3"),
        SlotClaim(job="a", slot_us=now - 1, run_id="r4"),  # a's lease is taken by r3
        SlotClaim(job="a", slot_us=now - 1, run_id="r5", exclusive=False),  # lease not needed
        SlotClaim(job="a", slot_us=now - 2, run_id="r6", exclusive=False),  # slot is running
        SlotClaim(job="c", slot_us=now - 1, run_id="r7", exclusive=False),
    ]

    claimed = claim(store, namespace, claims)

    assert [(run.job, run.run_id) for run in claimed] == [
        ("b", "r1"),
        ("a", "r3"),
        ("a", "r5"),
        ("c", "r7"),
    ]
    assert claimed[2].fence > claimed[1].fence


def test_eight_processes_claiming_the_same_slots_at_once_claim_each_exactly_once(
    backend_url: str, namespace: str, store: SyncStore
) -> None:
    now = now_us(store)
    slots = [["job-0", now - 10], ["job-1", now - 10], ["job-1", now - 20], ["job-2", now - 10]]
    code = (
        "import json, random, sys\n"
        "from fleetcron.models import SlotClaim\n"
        "from fleetcron.stores import open_store, parse_store_url\n"
        "url, namespace, me = sys.argv[1], sys.argv[2], sys.argv[4]\n"
        "slots = json.loads(sys.argv[3])\n"
        "store = open_store(parse_store_url(url))\n"
        "random.shuffle(slots)  # every order, to expose lock-order deadlocks\n"
        "claims = [SlotClaim(job=j, slot_us=s, run_id=me, exclusive=j != 'job-1')\n"
        "          for j, s in slots]\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "got = store.run(store.ops.run_claim(namespace, claims, f'host:{me}:t', 30_000_000))\n"
        "got = [a.run for a in got if a.run is not None]\n"
        "print(json.dumps([[r.job, r.slot_us, r.fence, r.run_id] for r in got]))\n"
    )
    answers = run_together(
        [
            [sys.executable, "-c", code, backend_url, namespace, json.dumps(slots), str(n)]
            for n in range(8)
        ],
        "claimer",
    )
    claimed = [row for answer in answers for row in answer]

    assert sorted((job, slot) for job, slot, _, _ in claimed) == sorted(map(tuple, slots))
    for job, slot, fence, run_id in claimed:
        row = get(store, namespace, job, slot)
        assert row is not None
        assert (row.fence, row.run_id, row.attempt) == (fence, run_id, 1)
    fences = sorted(fence for job, _, fence, _ in claimed if job == "job-1")
    assert len(set(fences)) == 2  # the non-exclusive job's fence moved once per claim


def test_a_finished_slot_is_never_claimed_again(store: SyncStore, namespace: str) -> None:
    slot = now_us(store) - 1
    run = one(store, namespace, "job", slot, max_attempts=5)
    assert run is not None
    assert finish(store, run, RunOutcome(state="succeeded", exit_code=0))

    assert one(store, namespace, "job", slot, max_attempts=5) is None
    assert one(store, namespace, "job", slot, trigger="manual", max_attempts=5) is None
    row = get(store, namespace, "job", slot)
    assert row is not None
    assert (row.state, row.attempt) == ("succeeded", 1)


def test_an_expired_attempt_is_claimed_again_then_closed_as_lost_when_attempts_run_out(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) - 1
    first = one(store, namespace, "job", slot, ttl_us=SHORT_US, max_attempts=2)
    assert first is not None
    assert one(store, namespace, "job", slot, max_attempts=2) is None  # still valid
    wait_until(store, first.now_us + SHORT_US)

    second = one(store, namespace, "job", slot, holder=OTHER, ttl_us=SHORT_US, max_attempts=2)

    assert second is not None
    assert (second.attempt, second.holder) == (2, OTHER)
    assert second.fence > first.fence
    assert second.error == f"attempt 1 lost: {LOST_ERROR}"
    assert not finish(store, first, RunOutcome(state="succeeded"))  # the old fence is refused
    wait_until(store, second.now_us + SHORT_US)

    assert one(store, namespace, "job", slot, max_attempts=2) is None
    lost = get(store, namespace, "job", slot)
    assert lost is not None
    assert (lost.state, lost.attempt, lost.expires_us, lost.error) == ("lost", 2, None, LOST_ERROR)
    assert second.expires_us is not None
    assert lost.finished_us is not None
    assert lost.finished_us >= second.expires_us
    assert one(store, namespace, "job", slot, max_attempts=9) is None  # final: never again


def test_a_failed_attempt_with_a_retry_is_claimed_again_after_retry_at(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) - 1
    first = one(store, namespace, "job", slot, max_attempts=2)
    assert first is not None
    outcome = RunOutcome(state="failed", exit_code=3, error="boom", retry_after_us=SHORT_US)
    assert finish(store, first, outcome)
    failed = get(store, namespace, "job", slot)
    assert failed is not None
    assert failed.finished_us is not None
    assert failed.retry_at_us == failed.finished_us + SHORT_US
    assert (failed.exit_code, failed.error) == (3, "boom")

    assert one(store, namespace, "job", slot, max_attempts=2) is None  # not yet
    wait_until(store, failed.retry_at_us)
    second = one(store, namespace, "job", slot, max_attempts=2)

    assert second is not None
    assert (second.attempt, second.error, second.exit_code) == (2, None, None)
    assert second.fence > first.fence
    assert finish(store, second, outcome)
    wait_until(store, now_us(store) + SHORT_US)
    assert one(store, namespace, "job", slot, max_attempts=2) is None  # attempts used up
    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.last_failure_us is not None
    assert job.last_success_us is None


def test_an_exclusive_claim_waits_for_the_job_lease_but_a_non_exclusive_one_does_not(
    store: SyncStore, namespace: str
) -> None:
    now = now_us(store)
    held = store.run(store.ops.lease_acquire(namespace, job_lease_name("job"), OTHER, LONG_US, 0))
    assert held is not None

    assert one(store, namespace, "job", now - 2) is None
    assert get(store, namespace, "job", now - 2) is None
    shared = one(store, namespace, "job", now - 1, exclusive=False)

    assert shared is not None
    assert shared.fence > held.fence
    lease = store.run(store.ops.lease_get(namespace, job_lease_name("job")))
    assert lease is not None
    assert (lease.holder, lease.fence, lease.expires_us) == (OTHER, shared.fence, held.expires_us)


def test_a_late_or_foreign_finish_is_refused_and_changes_nothing(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) - 1
    run = one(store, namespace, "job", slot, ttl_us=SHORT_US)
    assert run is not None
    assert not store.run(
        ledger(store).run_finish(
            namespace, "job", slot, run.fence - 1, RunOutcome(state="succeeded")
        )
    )
    assert not store.run(ledger(store).run_extend(namespace, "job", slot, run.fence - 1, LONG_US))
    wait_until(store, run.now_us + SHORT_US)
    before = get(store, namespace, "job", slot)
    lease_before = store.run(store.ops.lease_get(namespace, job_lease_name("job")))

    assert not finish(store, run, RunOutcome(state="succeeded"))
    assert store.run(ledger(store).run_extend(namespace, "job", slot, run.fence, LONG_US)) is None

    assert _same(get(store, namespace, "job", slot), before)
    lease_after = store.run(store.ops.lease_get(namespace, job_lease_name("job")))
    assert lease_before is not None
    assert lease_after is not None
    assert (lease_after.expires_us, lease_after.fence) == (lease_before.expires_us, run.fence)
    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.last_success_us is None


def test_extend_renews_the_attempt_and_the_lease_and_finish_releases_the_lease(
    store: SyncStore, namespace: str
) -> None:
    slot = now_us(store) - 1
    run = one(store, namespace, "job", slot, ttl_us=SHORT_US)
    assert run is not None

    extended = store.run(ledger(store).run_extend(namespace, "job", slot, run.fence, LONG_US))

    assert extended is not None
    assert extended.expires_us == extended.now_us + LONG_US
    lease = store.run(store.ops.lease_get(namespace, job_lease_name("job")))
    assert lease is not None
    assert lease.expires_us == extended.expires_us
    assert finish(store, run, RunOutcome(state="succeeded", output="x" * 5000 + "tail"))
    released = store.run(store.ops.lease_get(namespace, job_lease_name("job")))
    assert released is not None
    assert not released.held
    done = get(store, namespace, "job", slot)
    assert done is not None
    assert done.output is not None
    assert len(done.output) == 4096
    assert done.output.endswith("tail")
    assert (done.state, done.expires_us, done.retry_at_us) == ("succeeded", None, None)
    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.last_success_us == done.finished_us
    assert one(store, namespace, "job", slot - 1) is not None  # the lease is free again


def test_a_paused_job_is_not_claimed_by_its_schedule_but_is_by_hand(
    store: SyncStore, namespace: str
) -> None:
    assert not store.run(ledger(store).job_set_paused(namespace, "job", False))  # unknown job
    assert store.run(ledger(store).job_register(namespace, [("job", '{"every": "1m"}', "fp")])) == [
        None
    ]
    assert store.run(ledger(store).job_set_paused(namespace, "job", True))
    slot = now_us(store) - 1

    assert one(store, namespace, "job", slot) is None
    assert get(store, namespace, "job", slot) is None
    manual = one(store, namespace, "job", slot, trigger="manual")

    assert manual is not None
    assert manual.trigger == "manual"


def test_run_record_inserts_once_and_never_overwrites(store: SyncStore, namespace: str) -> None:
    now = now_us(store)
    running = one(store, namespace, "job", now - 5)
    assert running is not None

    assert store.run(
        ledger(store).run_record(namespace, "job", now - 9, "missed", "down", "schedule")
    )
    assert not store.run(
        ledger(store).run_record(namespace, "job", now - 9, "skipped", None, "schedule")
    )
    assert not store.run(
        ledger(store).run_record(namespace, "job", now - 5, "skipped", None, "schedule")
    )

    missed = get(store, namespace, "job", now - 9)
    assert missed is not None
    assert (missed.state, missed.error, missed.attempt, missed.started_us) == (
        "missed",
        "down",
        0,
        None,
    )
    assert _same(get(store, namespace, "job", now - 5), running)
    assert one(store, namespace, "job", now - 9, trigger="manual", exclusive=False) is None
    assert store.run(
        ledger(store).run_record(namespace, "later", now - 3, "skipped", None, "schedule")
    )
    later = store.run(ledger(store).job_get(namespace, "later"))
    assert later is not None
    assert later.high_water_us == now - 3


def test_run_list_is_newest_first_and_prune_keeps_running_rows(
    store: SyncStore, namespace: str
) -> None:
    now = now_us(store)
    for offset in (50, 40, 30, 20):
        assert store.run(
            ledger(store).run_record(namespace, "a", now - offset, "skipped", None, "schedule")
        )
    assert store.run(ledger(store).run_record(namespace, "b", now - 30, "missed", None, "schedule"))
    running = one(store, namespace, "a", now - 60)
    assert running is not None

    listed = store.run(ledger(store).run_list(namespace, None, 10))
    assert [(r.job, r.slot_us) for r in listed] == [
        ("a", now - 20),
        ("a", now - 30),
        ("b", now - 30),
        ("a", now - 40),
        ("a", now - 50),
        ("a", now - 60),
    ]
    assert [r.slot_us for r in store.run(ledger(store).run_list(namespace, "a", 2))] == [
        now - 20,
        now - 30,
    ]

    assert store.run(ledger(store).run_prune(namespace, 1, LONG_US)) == 3

    left = store.run(ledger(store).run_list(namespace, None, 10))
    assert [(r.job, r.slot_us, r.state) for r in left] == [
        ("a", now - 20, "skipped"),
        ("b", now - 30, "missed"),
        ("a", now - 60, "running"),
    ]
    assert store.run(ledger(store).run_prune(namespace, 0, 0)) == 2
    assert [r.state for r in store.run(ledger(store).run_list(namespace, None, 10))] == ["running"]


def test_run_cancel_flags_unexpired_running_attempts(store: SyncStore, namespace: str) -> None:
    now = now_us(store)
    live = one(store, namespace, "job", now - 2, exclusive=False)
    short = one(store, namespace, "job", now - 1, exclusive=False, ttl_us=SHORT_US)
    assert live is not None
    assert short is not None
    wait_until(store, short.now_us + SHORT_US)

    assert store.run(ledger(store).run_cancel(namespace, "job")) == 1

    renewed = store.run(ledger(store).run_extend(namespace, "job", now - 2, live.fence, LONG_US))
    assert renewed is not None
    assert renewed.cancel_requested


def test_job_register_returns_the_previous_row_and_keeps_pause_and_progress(
    store: SyncStore, namespace: str
) -> None:
    assert store.run(ledger(store).job_register(namespace, [("job", '{"v": 1}', "fp1")])) == [None]
    assert store.run(ledger(store).job_set_paused(namespace, "job", True))
    assert one(store, namespace, "job", now_us(store) - 1, trigger="manual") is not None

    (before,) = store.run(ledger(store).job_register(namespace, [("job", '{"v": 2}', "fp2")]))

    assert before is not None
    assert (before.definition, before.fingerprint, before.paused) == ('{"v": 1}', "fp1", True)
    after = store.run(ledger(store).job_get(namespace, "job"))
    assert after is not None
    assert (after.definition, after.fingerprint, after.paused) == ('{"v": 2}', "fp2", True)
    assert after.high_water_us == before.high_water_us  # a manual run moves no progress
    assert [j.job for j in store.run(ledger(store).job_list(namespace))] == ["job"]


def test_high_water_only_moves_forward(store: SyncStore, namespace: str) -> None:
    now = now_us(store)
    assert one(store, namespace, "job", now - 10, exclusive=False) is not None
    assert one(store, namespace, "job", now - 20, exclusive=False) is not None
    assert store.run(
        ledger(store).run_record(namespace, "job", now - 30, "missed", None, "schedule")
    )

    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.high_water_us == now - 10
    assert one(store, namespace, "job", now - 5, exclusive=False) is not None
    job = store.run(ledger(store).job_get(namespace, "job"))
    assert job is not None
    assert job.high_water_us == now - 5


def test_names_round_trip_exactly(store: SyncStore, namespace: str) -> None:
    job = "Jöb 🚀 ÿ"
    run = one(store, namespace, job, now_us(store) - 1)
    assert run is not None
    assert run.job == job
    assert one(store, namespace, job.upper(), now_us(store) - 1) is not None  # no case folding
    assert {r.job for r in store.run(ledger(store).run_list(namespace, None, 10))} == {
        job,
        job.upper(),
    }
