"""The run ledger of every backend (docs/design/ledger.md): one suite, every rule.

Each test drives the ledger operations of ``store.ops`` directly, so what is checked is the
store, not the scheduler. Every time is the store's clock: tests read it (``store_now``,
the records' ``now_us``) and wait on it, never on the local one. A backend without the
ledger operations fails every test here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from contract.contract_support import expiry_slack_us, must_acquire, release, run_together
from contract.ledgerworker import work
from fleetcron.errors import StoreError
from fleetcron.models import (
    CLAIM_STATUSES,
    FINAL_STATES,
    TRIGGERS,
    ClaimResult,
    JobRecord,
    LeaseRecord,
    RunFinish,
    RunNote,
    RunOutcome,
    RunRecord,
    SlotClaim,
    job_lease_name,
)
from fleetcron.stores import SyncStore, open_store, parse_store_url
from fleetcron.stores.base import Operations
from fleetcron.stores.ledger import MISSED_ERROR
from fleetcron.stores.redis.keys import slots_key
from redis_cluster import raw_client

R = TypeVar("R", RunRecord, JobRecord, LeaseRecord)

SECOND = 1_000_000
MINUTE = 60 * SECOND
LONG = 30 * SECOND  # longer than any test: never expires by itself
SHORT = 400_000  # expires within the test; a test waits for it on the store clock
OUTPUT_LIMIT = 4096
WORKER = Path(__file__).with_name("ledgerworker.py")


def stored(record: R) -> R:
    """The persistent part of a record (``now_us`` is only when it was read)."""
    return dataclasses.replace(record, now_us=0)


def slot_claim(
    job: str,
    slot_us: int,
    *,
    run_id: str | None = None,
    exclusive: bool = True,
    max_attempts: int = 1,
    trigger: str = "schedule",
    least_us: int = 0,
    deadline_us: int | None = None,
) -> SlotClaim:
    return SlotClaim(
        job=job,
        slot_us=slot_us,
        run_id=run_id if run_id is not None else f"run-{job}-{slot_us}",
        exclusive=exclusive,
        max_attempts=max_attempts,
        trigger=trigger,
        least_us=least_us,
        deadline_us=deadline_us,
    )


class Ledger:
    """The ledger operations of one store in one namespace, one round trip per call."""

    def __init__(self, store: SyncStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace

    @property
    def ops(self) -> Operations:
        return self.store.ops

    def elsewhere(self) -> Ledger:
        """The same store, another namespace."""
        return Ledger(self.store, f"{self.namespace}-other")

    # -- clock ---------------------------------------------------------------------------

    def now(self) -> int:
        return self.store.run(self.ops.store_now())

    def wait_until(self, target_us: int, *, timeout: float = 10.0) -> int:
        """Sleep until the store's clock reaches ``target_us`` (the times waited for are
        expiries: on etcd, past them by the time etcd may take to end a lease, see
        :func:`expiry_slack_us`); return the store's now."""
        target_us += expiry_slack_us(self.store)
        give_up = time.monotonic() + timeout
        while True:
            now = self.now()
            if now >= target_us:
                return now
            assert time.monotonic() < give_up, "the store clock did not reach the target"
            time.sleep(min(max((target_us - now) / 1e6, 0.001), 0.05))

    def past_slots(self, count: int, *, step_us: int = MINUTE) -> list[int]:
        """``count`` increasing slot times, all before the store's now."""
        first = self.now() - (count + 1) * step_us
        return [first + index * step_us for index in range(count)]

    # -- runs ----------------------------------------------------------------------------

    def claim(
        self, claims: Sequence[SlotClaim], *, holder: str = "h1", ttl_us: int = LONG
    ) -> list[RunRecord]:
        """The claimed attempts, in input order."""
        answers = self.answer(claims, holder=holder, ttl_us=ttl_us)
        return [answer.run for answer in answers if answer.run is not None]

    def answer(
        self, claims: Sequence[SlotClaim], *, holder: str = "h1", ttl_us: int = LONG
    ) -> list[ClaimResult]:
        """Every claim's answer, in input order."""
        answers = self.store.run(self.ops.run_claim(self.namespace, list(claims), holder, ttl_us))
        assert [(a.job, a.slot_us) for a in answers] == [(c.job, c.slot_us) for c in claims]
        for answer in answers:
            assert answer.status in CLAIM_STATUSES, answer
            assert (answer.run is not None) == (answer.status == "claimed"), answer
        return answers

    def status_of(
        self, job: str, slot_us: int, *, holder: str = "h1", ttl_us: int = LONG, **options: Any
    ) -> str:
        """Claim one slot; the answer's status."""
        claim = slot_claim(job, slot_us, **options)
        return self.answer([claim], holder=holder, ttl_us=ttl_us)[0].status

    def claim_one(
        self, job: str, slot_us: int, *, holder: str = "h1", ttl_us: int = LONG, **options: Any
    ) -> list[RunRecord]:
        return self.claim([slot_claim(job, slot_us, **options)], holder=holder, ttl_us=ttl_us)

    def must_claim(
        self, job: str, slot_us: int, *, holder: str = "h1", ttl_us: int = LONG, **options: Any
    ) -> RunRecord:
        claimed = self.claim_one(job, slot_us, holder=holder, ttl_us=ttl_us, **options)
        assert len(claimed) == 1, f"{job!r} slot {slot_us} should have been claimed"
        return claimed[0]

    def extend(self, run: RunRecord, *, fence: int | None = None, ttl_us: int = LONG) -> Any:
        fence = run.fence if fence is None else fence
        return self.store.run(
            self.ops.run_extend(self.namespace, run.job, run.slot_us, fence, ttl_us)
        )

    def finish(
        self, run: RunRecord, state: str = "succeeded", *, fence: int | None = None, **outcome: Any
    ) -> bool:
        fence = run.fence if fence is None else fence
        return self.store.run(
            self.ops.run_finish(
                self.namespace, run.job, run.slot_us, fence, RunOutcome(state=state, **outcome)
            )
        )

    def record(
        self,
        job: str,
        slot_us: int,
        state: str = "skipped",
        *,
        error: str | None = None,
        trigger: str = "schedule",
    ) -> bool:
        return self.store.run(
            self.ops.run_record(self.namespace, job, slot_us, state, error, trigger)
        )

    def cancel(self, job: str, slot_us: int | None = None, note: str | None = None) -> int:
        if slot_us is None and note is None:  # the call as the scheduler's overlap makes it
            return self.store.run(self.ops.run_cancel(self.namespace, job))
        return self.store.run(self.ops.run_cancel(self.namespace, job, slot_us, note))

    def get(self, job: str, slot_us: int) -> RunRecord | None:
        return self.store.run(self.ops.run_get(self.namespace, job, slot_us))

    def settled(self, slots: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        return self.store.run(self.ops.run_settled(self.namespace, list(slots)))

    def must_get(self, job: str, slot_us: int) -> RunRecord:
        run = self.get(job, slot_us)
        assert run is not None, f"no ledger row for {job!r} slot {slot_us}"
        return run

    def runs(self, job: str | None = None, limit: int = 100) -> list[RunRecord]:
        return self.store.run(self.ops.run_list(self.namespace, job, limit))

    def prune(self, keep: int, older_than_us: int) -> int:
        return self.store.run(self.ops.run_prune(self.namespace, keep, older_than_us))

    # -- jobs ----------------------------------------------------------------------------

    def register(self, job: str, definition: str = "{}", fingerprint: str = "") -> Any:
        return self.store.run(
            self.ops.job_register(self.namespace, [(job, definition, fingerprint)])
        )[0]

    def pause(self, job: str, paused: bool = True) -> bool:
        return self.store.run(self.ops.job_set_paused(self.namespace, job, paused))

    def job(self, job: str) -> JobRecord | None:
        return self.store.run(self.ops.job_get(self.namespace, job))

    def must_job(self, job: str) -> JobRecord:
        row = self.job(job)
        assert row is not None, f"no job row for {job!r}"
        return row

    def jobs(self) -> list[JobRecord]:
        return self.store.run(self.ops.job_list(self.namespace))

    def lease(self, job: str) -> LeaseRecord | None:
        return self.store.run(self.store.ops.lease_get(self.namespace, job_lease_name(job)))

    def must_lease(self, job: str) -> LeaseRecord:
        lease = self.lease(job)
        assert lease is not None, f"no job lease row for {job!r}"
        return lease


@pytest.fixture
def ledger(store: SyncStore, namespace: str) -> Ledger:
    return Ledger(store, namespace)


# -- run_claim: which slots are claimed -------------------------------------------------


def test_a_slot_the_store_clock_has_not_reached_is_not_claimed_even_manually(
    ledger: Ledger,
) -> None:
    now = ledger.now()
    future = now + 5 * SECOND

    for trigger in TRIGGERS:
        assert ledger.status_of("job", future, trigger=trigger, exclusive=False) == "not_due"
    assert ledger.get("job", future) is None
    assert ledger.lease("job") is None, "a refused claim writes nothing"
    assert ledger.job("job") is None, "a refused claim writes nothing"

    soon = ledger.now() + 300_000
    assert ledger.status_of("job", soon) == "not_due"
    ledger.wait_until(soon)
    run = ledger.must_claim("job", soon)
    assert run.started_us >= soon  # type: ignore[operator]


def test_a_first_claim_is_attempt_1_running_under_the_job_lease_new_fence_until_now_plus_ttl(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    earlier = must_acquire(ledger.store, ledger.namespace, job_lease_name("job"), "someone")
    assert release(ledger.store, earlier)

    (run,) = ledger.claim(
        [slot_claim("job", slot, run_id="run-1", least_us=2 * SECOND)],
        holder="host:1:tok",
        ttl_us=5 * SECOND,
    )

    now = run.now_us
    assert run == RunRecord(
        namespace=ledger.namespace,
        job="job",
        slot_us=slot,
        state="running",
        attempt=1,
        fence=run.fence,
        holder="host:1:tok",
        run_id="run-1",
        trigger="schedule",
        started_us=now,
        finished_us=None,
        expires_us=now + 5 * SECOND,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=None,
        output=None,
        now_us=now,
    )
    assert run.fence > earlier.fence
    assert run.fence >= now, "a fence is at least the store's now"
    lease = ledger.must_lease("job")
    assert (lease.holder, lease.fence) == ("host:1:tok", run.fence)
    assert (lease.acquired_us, lease.expires_us, lease.min_until_us) == (
        now,
        now + 5 * SECOND,
        now + 2 * SECOND,
    )
    assert stored(ledger.must_get("job", slot)) == stored(run)


def test_a_claim_of_an_unregistered_job_creates_its_job_row_with_an_empty_definition(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("fresh", slot)

    job = ledger.must_job("fresh")
    assert (job.job, job.paused, json.loads(job.definition)) == ("fresh", False, {})
    assert job.high_water_us == slot
    assert (job.last_success_us, job.last_failure_us) == (None, None)
    assert job.updated_us <= run.now_us


def test_a_batch_answers_every_claim_in_input_order_with_the_run_or_the_reason(
    ledger: Ledger,
) -> None:
    s1, s2, s3 = ledger.past_slots(3)
    assert ledger.record("done", s1, "skipped")
    assert ledger.register("resting", "{}", "fp") is None
    assert ledger.pause("resting")
    future = ledger.now() + MINUTE

    answers = ledger.answer(
        [
            slot_claim("charlie", s3, run_id="c3"),
            slot_claim("future", future, run_id="f"),
            slot_claim("alpha", s1, run_id="a1"),
            slot_claim("done", s1, run_id="d1", exclusive=False, trigger="manual"),
            slot_claim("charlie", s2, run_id="c2"),  # its lease was taken by c3 above
            slot_claim("bravo", s2, run_id="b2", exclusive=False),
            slot_claim("resting", s1, run_id="r1"),
            slot_claim("bravo", s1, run_id="b1", exclusive=False),
            slot_claim("bravo", s2, run_id="b2-again", exclusive=False),  # claimed just now
        ]
    )

    assert [a.status for a in answers] == [
        "claimed",
        "not_due",
        "claimed",
        "taken",
        "busy",
        "claimed",
        "paused",
        "claimed",
        "taken",
    ]
    claimed = [a.run for a in answers if a.run is not None]

    assert [(r.job, r.slot_us, r.run_id) for r in claimed] == [
        ("charlie", s3, "c3"),
        ("alpha", s1, "a1"),
        ("bravo", s2, "b2"),
        ("bravo", s1, "b1"),
    ]
    assert all(r.state == "running" and r.attempt == 1 for r in claimed)
    starts: dict[str, list[int]] = {}
    for run in claimed:
        assert run.started_us, "a claimed run has started"
        starts.setdefault(run.job, []).append(run.started_us)
    # The claims of one job are decided in input order, at the store's clock; those of
    # different jobs in any order (PostgreSQL commits a batch's jobs together, by job).
    assert all(times == sorted(times) for times in starts.values()), starts
    assert claimed[2].fence < claimed[3].fence, "each claim moves the job's fence"
    assert ledger.must_lease("bravo").fence == claimed[3].fence
    assert ledger.get("charlie", s2) is None
    assert ledger.get("future", future) is None
    assert ledger.must_get("bravo", s2).run_id == "b2"
    assert ledger.must_get("done", s1).state == "skipped"


def test_an_empty_batch_claims_nothing(ledger: Ledger) -> None:
    assert ledger.claim([]) == []
    assert ledger.runs() == []


def _claim_in_threads(
    store: SyncStore, namespace: str, slots: list[tuple[str, int, bool]], contenders: int
) -> list[dict[str, Any]]:
    start = threading.Barrier(contenders)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            start.wait(timeout=10)
            results.append(work(store, namespace, slots, f"replica-{index}", index))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(contenders)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside the store's steps too
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    return results


def _claim_in_processes(
    url: str, namespace: str, slots: list[tuple[str, int, bool]], contenders: int
) -> list[dict[str, Any]]:
    spec = json.dumps(slots)
    commands = [
        [sys.executable, str(WORKER), url, namespace, f"replica-{index}", str(index), spec]
        for index in range(contenders)
    ]
    return run_together(commands, "replica")


@pytest.mark.slow
def test_replicas_claiming_the_same_slots_concurrently_run_each_slot_exactly_once(
    ledger: Ledger, backend_url: str
) -> None:
    contenders = 8
    ledger.now()  # fail here, not in the replicas, when the ledger is missing
    slots = [
        (job, slot, exclusive)
        for job, exclusive in (("serial-a", True), ("serial-b", True), ("parallel", False))
        for slot in ledger.past_slots(8, step_us=SECOND)
    ]

    if backend_url.startswith("memory://"):
        results = _claim_in_threads(ledger.store, ledger.namespace, slots, contenders)
    else:
        results = _claim_in_processes(backend_url, ledger.namespace, slots, contenders)

    assert len(results) == contenders
    ran = [
        (result["holder"], job, slot, fence, attempt, finished)
        for result in results
        for job, slot, fence, attempt, finished in result["runs"]
    ]
    by_slot: dict[tuple[str, int], list[str]] = {}
    for holder, job, slot, *_ in ran:
        by_slot.setdefault((job, slot), []).append(holder)
    twice = {key: holders for key, holders in by_slot.items() if len(holders) > 1}
    assert not twice, f"slots claimed more than once: {twice}"
    assert sorted(by_slot) == sorted((job, slot) for job, slot, _ in slots)
    assert all(attempt == 1 and finished for *_, attempt, finished in ran)
    for job in ("serial-a", "serial-b", "parallel"):
        fences = [fence for _, name, _, fence, _, _ in ran if name == job]
        assert len(set(fences)) == len(fences), f"{job}: fences repeat: {fences}"
    rows = {(r.job, r.slot_us): r for r in ledger.runs(limit=100)}
    for holder, job, slot, fence, _, _ in ran:
        row = rows[(job, slot)]
        assert (row.state, row.holder, row.fence) == ("succeeded", holder, fence)
    # Every replica asked for the slots, and the asking overlapped: either several won some,
    # or those that won none were refused while the winner held them. (Which one happens
    # is the scheduler's luck, not the ledger's rule.)
    assert all(result["rounds"] >= 1 for result in results)
    winners = {holder for holder, *_ in ran}
    refused = sum(result["empty_rounds"] for result in results if result["holder"] not in winners)
    assert len(winners) >= 2 or refused >= 1, "no contention happened"


@pytest.mark.slow
def test_batches_over_many_jobs_in_every_order_never_wait_on_each_other_in_a_cycle(
    ledger: Ledger, backend_url: str
) -> None:
    """Eight replicas send batches over the same 30 jobs, each in its own shuffled order,
    and record the outcomes in batches: a store that commits a batch's jobs together must
    take their locks in one order (PostgreSQL: by job), or two batches deadlock — which
    fails the batch, and this test."""
    ledger.now()
    slots = [
        (f"job-{index:02d}", slot, index % 3 != 0)
        for index in range(30)
        for slot in ledger.past_slots(3, step_us=SECOND)
    ]

    if backend_url.startswith("memory://"):
        results = _claim_in_threads(ledger.store, ledger.namespace, slots, 8)
    else:
        results = _claim_in_processes(backend_url, ledger.namespace, slots, 8)

    ran = [(job, slot) for result in results for job, slot, *_ in result["runs"]]
    assert sorted(ran) == sorted((job, slot) for job, slot, _ in slots), "each slot once"
    assert all(finished for result in results for *_, finished in result["runs"])


# -- run_claim: what may be claimed again -----------------------------------------------


def _make_final(ledger: Ledger, slot: int, state: str) -> None:
    if state in ("skipped", "missed"):
        assert ledger.record("job", slot, state, error=f"{state} on purpose")
    elif state == "lost":
        run = ledger.must_claim("job", slot, ttl_us=SHORT)
        ledger.wait_until(run.expires_us)  # type: ignore[arg-type]
        assert ledger.status_of("job", slot, holder="h2") == "taken"  # closes the row as lost
    else:
        run = ledger.must_claim("job", slot)
        assert ledger.finish(run, state, exit_code=1 if state == "failed" else 0)
    assert ledger.must_get("job", slot).state == state


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
def test_a_finished_slot_is_never_claimed_again(ledger: Ledger, state: str) -> None:
    (slot,) = ledger.past_slots(1)
    _make_final(ledger, slot, state)
    before = ledger.must_get("job", slot)
    lease = ledger.lease("job")

    for trigger, exclusive in itertools.product(TRIGGERS, (True, False)):
        again = slot_claim("job", slot, exclusive=exclusive, trigger=trigger, max_attempts=9)
        assert ledger.claim([again], holder="h3") == [], (trigger, exclusive)

    assert stored(ledger.must_get("job", slot)) == stored(before)
    after = ledger.lease("job")
    assert (after and stored(after)) == (lease and stored(lease)), "the fence did not move"


def test_a_running_attempt_whose_lease_is_valid_is_not_claimed_by_anyone(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot, holder="h1", max_attempts=5)
    lease = ledger.must_lease("job")

    for holder, trigger, exclusive in itertools.product(("h1", "h2"), TRIGGERS, (True, False)):
        again = slot_claim("job", slot, exclusive=exclusive, trigger=trigger, max_attempts=5)
        answers = ledger.answer([again], holder=holder)
        assert [x.status for x in answers] == ["taken"], (holder, trigger, exclusive)

    assert stored(ledger.must_get("job", slot)) == stored(run)
    assert stored(ledger.must_lease("job")) == stored(lease)


def test_a_running_attempt_whose_lease_expired_is_claimed_as_the_next_attempt_with_a_higher_fence(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.must_claim("job", slot, holder="h1", ttl_us=SHORT, max_attempts=2)
    ledger.wait_until(first.expires_us)  # type: ignore[arg-type]

    second = ledger.must_claim(
        "job", slot, holder="h2", ttl_us=LONG, max_attempts=2, run_id="second"
    )

    assert (second.state, second.attempt, second.holder, second.run_id) == (
        "running",
        2,
        "h2",
        "second",
    )
    assert second.fence > first.fence
    assert second.started_us == second.now_us >= first.expires_us  # type: ignore[operator]
    assert second.expires_us == second.now_us + LONG
    assert second.error is not None
    assert "attempt 1 lost" in second.error
    assert (second.finished_us, second.cancel_requested) == (None, False)
    lease = ledger.must_lease("job")
    assert (lease.holder, lease.fence, lease.held) == ("h2", second.fence, True)
    assert stored(ledger.must_get("job", slot)) == stored(second)


def test_a_running_attempt_that_expired_with_no_attempts_left_becomes_lost_and_is_not_claimed(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.must_claim("job", slot, holder="h1", ttl_us=SHORT, max_attempts=2)
    ledger.wait_until(first.expires_us)  # type: ignore[arg-type]
    second = ledger.must_claim("job", slot, holder="h2", ttl_us=SHORT, max_attempts=2)
    assert second.attempt == 2
    ledger.wait_until(second.expires_us)  # type: ignore[arg-type]
    lease = ledger.must_lease("job")
    job = ledger.must_job("job")

    assert ledger.status_of("job", slot, holder="h3", max_attempts=2) == "taken"

    lost = ledger.must_get("job", slot)
    assert (lost.state, lost.attempt, lost.fence, lost.holder) == ("lost", 2, second.fence, "h2")
    assert lost.expires_us is None
    assert lost.finished_us is not None
    assert second.expires_us <= lost.finished_us <= lost.now_us  # type: ignore[operator]
    assert stored(ledger.must_lease("job")) == stored(lease), "a claim that closes takes nothing"
    assert ledger.must_job("job").high_water_us == job.high_water_us
    # ``lost`` is final: even a claim allowing more attempts does not run it again.
    assert ledger.status_of("job", slot, holder="h3", max_attempts=5) == "taken"
    assert stored(ledger.must_get("job", slot)) == stored(lost)


def test_a_failed_attempt_with_a_retry_is_claimed_again_only_from_retry_at_while_attempts_remain(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.must_claim("job", slot, holder="h1", max_attempts=2)
    assert ledger.finish(
        first, "failed", exit_code=3, error="boom", output="partial", retry_after_us=SHORT
    )
    failed = ledger.must_get("job", slot)
    assert failed.finished_us is not None
    assert failed.retry_at_us == failed.finished_us + SHORT

    assert ledger.status_of("job", slot, holder="h2", max_attempts=2) == "taken"
    assert stored(ledger.must_get("job", slot)) == stored(failed)

    ledger.wait_until(failed.retry_at_us)
    second = ledger.must_claim("job", slot, holder="h2", max_attempts=2, run_id="retry")
    assert (second.state, second.attempt, second.holder, second.run_id) == (
        "running",
        2,
        "h2",
        "retry",
    )
    assert second.fence > first.fence
    assert second.started_us == second.now_us >= failed.retry_at_us
    assert (second.finished_us, second.retry_at_us, second.exit_code, second.output) == (
        None,
        None,
        None,
        None,
    )
    assert second.error is None

    # The last attempt fails too: its retry never comes.
    assert ledger.finish(second, "failed", exit_code=4, retry_after_us=1)
    last = ledger.must_get("job", slot)
    ledger.wait_until(last.retry_at_us)  # type: ignore[arg-type]
    assert ledger.status_of("job", slot, holder="h3", max_attempts=2) == "taken"
    assert stored(ledger.must_get("job", slot)) == stored(last)
    assert ledger.must_get("job", slot).state == "failed"


@pytest.mark.parametrize("trigger", ["manual", "backfill"])
def test_a_queued_slot_is_claimed_as_attempt_1(ledger: Ledger, trigger: str) -> None:
    (slot,) = ledger.past_slots(1)
    assert ledger.record("job", slot, "queued", trigger=trigger)
    queued = ledger.must_get("job", slot)
    assert (queued.state, queued.trigger, queued.expires_us) == ("queued", trigger, None)
    assert not queued.cancel_requested
    assert not ledger.record("job", slot, "skipped"), "a queued row is a row: not overwritten"
    assert not ledger.finish(queued, "succeeded"), "a queued row is not running"
    assert ledger.cancel("job") == 0, "only running rows are asked to stop"
    assert stored(ledger.must_get("job", slot)) == stored(queued)

    (run,) = ledger.claim(
        [slot_claim("job", slot, run_id="by-hand", trigger=trigger)], holder="h1", ttl_us=LONG
    )

    now = run.now_us
    assert run == dataclasses.replace(
        queued,
        state="running",
        attempt=1,
        fence=run.fence,
        holder="h1",
        run_id="by-hand",
        started_us=now,
        finished_us=None,
        expires_us=now + LONG,
        error=None,
        now_us=now,
    )
    assert run.fence >= now
    assert ledger.must_lease("job").fence == run.fence
    assert stored(ledger.must_get("job", slot)) == stored(run)
    assert ledger.status_of("job", slot, holder="h2", exclusive=False, trigger=trigger) == "taken"


def test_a_queued_slot_of_a_paused_job_is_claimed_by_hand_not_by_the_schedule(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    assert ledger.register("job", "{}", "fp") is None
    assert ledger.pause("job")
    assert ledger.record("job", slot, "queued", trigger="manual")

    assert ledger.status_of("job", slot, trigger="schedule") == "paused"
    assert ledger.must_get("job", slot).state == "queued"
    assert ledger.must_claim("job", slot, trigger="manual").attempt == 1


# -- run_claim: the job lease, pause, progress ------------------------------------------


def test_an_exclusive_claim_is_refused_while_the_job_lease_is_held_and_changes_nothing(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    holding = ledger.must_claim("job", s1, holder="h1")
    lease = ledger.must_lease("job")
    job = ledger.must_job("job")

    for holder in ("h1", "h2"):  # not re-entrant either
        for trigger in TRIGGERS:
            assert ledger.status_of("job", s2, holder=holder, trigger=trigger) == "busy"

    assert ledger.get("job", s2) is None
    assert stored(ledger.must_lease("job")) == stored(lease)
    assert stored(ledger.must_job("job")) == stored(job)
    assert stored(ledger.must_get("job", s1)) == stored(holding)


def test_a_non_exclusive_claim_runs_beside_the_lease_holder_and_only_moves_the_fence(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    holding = ledger.must_claim("job", s1, holder="h1")
    lease = ledger.must_lease("job")

    beside = ledger.must_claim("job", s2, holder="h2", exclusive=False)

    assert beside.fence > holding.fence
    assert (beside.state, beside.attempt, beside.holder) == ("running", 1, "h2")
    after = ledger.must_lease("job")
    assert stored(after) == stored(dataclasses.replace(lease, fence=beside.fence))
    assert after.held


def test_a_non_exclusive_claim_creates_the_job_lease_unheld_so_exclusive_claims_still_run(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    beside = ledger.must_claim("job", s1, exclusive=False)

    lease = ledger.must_lease("job")
    assert lease.fence == beside.fence
    assert not lease.held

    exclusive = ledger.must_claim("job", s2, holder="h2")
    assert exclusive.fence > beside.fence
    assert ledger.must_lease("job").holder == "h2"


def test_a_paused_job_is_not_claimed_by_its_schedule_but_is_by_every_other_trigger(
    ledger: Ledger,
) -> None:
    slots = ledger.past_slots(4)
    assert ledger.register("job", "{}", "fp") is None
    assert ledger.pause("job")

    assert ledger.status_of("job", slots[0], trigger="schedule") == "paused"
    assert ledger.get("job", slots[0]) is None
    others = [trigger for trigger in TRIGGERS if trigger != "schedule"]
    for trigger, slot in zip(others, slots[1:], strict=True):
        run = ledger.must_claim("job", slot, trigger=trigger, exclusive=False)
        assert run.trigger == trigger
        assert ledger.must_get("job", slot).trigger == trigger

    assert ledger.pause("job", False)
    assert ledger.must_claim("job", slots[0], exclusive=False).trigger == "schedule"


# -- run_claim: the deadline of a first attempt -----------------------------------------


def test_a_slot_without_a_row_claimed_past_its_deadline_is_recorded_missed_not_run(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    now = ledger.now()

    assert ledger.status_of("job", s2, deadline_us=now - 1) == "missed"

    row = ledger.must_get("job", s2)
    assert (row.state, row.attempt, row.fence, row.holder, row.trigger) == (
        "missed",
        0,
        0,
        "",
        "schedule",
    )
    assert row.error == MISSED_ERROR
    assert row.finished_us is not None
    assert row.finished_us >= now
    assert row.started_us is None
    assert row.expires_us is None
    lease = ledger.lease("job")
    assert lease is None or not lease.held, "a missed slot takes no lease"
    assert ledger.must_job("job").high_water_us == s2, "a missed slot is schedule progress"
    assert ledger.status_of("job", s2, holder="h2") == "taken", "missed is final"
    assert ledger.status_of("job", s2, holder="h2", trigger="manual") == "taken"

    # A deadline still ahead of the store's clock claims as usual.
    run = ledger.must_claim("job", s1, deadline_us=ledger.now() + MINUTE)
    assert (run.state, run.attempt) == ("running", 1)
    assert ledger.must_job("job").high_water_us == s2, "never moved back"


def test_a_late_first_attempt_is_missed_even_while_the_job_lease_is_held(ledger: Ledger) -> None:
    s1, s2 = ledger.past_slots(2)
    holding = ledger.must_claim("job", s1)

    assert ledger.status_of("job", s2, holder="h2") == "busy"
    assert ledger.status_of("job", s2, holder="h2", deadline_us=ledger.now() - 1) == "missed"

    assert ledger.must_get("job", s2).state == "missed"
    assert stored(ledger.must_get("job", s1)) == stored(holding), "the holder is untouched"
    assert ledger.must_lease("job").fence == holding.fence


def test_the_deadline_only_refuses_slots_without_a_row(ledger: Ledger) -> None:
    s1, s2, s3 = ledger.past_slots(3)
    past = ledger.now() - 1
    # A queued row (trigger, backfill) runs whenever it is claimed.
    assert ledger.record("job", s1, "queued", trigger="manual")
    assert ledger.must_claim("job", s1, trigger="manual", deadline_us=past).attempt == 1
    # An attempt whose holder vanished is retried, however late.
    first = ledger.must_claim("other", s2, ttl_us=SHORT, max_attempts=2)
    ledger.wait_until(first.expires_us)  # type: ignore[arg-type]
    retried = ledger.must_claim("other", s2, holder="h2", max_attempts=2, deadline_us=past)
    assert (retried.attempt, retried.fence > first.fence) == (2, True)
    # Refusals that come before the deadline keep their reason.
    later = ledger.now() + MINUTE
    assert ledger.status_of("later", later, deadline_us=past) == "not_due"
    assert ledger.register("resting") is None
    assert ledger.pause("resting")
    assert ledger.status_of("resting", s3, deadline_us=past) == "paused"
    assert ledger.get("resting", s3) is None
    assert ledger.get("later", later) is None


def test_high_water_is_the_latest_slot_claimed_by_schedule_or_exec_or_recorded(
    ledger: Ledger,
) -> None:
    s1, s2, s3, s4, s5, s6 = ledger.past_slots(6)

    ledger.must_claim("job", s3, exclusive=False)
    assert ledger.must_job("job").high_water_us == s3
    ledger.must_claim("job", s1, exclusive=False)
    assert ledger.must_job("job").high_water_us == s3
    assert ledger.record("job", s4, "missed")
    assert ledger.must_job("job").high_water_us == s4
    assert ledger.record("job", s2, "skipped")
    assert ledger.must_job("job").high_water_us == s4
    assert ledger.status_of("job", ledger.now() + MINUTE) == "not_due"  # refused: not moved
    assert ledger.must_job("job").high_water_us == s4
    assert ledger.status_of("job", s3, holder="h2", exclusive=False) == "taken"
    assert ledger.must_job("job").high_water_us == s4
    ledger.must_claim("job", s5, exclusive=False, trigger="exec")
    assert ledger.must_job("job").high_water_us == s5
    ledger.must_claim("job", s6, exclusive=False, trigger="schedule")
    assert ledger.must_job("job").high_water_us == s6


@pytest.mark.parametrize("trigger", ["manual", "backfill"])
def test_a_manual_or_backfill_claim_is_not_schedule_progress(ledger: Ledger, trigger: str) -> None:
    s1, s2 = ledger.past_slots(2)
    ledger.must_claim("job", s2, exclusive=False, trigger=trigger)
    job = ledger.job("job")  # whether this claim creates the job row is not specified
    assert job is None or job.high_water_us is None

    ledger.must_claim("job", s1, exclusive=False)
    assert ledger.must_job("job").high_water_us == s1
    assert ledger.record("job", s2 + 1, "queued", trigger=trigger)
    assert ledger.must_claim("job", s2 + 1, exclusive=False, trigger=trigger).attempt == 1
    assert ledger.must_job("job").high_water_us == s1


def test_the_same_slot_in_another_namespace_is_another_row(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    other = ledger.elsewhere()
    mine = ledger.must_claim("job", slot, holder="h1")

    theirs = other.must_claim("job", slot, holder="h2")  # exclusive: another job lease too

    assert (theirs.namespace, theirs.attempt) == (other.namespace, 1)
    assert ledger.finish(mine)
    assert other.must_get("job", slot).state == "running"
    assert [r.holder for r in other.runs()] == ["h2"]
    assert [r.holder for r in ledger.runs()] == ["h1"]
    assert other.cancel("job") == 1
    assert not ledger.must_get("job", slot).cancel_requested


# -- run_extend -------------------------------------------------------------------------


def test_extend_renews_the_holders_running_attempt_to_now_plus_ttl(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot, ttl_us=SHORT, exclusive=False)

    renewed = ledger.extend(run, ttl_us=LONG)

    assert renewed is not None
    assert renewed.expires_us == renewed.now_us + LONG
    assert stored(renewed) == stored(dataclasses.replace(run, expires_us=renewed.expires_us))
    assert stored(ledger.must_get("job", slot)) == stored(renewed)
    ledger.wait_until(run.expires_us)  # type: ignore[arg-type]
    assert ledger.status_of("job", slot, holder="h2", exclusive=False, max_attempts=5) == "taken"


def test_extend_is_refused_for_another_fence_and_changes_nothing(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot)
    lease = ledger.must_lease("job")

    for fence in (run.fence - 1, run.fence + 1, 0):
        assert ledger.extend(run, fence=fence, ttl_us=2 * LONG) is None

    assert stored(ledger.must_get("job", slot)) == stored(run)
    assert stored(ledger.must_lease("job")) == stored(lease)


def test_extend_is_refused_after_finish(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot)
    assert ledger.finish(run)
    done = ledger.must_get("job", slot)

    assert ledger.extend(run) is None
    assert stored(ledger.must_get("job", slot)) == stored(done)


def test_extend_is_refused_after_expiry_and_the_attempt_stays_expired(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot, ttl_us=SHORT, max_attempts=2)
    ledger.wait_until(run.expires_us)  # type: ignore[arg-type]

    assert ledger.extend(run) is None

    assert stored(ledger.must_get("job", slot)) == stored(run)
    assert not ledger.must_lease("job").held
    assert ledger.must_claim("job", slot, holder="h2", max_attempts=2).attempt == 2


def test_extend_renews_the_job_lease_carrying_the_same_fence_never_below_least(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    run = ledger.must_claim("job", s1, ttl_us=SHORT)
    renewed = ledger.extend(run, ttl_us=LONG)
    assert renewed is not None
    lease = ledger.must_lease("job")
    assert (lease.fence, lease.expires_us) == (run.fence, renewed.now_us + LONG)

    other = ledger.must_claim("other", s2, ttl_us=SHORT, least_us=LONG)
    before = ledger.must_lease("other")
    assert before.expires_us == other.now_us + SHORT
    assert before.min_until_us == other.now_us + LONG
    renewed = ledger.extend(other, ttl_us=SHORT)
    assert renewed is not None
    assert renewed.expires_us == renewed.now_us + SHORT, "the attempt itself has no least"
    assert ledger.must_lease("other").expires_us == before.min_until_us


def test_extend_leaves_a_job_lease_with_another_fence_or_expired_alone(ledger: Ledger) -> None:
    s1, s2, s3 = ledger.past_slots(3)
    first = ledger.must_claim("job", s1, exclusive=False)
    second = ledger.must_claim("job", s2, exclusive=False)
    lease = ledger.must_lease("job")
    assert lease.fence == second.fence
    assert not lease.held

    assert ledger.extend(first) is not None  # the lease carries another fence
    assert ledger.extend(second) is not None  # the lease carries this fence but is not held

    assert stored(ledger.must_lease("job")) == stored(lease)
    assert ledger.must_claim("job", s3, holder="h2").fence > second.fence


def test_run_cancel_flags_the_jobs_unexpired_running_attempts_and_extend_reports_it(
    ledger: Ledger,
) -> None:
    s1, s2, s3, s4 = ledger.past_slots(4)
    stale = ledger.must_claim("job", s1, ttl_us=SHORT, exclusive=False)
    ledger.wait_until(stale.expires_us)  # type: ignore[arg-type]
    first = ledger.must_claim("job", s2, exclusive=False)
    second = ledger.must_claim("job", s3, exclusive=False)
    done = ledger.must_claim("job", s4, exclusive=False)
    assert ledger.finish(done)
    other = ledger.must_claim("other", s2)
    assert not first.cancel_requested

    assert ledger.cancel("job") == 2

    renewed = ledger.extend(first)
    assert renewed is not None
    assert renewed.cancel_requested
    assert ledger.must_get("job", s3).cancel_requested
    assert stored(ledger.must_get("job", s3)) == stored(
        dataclasses.replace(second, cancel_requested=True)
    )
    assert not ledger.must_get("job", s1).cancel_requested
    assert not ledger.must_get("job", s4).cancel_requested
    assert not ledger.must_get("other", s2).cancel_requested
    assert ledger.cancel("nobody") == 0
    assert ledger.cancel("other") == 1
    renewed = ledger.extend(other)
    assert renewed is not None
    assert renewed.cancel_requested


def test_run_cancel_of_a_slot_asks_that_attempt_alone_and_writes_the_note_as_its_error(
    ledger: Ledger,
) -> None:
    s1, s2, s3, s4, s5 = ledger.past_slots(5)
    stale = ledger.must_claim("job", s1, ttl_us=SHORT, exclusive=False)
    ledger.wait_until(stale.expires_us)  # type: ignore[arg-type]
    first = ledger.must_claim("job", s2, exclusive=False)
    second = ledger.must_claim("job", s3, exclusive=False)
    done = ledger.must_claim("job", s4, exclusive=False)
    assert ledger.finish(done, "failed", exit_code=3, error="exit status 3")
    assert ledger.record("job", s5, "queued", trigger="manual")
    other = ledger.must_claim("other", s3)
    untouched = {
        (job, slot): stored(ledger.must_get(job, slot))
        for job, slot in (("job", s1), ("job", s4), ("job", s5), ("other", s3))
    }

    note = "cancelled by ops@host-a"
    assert ledger.cancel("job", s3, note) == 1
    asked = ledger.must_get("job", s3)
    assert stored(asked) == stored(dataclasses.replace(second, cancel_requested=True, error=note))
    assert stored(ledger.must_get("job", s2)) == stored(first), "another slot is not asked"

    # Only a running attempt whose lease has not expired is asked: an expired one (its
    # holder vanished), a finished, a queued slot and a slot without a row are not.
    for slot in (s1, s4, s5, s5 + 1):
        assert ledger.cancel("job", slot, note) == 0
    assert ledger.cancel("nobody", s3, note) == 0
    assert ledger.get("job", s5 + 1) is None
    assert ledger.get("nobody", s3) is None

    # Asking again counts again, and the newer note is the one kept.
    assert ledger.cancel("job", s3, "cancelled by web:10.0.0.7") == 1
    assert ledger.must_get("job", s3).error == "cancelled by web:10.0.0.7"

    # Every running attempt of the job, each with the note; without one, the note stays.
    assert ledger.cancel("job", note="cancelled by ☃ naïve 🔒 \x00") == 2
    for slot in (s2, s3):
        row = ledger.must_get("job", slot)
        assert (row.cancel_requested, row.error) == (True, "cancelled by ☃ naïve 🔒 \ufffd")
    assert ledger.cancel("job") == 2
    assert ledger.cancel("job", s2) == 1
    assert ledger.must_get("job", s2).error == "cancelled by ☃ naïve 🔒 \ufffd"

    assert {key: stored(ledger.must_get(*key)) for key in untouched} == untouched
    renewed = ledger.extend(first)
    assert renewed is not None
    assert (renewed.cancel_requested, renewed.error) == (True, "cancelled by ☃ naïve 🔒 \ufffd")
    assert ledger.extend(other) is not None
    assert not ledger.must_get("other", s3).cancel_requested


def test_an_attempt_asked_to_stop_finishes_with_the_outcome_it_reports(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot)
    assert ledger.cancel("job", slot, "cancelled by ops@host-a") == 1

    assert ledger.finish(run, "cancelled", exit_code=-15, error="cancelled by ops@host-a")
    row = ledger.must_get("job", slot)
    assert (row.state, row.exit_code, row.error) == ("cancelled", -15, "cancelled by ops@host-a")
    assert ledger.cancel("job", slot, "cancelled by someone else") == 0, "finished: not asked"
    assert ledger.must_get("job", slot).error == "cancelled by ops@host-a"


def test_a_new_attempt_starts_without_the_previous_attempts_cancel_request(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.must_claim("job", slot, ttl_us=SHORT, max_attempts=2)
    assert ledger.cancel("job") == 1
    assert ledger.must_get("job", slot).cancel_requested
    ledger.wait_until(first.expires_us)  # type: ignore[arg-type]

    second = ledger.must_claim("job", slot, holder="h2", max_attempts=2)

    assert second.attempt == 2
    assert not second.cancel_requested
    assert not ledger.must_get("job", slot).cancel_requested


# -- run_finish -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "exit_code", "error", "output"),
    [
        ("succeeded", 0, None, "done\n"),
        ("failed", 2, "exit status 2", "Traceback …\nValueError: naïve ☃ 🔒\n"),
        ("cancelled", -15, "cancelled by request", None),
        ("lost", None, "the worker vanished", ""),
    ],
)
def test_finish_records_the_outcome_at_the_store_clock(
    ledger: Ledger, state: str, exit_code: int | None, error: str | None, output: str | None
) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot)

    assert ledger.finish(run, state, exit_code=exit_code, error=error, output=output)

    row = ledger.must_get("job", slot)
    assert row.finished_us is not None
    assert run.now_us <= row.finished_us <= row.now_us
    assert stored(row) == stored(
        dataclasses.replace(
            run,
            state=state,
            finished_us=row.finished_us,
            expires_us=None,
            retry_at_us=None,
            exit_code=exit_code,
            error=error,
            output=output,
        )
    )


def test_finish_keeps_the_last_4096_characters_of_the_output(ledger: Ledger) -> None:
    s1, s2, s3 = ledger.past_slots(3)
    long_output = "".join(f"{line:05d} ü€🔒\n" for line in range(700))  # > 4096 chars and bytes
    exact_output = "é" * OUTPUT_LIMIT
    assert len(long_output) > OUTPUT_LIMIT

    for slot, output in ((s1, long_output), (s2, exact_output), (s3, "short")):
        run = ledger.must_claim("job", slot, exclusive=False)
        assert ledger.finish(run, "failed", output=output)

    assert ledger.must_get("job", s1).output == long_output[-OUTPUT_LIMIT:]
    assert ledger.must_get("job", s2).output == exact_output
    assert ledger.must_get("job", s3).output == "short"


def test_an_outcome_holding_nul_characters_is_recorded_with_them_replaced(
    ledger: Ledger,
) -> None:
    # A command may print a NUL byte, an exception may carry one: PostgreSQL's text cannot
    # hold it, so every backend stores U+FFFD instead, alone or in a batch.
    s1, s2, s3 = ledger.past_slots(3)
    alone = ledger.must_claim("job", s1, exclusive=False)
    assert ledger.finish(alone, "failed", error="bad\x00error", output="out\x00put\x00")
    batch = [ledger.must_claim("job", slot, exclusive=False) for slot in (s2, s3)]
    finishes = [
        RunFinish(run.job, run.slot_us, run.fence, RunOutcome(state="succeeded", output=text))
        for run, text in zip(batch, ("\x00", "tail \x00"), strict=True)
    ]
    assert ledger.store.run(ledger.ops.run_finish_many(ledger.namespace, finishes)) == [
        True,
        True,
    ]

    first = ledger.must_get("job", s1)
    assert (first.state, first.error, first.output) == (
        "failed",
        "bad\ufffderror",
        "out\ufffdput\ufffd",
    )
    assert [ledger.must_get("job", slot).output for slot in (s2, s3)] == ["\ufffd", "tail \ufffd"]


def test_a_late_completion_of_a_holder_paused_past_its_lease_is_refused(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.must_claim("job", slot, holder="h1", ttl_us=SHORT, max_attempts=2)
    ledger.wait_until(first.expires_us)  # type: ignore[arg-type]
    second = ledger.must_claim("job", slot, holder="h2", max_attempts=2)
    lease = ledger.must_lease("job")

    assert not ledger.finish(first, "succeeded", exit_code=0, output="late")

    assert stored(ledger.must_get("job", slot)) == stored(second)
    assert stored(ledger.must_lease("job")) == stored(lease)
    assert ledger.must_job("job").last_success_us is None
    assert ledger.extend(first) is None
    assert ledger.finish(second, "succeeded")
    assert ledger.must_get("job", slot).holder == "h2"


def test_finish_is_refused_for_another_fence_and_after_finish(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot)

    for fence in (run.fence - 1, run.fence + 1, 0):
        assert not ledger.finish(run, "failed", fence=fence)
    assert stored(ledger.must_get("job", slot)) == stored(run)
    assert ledger.must_lease("job").held

    assert ledger.finish(run, "succeeded", exit_code=0)
    done = ledger.must_get("job", slot)
    assert not ledger.finish(run, "failed", exit_code=1, retry_after_us=1)
    assert stored(ledger.must_get("job", slot)) == stored(done)


def test_finish_is_refused_after_expiry_and_leaves_the_attempt_running(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    run = ledger.must_claim("job", slot, ttl_us=SHORT)
    ledger.wait_until(run.expires_us)  # type: ignore[arg-type]

    assert not ledger.finish(run, "succeeded")

    assert stored(ledger.must_get("job", slot)) == stored(run)
    job = ledger.must_job("job")
    assert (job.last_success_us, job.last_failure_us) == (None, None)


def test_finish_releases_the_job_lease_so_the_next_exclusive_claim_runs_at_once(
    ledger: Ledger,
) -> None:
    s1, s2 = ledger.past_slots(2)
    first = ledger.must_claim("job", s1)
    assert ledger.status_of("job", s2, holder="h2") == "busy"

    assert ledger.finish(first)

    finished_us = ledger.must_get("job", s1).finished_us
    lease = ledger.must_lease("job")
    assert (lease.fence, lease.expires_us, lease.held) == (first.fence, finished_us, False)
    second = ledger.must_claim("job", s2, holder="h2")
    assert second.fence > first.fence


def test_finish_keeps_the_job_lease_until_least_us(ledger: Ledger) -> None:
    s1, s2 = ledger.past_slots(2)
    first = ledger.must_claim("job", s1, least_us=SECOND)
    assert ledger.finish(first)

    lease = ledger.must_lease("job")
    assert lease.expires_us == first.now_us + SECOND == lease.min_until_us
    if ledger.now() < lease.min_until_us:
        assert ledger.status_of("job", s2, holder="h2") == "busy"
    ledger.wait_until(lease.min_until_us)
    assert ledger.must_claim("job", s2, holder="h2").fence > first.fence


def test_finish_does_not_release_a_job_lease_carrying_another_fence(ledger: Ledger) -> None:
    s1, s2, s3 = ledger.past_slots(3)
    beside = ledger.must_claim("job", s1, exclusive=False)  # the lease row stays unheld
    holding = ledger.must_claim("job", s2, holder="h2")  # takes the lease with a newer fence
    lease = ledger.must_lease("job")
    assert lease.held
    assert lease.fence == holding.fence

    assert ledger.finish(beside)

    assert stored(ledger.must_lease("job")) == stored(lease)
    assert ledger.status_of("job", s3, holder="h3") == "busy"
    assert ledger.extend(holding) is not None


def test_finish_sets_the_jobs_last_success_and_last_failure(ledger: Ledger) -> None:
    slots = ledger.past_slots(4)
    assert ledger.register("job", "{}", "fp") is None
    runs = [ledger.must_claim("job", slot, exclusive=False) for slot in slots]

    def finish(run: RunRecord, state: str) -> int:
        assert ledger.finish(run, state)
        finished = ledger.must_get("job", run.slot_us).finished_us
        assert finished is not None
        return finished

    succeeded = finish(runs[0], "succeeded")
    job = ledger.must_job("job")
    assert (job.last_success_us, job.last_failure_us) == (succeeded, None)

    failed = finish(runs[1], "failed")
    job = ledger.must_job("job")
    assert (job.last_success_us, job.last_failure_us) == (succeeded, failed)

    finish(runs[2], "cancelled")
    job = ledger.must_job("job")
    assert (job.last_success_us, job.last_failure_us) == (succeeded, failed)

    lost = finish(runs[3], "lost")
    job = ledger.must_job("job")
    assert (job.last_success_us, job.last_failure_us) == (succeeded, lost)
    assert json.loads(job.definition) == {}
    assert job.fingerprint == "fp"


# -- run_finish_many --------------------------------------------------------------------


def test_finish_many_answers_each_finish_in_order_as_run_finish_would(ledger: Ledger) -> None:
    s1, s2, s3, s4, s5 = ledger.past_slots(5)
    assert ledger.register("job", "{}", "fp") is None
    ok = ledger.must_claim("job", s1, exclusive=False)
    stale = ledger.must_claim("job", s2, exclusive=False)
    retried = ledger.must_claim("job", s3, exclusive=False, max_attempts=2)
    holding = ledger.must_claim("other", s4)  # the exclusive one: holds its job lease
    done = ledger.must_claim("job", s5, exclusive=False)
    assert ledger.finish(done)
    done_row = ledger.must_get("job", s5)
    long_output = "x" * (OUTPUT_LIMIT + 10) + "end"
    finishes = [
        RunFinish("job", s1, ok.fence, RunOutcome(state="succeeded", exit_code=0, output="ok")),
        RunFinish("job", s2, stale.fence + 1, RunOutcome(state="succeeded")),
        RunFinish(
            "job", s3, retried.fence, RunOutcome(state="failed", error="boom", retry_after_us=1)
        ),
        RunFinish("other", s4, holding.fence, RunOutcome(state="failed", output=long_output)),
        RunFinish("job", s5, done.fence, RunOutcome(state="failed")),
        RunFinish("never-claimed", s1, 7, RunOutcome(state="succeeded")),
    ]

    answers = ledger.store.run(ledger.ops.run_finish_many(ledger.namespace, finishes))

    assert answers == [True, False, True, True, False, False]
    assert ledger.must_get("job", s1).state == "succeeded"
    assert ledger.must_get("job", s1).output == "ok"
    assert stored(ledger.must_get("job", s2)) == stored(stale)  # refused: unchanged
    third = ledger.must_get("job", s3)
    assert (third.state, third.error) == ("failed", "boom")
    assert third.retry_at_us is not None
    fourth = ledger.must_get("other", s4)
    assert (fourth.state, fourth.output) == ("failed", long_output[-OUTPUT_LIMIT:])
    assert not ledger.must_lease("other").held  # its finish released the job lease
    assert stored(ledger.must_get("job", s5)) == stored(done_row)
    assert ledger.get("never-claimed", s1) is None
    job = ledger.must_job("job")
    assert job.last_success_us == ledger.must_get("job", s1).finished_us
    assert job.last_failure_us == third.finished_us


def test_finish_many_of_nothing_answers_nothing(ledger: Ledger) -> None:
    assert ledger.store.run(ledger.ops.run_finish_many(ledger.namespace, [])) == []


# -- run_record, run_list, run_prune ----------------------------------------------------


@pytest.mark.parametrize("state", ["skipped", "missed"])
def test_run_record_inserts_a_final_row_once(ledger: Ledger, state: str) -> None:
    (slot,) = ledger.past_slots(1)
    before = ledger.now()

    assert ledger.record("job", slot, state, error="overlap", trigger="backfill")

    row = ledger.must_get("job", slot)
    assert (row.job, row.slot_us, row.state, row.error, row.trigger) == (
        "job",
        slot,
        state,
        "overlap",
        "backfill",
    )
    assert row.finished_us is not None
    assert before <= row.finished_us <= row.now_us
    assert (row.expires_us, row.retry_at_us, row.cancel_requested) == (None, None, False)
    assert not ledger.record("job", slot, "missed", error="again")
    assert not ledger.record("job", slot, "skipped")
    assert stored(ledger.must_get("job", slot)) == stored(row)


def test_run_record_never_overwrites_a_running_or_finished_row(ledger: Ledger) -> None:
    s1, s2 = ledger.past_slots(2)
    running = ledger.must_claim("job", s1, exclusive=False)
    finished = ledger.must_claim("job", s2, exclusive=False)
    assert ledger.finish(finished, "failed", exit_code=1)
    done = ledger.must_get("job", s2)

    for state in ("skipped", "missed"):
        assert not ledger.record("job", s1, state)
        assert not ledger.record("job", s2, state)

    assert stored(ledger.must_get("job", s1)) == stored(running)
    assert stored(ledger.must_get("job", s2)) == stored(done)


def test_record_many_answers_each_note_in_order_as_run_record_would(ledger: Ledger) -> None:
    s1, s2, s3, s4 = ledger.past_slots(4)
    running = ledger.must_claim("job", s1, exclusive=False)
    assert ledger.record("job", s2, "skipped")
    future = ledger.now() + 3_600_000_000
    notes = [
        RunNote("job", s1, "missed", "late", "schedule"),  # running: kept
        RunNote("job", s2, "missed", "late", "schedule"),  # recorded already: kept
        RunNote("job", s3, "missed", "late", "schedule"),
        RunNote("other", s4, "skipped", "overlap", "backfill"),
        RunNote("job", s4, "missed", None, "schedule"),
        RunNote("job", s3, "skipped", "again", "schedule"),  # the batch's own row: kept
        RunNote("job", future, "missed", None, "schedule"),  # not due: never a row
    ]

    answers = ledger.store.run(ledger.ops.run_record_many(ledger.namespace, notes))

    assert answers == [False, False, True, True, True, False, False]
    assert stored(ledger.must_get("job", s1)) == stored(running)
    assert ledger.must_get("job", s2).state == "skipped"
    third = ledger.must_get("job", s3)
    assert (third.state, third.error, third.trigger) == ("missed", "late", "schedule")
    other = ledger.must_get("other", s4)
    assert (other.state, other.error, other.trigger) == ("skipped", "overlap", "backfill")
    assert ledger.must_get("job", s4).error is None
    assert ledger.get("job", future) is None
    assert ledger.must_job("job").high_water_us == s4
    assert ledger.must_job("other").high_water_us == s4


def test_record_many_of_nothing_answers_nothing(ledger: Ledger) -> None:
    assert ledger.store.run(ledger.ops.run_record_many(ledger.namespace, [])) == []


def test_run_settled_names_the_slots_with_a_row_other_than_queued(ledger: Ledger) -> None:
    s1, s2, s3, s4, s5 = ledger.past_slots(5)
    running = ledger.must_claim("a", s1)
    ledger.must_claim("b", s2, exclusive=False)
    assert ledger.finish(ledger.must_claim("b", s3, exclusive=False))
    assert ledger.record("a", s4, "missed")
    assert ledger.record("a", s5, "queued", trigger="manual")
    assert ledger.elsewhere().record("c", s1, "skipped")
    odd = "naïve ☃ 名前"
    ledger.must_claim(odd, s2)
    # Rows a retry or a recovery would still claim count too: a first attempt cannot.
    failed = ledger.must_claim("d", s1, max_attempts=2, exclusive=False)
    assert ledger.finish(failed, "failed", retry_after_us=1)
    expired = ledger.must_claim("e", s1, ttl_us=SHORT, max_attempts=2)
    ledger.wait_until((expired.expires_us or 0) + 1)
    asked = [("a", s1), ("b", s2), ("b", s3), ("a", s4), ("a", s5), ("c", s1), ("a", s2)]

    assert ledger.settled([*asked, (odd, s2), ("d", s1), ("e", s1)]) == {
        ("a", s1),
        ("b", s2),
        ("b", s3),
        ("a", s4),
        (odd, s2),
        ("d", s1),
        ("e", s1),
    }
    assert ledger.settled([]) == set()
    assert ledger.settled([("a", s5)]) == set(), "queued rows are still to be claimed"
    assert stored(ledger.must_get("a", s1)) == stored(running), "a read changes nothing"


def test_run_get_of_a_slot_without_a_row_is_none(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    ledger.must_claim("job", slot)
    assert ledger.get("job", slot + 1) is None
    assert ledger.get("other", slot) is None


def test_run_list_returns_newest_slot_first_for_one_job_or_all_up_to_the_limit(
    ledger: Ledger,
) -> None:
    s0, s1, s2, s3, s4, s5 = ledger.past_slots(6)
    for job, slot in (("a", s0), ("a", s2), ("a", s4), ("b", s1), ("b", s5)):
        assert ledger.record(job, slot, "skipped")
    ledger.must_claim("c", s3)
    assert ledger.elsewhere().record("a", s5, "missed")

    everything = [(r.job, r.slot_us) for r in ledger.runs()]
    assert everything == [("b", s5), ("a", s4), ("c", s3), ("a", s2), ("b", s1), ("a", s0)]
    assert all(r.namespace == ledger.namespace for r in ledger.runs())
    assert [r.slot_us for r in ledger.runs("a")] == [s4, s2, s0]
    assert [(r.job, r.slot_us) for r in ledger.runs(None, 2)] == everything[:2]
    assert [r.slot_us for r in ledger.runs("a", 1)] == [s4]
    assert [r.state for r in ledger.runs("c")] == ["running"]
    assert ledger.runs("nobody") == []
    stored_rows = {(r.job, r.slot_us): stored(r) for r in ledger.runs()}
    assert stored_rows[("c", s3)] == stored(ledger.must_get("c", s3))


def test_run_list_many_answers_each_job_as_run_list_would_in_input_order(ledger: Ledger) -> None:
    s0, s1, s2, s3 = ledger.past_slots(4)
    for job, slot in (("a", s0), ("a", s2), ("a", s3), ("b", s1)):
        assert ledger.record(job, slot, "skipped")
    ledger.must_claim("c", s3)
    assert ledger.elsewhere().record("a", s1, "missed")
    odd = "naïve ☃ 名前"
    assert ledger.record(odd, s0, "missed")

    def many(jobs: list[str], limit: int) -> list[list[RunRecord]]:
        return ledger.store.run(ledger.ops.run_list_many(ledger.namespace, jobs, limit))

    answers = many(["c", "nobody", "a", odd, "b", "a"], 2)
    assert [[(r.job, r.slot_us) for r in rows] for rows in answers] == [
        [("c", s3)],
        [],
        [("a", s3), ("a", s2)],
        [(odd, s0)],
        [("b", s1)],
        [("a", s3), ("a", s2)],
    ]
    assert all(r.namespace == ledger.namespace for rows in answers for r in rows)
    assert [stored(r) for r in many(["a"], 10)[0]] == [stored(r) for r in ledger.runs("a")]
    assert stored(answers[0][0]) == stored(ledger.must_get("c", s3))
    assert many([], 5) == []
    assert many(["a", "b"], 0) == [[], []]


def test_run_list_many_without_output_leaves_only_the_output_out(ledger: Ledger) -> None:
    [slot] = ledger.past_slots(1)
    run = ledger.must_claim("a", slot)
    assert ledger.finish(run, "failed", exit_code=3, error="boom", output="a long tail\n" * 50)

    [[whole]] = ledger.store.run(ledger.ops.run_list_many(ledger.namespace, ["a"], 5))
    [[bare]] = ledger.store.run(ledger.ops.run_list_many(ledger.namespace, ["a"], 5, output=False))

    assert whole.output == "a long tail\n" * 50
    assert bare.output is None
    assert stored(bare) == dataclasses.replace(stored(whole), output=None)


def test_run_running_is_what_run_list_many_holds_of_the_runs_in_progress(ledger: Ledger) -> None:
    s0, s1, s2, s3, s4 = ledger.past_slots(5)
    for slot in (s0, s1, s2):
        assert ledger.record("a", slot, "skipped")
    held = ledger.must_claim("a", s3, exclusive=False)  # newest: running
    ledger.must_claim("b", s0, exclusive=False)  # running, but under three newer rows
    for slot in (s1, s2, s3):
        assert ledger.record("b", slot, "missed")
    lapsed = ledger.must_claim("c", s4, exclusive=False, ttl_us=1)  # its holder vanished
    done = ledger.must_claim("d", s4, exclusive=False)
    assert ledger.finish(done)
    ledger.elsewhere().must_claim("a", s4)  # another namespace
    ledger.must_claim("e", s4, exclusive=False)  # not asked for
    jobs = ["a", "b", "c", "d", "nobody"]

    def running(limit: int) -> list[RunRecord]:
        return ledger.store.run(ledger.ops.run_running(ledger.namespace, jobs, limit))

    def expected(limit: int) -> list[tuple[str, int]]:
        listed = ledger.store.run(ledger.ops.run_list_many(ledger.namespace, jobs, limit))
        return sorted(
            ((run.job, run.slot_us) for rows in listed for run in rows if run.state == "running"),
            key=lambda pair: (pair[0], -pair[1]),
        )

    assert [(run.job, run.slot_us) for run in running(3)] == expected(3)
    assert expected(3) == [("a", s3), ("c", s4)]
    assert [(run.job, run.slot_us) for run in running(4)] == expected(4)
    assert expected(4) == [("a", s3), ("b", s0), ("c", s4)]
    found = {run.job: run for run in running(50)}
    assert stored(found["a"]) == stored(held)
    assert found["c"].expires_us == lapsed.expires_us
    assert all(run.namespace == ledger.namespace for run in found.values())
    assert ledger.store.run(ledger.ops.run_running(ledger.namespace, [], 50)) == []
    assert running(0) == []


def test_run_prune_keeps_the_newest_final_rows_per_job_and_every_running_row(
    ledger: Ledger,
) -> None:
    s0, s1, s2, s3, s4, s5 = ledger.past_slots(6)
    ledger.must_claim("a", s0)  # running: never pruned
    for slot in (s1, s2, s3, s4, s5):
        assert ledger.record("a", slot, "skipped")
        assert ledger.elsewhere().record("a", slot, "skipped")
    done = ledger.must_claim("b", s1)
    assert ledger.finish(done)

    assert ledger.prune(keep=2, older_than_us=10 * 24 * 3600 * SECOND) == 3

    assert [r.slot_us for r in ledger.runs("a")] == [s5, s4, s0]
    assert [r.slot_us for r in ledger.runs("b")] == [s1]
    assert len(ledger.elsewhere().runs()) == 5
    assert ledger.prune(keep=2, older_than_us=10 * 24 * 3600 * SECOND) == 0
    assert ledger.record("q", s3, "queued", trigger="manual")  # not final: never pruned
    assert ledger.prune(keep=0, older_than_us=0) == 3
    assert [(r.job, r.slot_us, r.state) for r in ledger.runs()] == [
        ("q", s3, "queued"),
        ("a", s0, "running"),
    ]


def test_run_prune_drops_final_rows_finished_longer_ago_than_the_age_but_no_running_row(
    ledger: Ledger,
) -> None:
    age = 1_000_000  # far longer than the few statements between the last record and prune
    s0, s1, s2, s3 = ledger.past_slots(4)
    assert ledger.record("a", s0, "missed")
    assert ledger.record("b", s1, "skipped")
    expired = ledger.must_claim("a", s2, ttl_us=SHORT)  # expires, stays running
    old = max(ledger.must_get("a", s0).finished_us or 0, ledger.must_get("b", s1).finished_us or 0)
    ledger.wait_until(max(old + age + 1, expired.expires_us or 0))
    assert ledger.record("a", s3, "skipped")

    assert ledger.prune(keep=100, older_than_us=age) == 2

    assert [(r.job, r.slot_us, r.state) for r in ledger.runs()] == [
        ("a", s3, "skipped"),
        ("a", s2, "running"),
    ]


# -- run_backfill -----------------------------------------------------------------------


def test_a_backfill_queues_each_slot_without_a_row_once_and_counts_them(ledger: Ledger) -> None:
    slots = ledger.past_slots(6)
    running = ledger.must_claim("job", slots[1])
    assert ledger.record("job", slots[3], "missed")
    high_water = ledger.must_job("job").high_water_us
    before = ledger.now()
    future = before + MINUTE
    # Out of order, one slot twice, one the store's clock has not reached.
    asked = [slots[5], *slots, slots[0], future]

    queued = ledger.store.run(ledger.ops.run_backfill(ledger.namespace, "job", asked))

    assert queued == 4
    rows = {run.slot_us: run for run in ledger.runs("job")}
    assert sorted(rows) == slots, "never a row for a slot the clock has not reached"
    assert stored(rows[slots[1]]) == stored(ledger.must_get("job", slots[1]))
    assert rows[slots[1]].run_id == running.run_id, "a row is never overwritten"
    assert rows[slots[3]].state == "missed"
    fresh = [slots[0], slots[2], slots[4], slots[5]]
    for slot in fresh:
        row = rows[slot]
        assert (row.state, row.trigger, row.attempt, row.fence, row.holder, row.run_id) == (
            "queued",
            "backfill",
            0,
            0,
            "",
            "",
        )
        assert row.finished_us is not None
        assert before <= row.finished_us <= row.now_us
        assert (row.started_us, row.expires_us, row.error) == (None, None, None)
    assert ledger.must_job("job").high_water_us == high_water, "not schedule progress"
    due = ledger.store.run(ledger.ops.run_due(ledger.namespace, 10, ["job"]))
    assert [(r.slot_us, r.state) for r in due] == [(slot, "queued") for slot in fresh]

    assert ledger.store.run(ledger.ops.run_backfill(ledger.namespace, "job", slots)) == 0
    assert ledger.store.run(ledger.ops.run_backfill(ledger.namespace, "job", [])) == 0
    assert {run.slot_us: stored(run) for run in ledger.runs("job")} == {
        slot: stored(run) for slot, run in rows.items()
    }


@contextlib.contextmanager
def failing_midway(backend_url: str, ledger: Ledger, job: str, slot_us: int) -> Iterator[None]:
    """Make the store fail a write of ``job``'s rows partway through, as each backend can:
    the database file cannot grow (SQLite); another transaction holds the key of
    ``slot_us`` past this session's lock timeout, after the rows before it were inserted
    (PostgreSQL, MySQL); the job's slot index is not a sorted set (Redis)."""
    store: Any = ledger.store
    kind = parse_store_url(backend_url).kind
    if kind == "memory":
        pytest.skip("memory:// is one process: nothing fails between a step's checks and writes")
    if kind == "etcd":
        pytest.skip("etcd applies a backfill's one txn whole or not at all: nothing to fail midway")
    if kind == "sqlite":
        (pages,) = store.execute_text("PRAGMA page_count").rows[0]
        store.execute_text(f"PRAGMA max_page_count = {pages + 2}")  # this connection's only
        yield
        return
    if kind in ("redis", "redis-cluster", "redis-sentinel"):
        client = raw_client(backend_url)
        index = slots_key(ledger.namespace, job)
        client.set(index, "not a sorted set")
        try:
            yield
        finally:
            client.delete(index)
            client.close()
        return
    blocker: Any = open_store(parse_store_url(backend_url))
    begin, timeout = (
        ("BEGIN", "SET lock_timeout = '300ms'")
        if kind == "postgres"
        else ("START TRANSACTION", "SET SESSION innodb_lock_wait_timeout = 1")
    )
    column = "trigger" if kind == "postgres" else "`trigger`"
    try:
        blocker.execute_text(begin)
        blocker.execute_text(
            "INSERT INTO fleetcron_run (namespace, job, slot_us, state, attempt, fence, "
            f"holder, run_id, {column}) VALUES (%(namespace)s, %(job)s, %(slot_us)s, "
            "'queued', 0, 0, '', '', 'manual')",
            {"namespace": ledger.namespace, "job": job, "slot_us": slot_us},
        )
        store.execute_text(timeout)
        yield
    finally:
        blocker.execute_text("ROLLBACK")
        blocker.close()


def test_a_backfill_that_fails_midway_writes_no_row(ledger: Ledger, backend_url: str) -> None:
    slots = ledger.past_slots(2_000, step_us=SECOND)

    with failing_midway(backend_url, ledger, "job", slots[len(slots) // 2]):
        with pytest.raises(StoreError):
            ledger.store.run(ledger.ops.run_backfill(ledger.namespace, "job", slots))

    assert [slot for slot in slots if ledger.get("job", slot) is not None] == []
    assert ledger.store.run(ledger.ops.run_backfill(ledger.namespace, "job", slots)) == len(slots)


# -- jobs and the clock -----------------------------------------------------------------


def test_job_register_returns_none_for_a_new_job_then_the_row_as_it_was_before(
    ledger: Ledger,
) -> None:
    first_definition = '{"schedule":"*/5 * * * *","command":["echo","naïve ☃"]}'
    before = ledger.now()
    assert ledger.register("job", first_definition, "fp-1") is None

    row = ledger.must_job("job")
    assert (row.job, row.paused, row.fingerprint) == ("job", False, "fp-1")
    assert json.loads(row.definition) == json.loads(first_definition)
    assert (row.high_water_us, row.last_success_us, row.last_failure_us) == (None, None, None)
    assert before <= row.updated_us <= row.now_us

    previous = ledger.register("job", '{"schedule":"@hourly"}', "fp-2")

    assert previous is not None
    assert stored(previous) == stored(row)
    again = ledger.must_job("job")
    assert (json.loads(again.definition), again.fingerprint) == ({"schedule": "@hourly"}, "fp-2")
    assert again.updated_us >= row.updated_us


def test_job_register_of_many_jobs_answers_each_in_input_order(ledger: Ledger) -> None:
    assert ledger.register("b", '{"v": 0}', "fp-b0") is None
    many = [(f"job-{k:03d}", f'{{"k": {k}}}', f"fp-{k}") for k in range(120)]
    registered = [many[7], ("b", '{"v": 1}', "fp-b1"), *many]

    befores = ledger.store.run(ledger.ops.job_register(ledger.namespace, registered))

    assert len(befores) == len(registered)
    assert befores[0] is None
    assert all(before is None for before in befores[2:9])
    assert befores[1] is not None
    assert befores[1].fingerprint == "fp-b0"
    assert befores[9] is not None, "seen earlier"
    assert befores[9].fingerprint == "fp-7", "seen earlier"
    rows = {row.job: row for row in ledger.store.run(ledger.ops.job_list(ledger.namespace))}
    assert {name: (row.definition, row.fingerprint) for name, row in rows.items()} == {
        name: (definition, fp) for name, definition, fp in registered
    }
    assert ledger.store.run(ledger.ops.job_register(ledger.namespace, [])) == []


def test_job_register_keeps_the_paused_flag_and_the_progress(ledger: Ledger) -> None:
    s1, s2 = ledger.past_slots(2)
    assert ledger.register("job", "{}", "fp-1") is None
    assert ledger.pause("job")
    ok = ledger.must_claim("job", s2, trigger="manual", exclusive=False)
    bad = ledger.must_claim("job", s1, trigger="manual", exclusive=False)
    assert ledger.finish(ok)
    assert ledger.finish(bad, "failed")
    progress = ledger.must_job("job")

    previous = ledger.register("job", '{"x":1}', "fp-2")

    assert previous is not None
    assert stored(previous) == stored(progress)
    row = ledger.must_job("job")
    assert row.paused
    assert progress.high_water_us is None  # manual runs are not schedule progress
    assert (row.high_water_us, row.last_success_us, row.last_failure_us) == (
        progress.high_water_us,
        progress.last_success_us,
        progress.last_failure_us,
    )
    assert ledger.status_of("job", s2 + 1) == "paused", "still paused"


def test_job_register_of_a_job_first_seen_by_a_claim_returns_the_row_the_claim_created(
    ledger: Ledger,
) -> None:
    (slot,) = ledger.past_slots(1)
    ledger.must_claim("job", slot)
    created = ledger.must_job("job")

    previous = ledger.register("job", '{"a":1}', "fp")

    assert previous is not None
    assert stored(previous) == stored(created)
    assert ledger.must_job("job").high_water_us == slot


def test_job_set_paused_pauses_and_resumes_a_known_job(ledger: Ledger) -> None:
    assert ledger.register("job", "{}", "fp") is None
    assert ledger.pause("job") is True
    assert ledger.must_job("job").paused
    assert ledger.pause("job") is True  # already paused: still known
    assert ledger.must_job("job").paused
    assert ledger.pause("job", False) is True
    assert not ledger.must_job("job").paused
    assert ledger.pause("job", False) is True  # a registered row stays when resumed
    assert ledger.must_job("job").definition == "{}"


def test_a_job_paused_before_any_replica_registers_it_starts_paused(ledger: Ledger) -> None:
    assert ledger.pause("later") is True
    ahead = ledger.must_job("later")
    assert (ahead.paused, ahead.definition, ahead.fingerprint) == (True, "{}", "")
    assert (ahead.high_water_us, ahead.last_success_us, ahead.last_failure_us) == (None,) * 3
    assert [row.job for row in ledger.jobs()] == ["later"]

    previous = ledger.register("later", '{"every": "1m"}', "fp")  # the deploy

    assert previous is not None
    assert (previous.paused, previous.definition) == (True, "{}")
    row = ledger.must_job("later")
    assert (row.paused, row.definition, row.fingerprint) == (True, '{"every": "1m"}', "fp")
    (slot,) = ledger.past_slots(1)
    assert ledger.status_of("later", slot) == "paused", "its schedule claims nothing"
    assert ledger.pause("later", False) is True
    assert not ledger.must_job("later").paused
    assert ledger.must_claim("later", slot).state == "running"


def test_resuming_a_pause_recorded_ahead_removes_it_and_an_unknown_job_stays_unknown(
    ledger: Ledger,
) -> None:
    assert ledger.pause("nobody", False) is False
    assert ledger.job("nobody") is None, "resuming does not create a job"

    assert ledger.pause("typo") is True
    assert ledger.pause("typo", False) is True
    assert ledger.job("typo") is None, "nothing but the pause was there: the row goes"
    assert ledger.jobs() == []

    # A row that holds more than the pause stays, resumed: a job a claim saw first.
    (slot,) = ledger.past_slots(1)
    assert ledger.pause("seen") is True
    assert ledger.must_claim("seen", slot, trigger="manual", exclusive=False)
    assert ledger.pause("seen", False) is True
    assert not ledger.must_job("seen").paused


def test_job_get_of_an_unknown_job_is_none(ledger: Ledger) -> None:
    assert ledger.job("nobody") is None


def test_job_list_returns_the_namespaces_jobs_sorted_by_name(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    for job in ("🔒 lock", "alpha", "Zulu", "naïve ☃"):
        assert ledger.register(job, "{}", f"fp-{job}") is None
    ledger.must_claim("bravo", slot)  # a job first seen by a claim is listed too
    assert ledger.elsewhere().register("aardvark", "{}", "fp") is None

    names = [row.job for row in ledger.jobs()]

    assert names == sorted(["🔒 lock", "alpha", "Zulu", "naïve ☃", "bravo"])
    assert all(row.namespace == ledger.namespace for row in ledger.jobs())
    assert [row.job for row in ledger.elsewhere().jobs()] == ["aardvark"]


def test_job_namespaces_are_the_namespaces_that_hold_a_job_row(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    odd = Ledger(ledger.store, f"{ledger.namespace}:{{3:x}}:job ☃")  # a key's characters
    assert ledger.register("job", "{}", "fp") is None
    odd.must_claim("first-seen-by-a-claim", slot)
    leases_only = Ledger(ledger.store, f"{ledger.namespace}-leases")
    must_acquire(leases_only.store, leases_only.namespace, "lock", "holder")

    found = ledger.store.run(ledger.ops.job_namespaces())

    assert found == sorted(set(found))
    mine = [ns for ns in found if ns.startswith(ledger.namespace)]
    assert mine == sorted([ledger.namespace, odd.namespace])  # a namespace of leases is not


def test_store_now_is_the_clock_the_records_carry(ledger: Ledger) -> None:
    (slot,) = ledger.past_slots(1)
    first = ledger.now()
    run = ledger.must_claim("job", slot)
    second = ledger.now()
    row = ledger.must_get("job", slot)
    third = ledger.now()
    job = ledger.must_job("job")
    fourth = ledger.now()

    assert first <= run.now_us <= second
    assert run.started_us == run.now_us
    assert second <= row.now_us <= third
    assert third <= job.now_us <= fourth
    assert fourth - first < 10 * SECOND


def test_no_row_is_ever_recorded_for_a_slot_the_store_clock_has_not_reached(
    ledger: Ledger,
) -> None:
    future = ledger.now() + 60 * SECOND
    for state in ("skipped", "missed", "queued"):
        assert not ledger.record("job", future, state)
    assert ledger.get("job", future) is None


def test_run_due_lists_what_to_claim_again_oldest_first_however_old(ledger: Ledger) -> None:
    slots = ledger.past_slots(6)
    expired = ledger.must_claim("a", slots[0], ttl_us=SHORT)
    assert ledger.record("a", slots[1], "queued", trigger="manual")
    failed = ledger.must_claim("b", slots[2], max_attempts=2, exclusive=False)
    assert ledger.finish(failed, "failed", retry_after_us=1)
    done = ledger.must_claim("b", slots[3], exclusive=False)
    assert ledger.finish(done)
    ledger.must_claim("c", slots[4])  # running and valid: not due
    assert ledger.record("c", slots[5], "missed")  # final: never due
    ledger.wait_until((expired.expires_us or 0) + 1)

    due = ledger.store.run(ledger.ops.run_due(ledger.namespace, 10))

    assert [(r.job, r.slot_us, r.state) for r in due] == [
        ("a", slots[0], "running"),
        ("a", slots[1], "queued"),
        ("b", slots[2], "failed"),
    ]
    assert [r.slot_us for r in ledger.store.run(ledger.ops.run_due(ledger.namespace, 1))] == [
        slots[0]
    ]


def test_run_due_of_named_jobs_leaves_the_other_jobs_rows_out_of_the_limit(
    ledger: Ledger,
) -> None:
    slots = ledger.past_slots(5)
    odd = "naïve ☃ 名前"
    for slot in slots[:3]:  # the oldest due rows belong to a job this caller does not run
        assert ledger.record("gone", slot, "queued", trigger="manual")
    assert ledger.record("a", slots[3], "queued", trigger="manual")
    assert ledger.record(odd, slots[4], "queued", trigger="backfill")
    assert ledger.elsewhere().record("a", slots[0], "queued", trigger="manual")

    def due(limit: int, jobs: list[str] | None) -> list[tuple[str, int]]:
        rows = ledger.store.run(ledger.ops.run_due(ledger.namespace, limit, jobs))
        return [(r.job, r.slot_us) for r in rows]

    assert due(2, None) == [("gone", slots[0]), ("gone", slots[1])]
    assert due(2, ["a", odd, "never-seen"]) == [("a", slots[3]), (odd, slots[4])]
    assert due(1, ["a", odd]) == [("a", slots[3])]
    assert due(10, []) == []
