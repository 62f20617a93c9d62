"""The run ledger on a real Redis: every rule of docs/design/ledger.md, held by Lua scripts.

Each test has its own namespace. Times that must pass (an attempt's lease, a retry) are
short and waited for on the *store's* clock. Under ``CI=true`` a missing Redis fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
import redis.connection

from fleetcron.models import LeaseRecord, RunOutcome, RunRecord, SlotClaim, job_lease_name
from fleetcron.stores.ledger import LOST_ERROR
from fleetcron.stores.redis import AsyncRedisStore, RedisOperations, RedisStore
from fleetcron.stores.url import parse_store_url

pytestmark = pytest.mark.parametrize("backend_url", ["redis"], indirect=True)

HOLDER = "host:1:tok"
LONG = 30_000_000  # outlives any test
SHORT = 150_000  # an attempt whose holder "vanishes"
HOUR = 3_600_000_000


@pytest.fixture
def rs(backend_url: str, namespace: str) -> Iterator[RedisStore]:
    store = RedisStore(parse_store_url(backend_url))
    try:
        yield store
    finally:
        client = redis.Redis.from_url(backend_url)
        pattern = f"fleetcron:{{{len(namespace)}:{namespace}:*"
        for key in client.scan_iter(match=pattern):
            client.delete(key)
        client.close()
        store.close()


def now(store: RedisStore) -> int:
    return store.run(store.ops.store_now())


def wait_until(store: RedisStore, target_us: int, timeout: float = 10.0) -> None:
    """Sleep until the store's clock reaches ``target_us``."""
    give_up = time.monotonic() + timeout
    while (current := now(store)) < target_us:
        assert time.monotonic() < give_up, "the store clock did not reach the target"
        time.sleep(min((target_us - current) / 1e6, 0.05) + 0.001)


def claim(
    store: RedisStore,
    namespace: str,
    *claims: SlotClaim,
    holder: str = HOLDER,
    ttl_us: int = LONG,
) -> list[RunRecord]:
    answers = store.run(store.ops.run_claim(namespace, list(claims), holder, ttl_us))
    return [answer.run for answer in answers if answer.run is not None]


def one(
    store: RedisStore, namespace: str, job: str, slot_us: int, ttl_us: int = LONG, **kw: Any
) -> RunRecord:
    runs = claim(
        store,
        namespace,
        SlotClaim(job=job, slot_us=slot_us, run_id=f"run-{slot_us}", **kw),
        ttl_us=ttl_us,
    )
    assert len(runs) == 1, "the slot should have been claimed"
    return runs[0]


def get(store: RedisStore, namespace: str, job: str, slot_us: int) -> RunRecord:
    run = store.run(store.ops.run_get(namespace, job, slot_us))
    assert run is not None
    return run


def lease(store: RedisStore, namespace: str, job: str) -> LeaseRecord:
    record = store.run(store.ops.lease_get(namespace, job_lease_name(job)))
    assert record is not None
    return record


def finish(store: RedisStore, namespace: str, run: RunRecord, state: str, **kw: Any) -> bool:
    outcome = RunOutcome(state=state, **kw)
    return store.run(store.ops.run_finish(namespace, run.job, run.slot_us, run.fence, outcome))


def stored(run: RunRecord | None) -> RunRecord | None:
    return None if run is None else replace(run, now_us=0)


# -- claiming ---------------------------------------------------------------------------
def test_a_claim_is_a_running_attempt_with_the_job_fence(rs: RedisStore, namespace: str) -> None:
    slot = now(rs) - 1_000
    run = one(rs, namespace, "backup", slot)

    assert (run.state, run.attempt, run.holder, run.run_id, run.trigger) == (
        "running",
        1,
        HOLDER,
        f"run-{slot}",
        "schedule",
    )
    assert run.started_us == run.now_us
    assert run.expires_us == run.now_us + LONG
    assert run.fence >= run.now_us
    assert not run.cancel_requested
    assert (run.finished_us, run.retry_at_us, run.exit_code, run.error, run.output) == (None,) * 5
    assert stored(get(rs, namespace, "backup", slot)) == stored(run)
    held = lease(rs, namespace, "backup")
    assert (held.holder, held.fence, held.held) == (HOLDER, run.fence, True)


def test_a_future_slot_is_refused(rs: RedisStore, namespace: str) -> None:
    slot = now(rs) + 60_000_000

    assert claim(rs, namespace, SlotClaim(job="backup", slot_us=slot, run_id="r")) == []
    assert rs.run(rs.ops.run_get(namespace, "backup", slot)) is None
    assert rs.run(rs.ops.job_get(namespace, "backup")) is None


WORKER = """
import json, sys
from fleetcron.models import SlotClaim
from fleetcron.stores.redis import RedisStore
from fleetcron.stores.url import parse_store_url

url, namespace, slot, me = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = RedisStore(parse_store_url(url))
claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=me) for k in range(5)]
print("ready", flush=True)
sys.stdin.readline()
answers = store.run(store.ops.run_claim(namespace, claims, "host:" + me + ":t", 30_000_000))
runs = [answer.run for answer in answers if answer.run is not None]
print(json.dumps([[run.job, run.run_id, run.fence] for run in runs]), flush=True)
store.close()
"""


def test_eight_processes_claiming_the_same_slots_get_each_exactly_once(
    rs: RedisStore, backend_url: str, namespace: str
) -> None:
    slot = now(rs) - 1_000
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, backend_url, namespace, str(slot), f"p{index}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(8)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        won = []
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0
            won.extend(json.loads(out))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    assert sorted(job for job, _, _ in won) == [f"job{k}" for k in range(5)]
    for job, run_id, fence in won:
        row = get(rs, namespace, job, slot)
        assert (row.run_id, row.fence, row.attempt) == (run_id, fence, 1)


def test_a_finished_slot_is_never_claimed_again(rs: RedisStore, namespace: str) -> None:
    slot = now(rs) - 1_000
    run = one(rs, namespace, "backup", slot, max_attempts=5)
    assert finish(rs, namespace, run, "succeeded", exit_code=0)
    failed = one(rs, namespace, "report", slot, max_attempts=5)
    assert finish(rs, namespace, failed, "failed", exit_code=1)  # no retry_after

    for job in ("backup", "report"):
        for trigger in ("schedule", "manual"):
            again = SlotClaim(job=job, slot_us=slot, run_id="x", max_attempts=5, trigger=trigger)
            assert claim(rs, namespace, again) == []
    assert get(rs, namespace, "backup", slot).state == "succeeded"


def test_a_running_valid_attempt_is_not_claimed_twice(rs: RedisStore, namespace: str) -> None:
    slot = now(rs) - 1_000
    first = one(rs, namespace, "backup", slot, exclusive=False)

    again = SlotClaim(job="backup", slot_us=slot, run_id="x", exclusive=False, max_attempts=3)
    assert claim(rs, namespace, again, holder="other:2:t") == []
    assert stored(get(rs, namespace, "backup", slot)) == stored(first)


def test_an_expired_attempt_is_claimed_again_then_closed_as_lost(
    rs: RedisStore, namespace: str
) -> None:
    slot = now(rs) - 1_000
    first = one(rs, namespace, "backup", slot, ttl_us=SHORT, max_attempts=2)
    assert first.expires_us is not None
    wait_until(rs, first.expires_us)

    second = one(rs, namespace, "backup", slot, ttl_us=SHORT, max_attempts=2)
    assert second.attempt == 2
    assert second.fence > first.fence
    assert second.error == f"attempt 1 lost: {LOST_ERROR}"
    assert second.run_id == f"run-{slot}"
    assert second.started_us == second.now_us
    assert second.expires_us is not None
    wait_until(rs, second.expires_us)

    retry = SlotClaim(job="backup", slot_us=slot, run_id="third", max_attempts=2)
    assert claim(rs, namespace, retry) == []
    lost = get(rs, namespace, "backup", slot)
    assert (lost.state, lost.attempt, lost.expires_us, lost.error) == (
        "lost",
        2,
        None,
        LOST_ERROR,
    )
    assert lost.finished_us is not None
    assert lost.finished_us >= second.expires_us
    assert claim(rs, namespace, retry) == []  # lost is final


def test_a_failed_attempt_with_a_retry_is_claimed_again_once_retry_at_has_come(
    rs: RedisStore, namespace: str
) -> None:
    slot = now(rs) - 1_000
    first = one(rs, namespace, "backup", slot, max_attempts=2)
    assert finish(rs, namespace, first, "failed", exit_code=3, error="boom", retry_after_us=300_000)
    failed = get(rs, namespace, "backup", slot)
    assert failed.retry_at_us is not None
    assert failed.finished_us is not None
    assert failed.retry_at_us == failed.finished_us + 300_000

    retry = SlotClaim(job="backup", slot_us=slot, run_id="again", max_attempts=2)
    assert claim(rs, namespace, retry) == []
    wait_until(rs, failed.retry_at_us)
    [second] = claim(rs, namespace, retry)
    assert (second.attempt, second.run_id, second.error, second.exit_code) == (
        2,
        "again",
        None,
        None,
    )
    assert second.retry_at_us is None
    assert second.finished_us is None
    assert second.fence > first.fence

    assert finish(rs, namespace, second, "failed", retry_after_us=0)
    assert claim(rs, namespace, replace(retry, run_id="third")) == []  # attempts exhausted


def test_exclusive_claims_wait_for_the_job_lease_non_exclusive_ones_only_move_its_fence(
    rs: RedisStore, namespace: str
) -> None:
    held = rs.run(rs.ops.lease_acquire(namespace, job_lease_name("backup"), "other:9:t", LONG, 0))
    assert held is not None
    slot = now(rs) - 1_000

    assert claim(rs, namespace, SlotClaim(job="backup", slot_us=slot, run_id="x")) == []
    assert rs.run(rs.ops.run_get(namespace, "backup", slot)) is None

    run = one(rs, namespace, "backup", slot, exclusive=False)
    assert run.fence > held.fence
    after = lease(rs, namespace, "backup")
    assert (after.holder, after.expires_us, after.fence) == (
        held.holder,
        held.expires_us,
        run.fence,
    )


def test_a_non_exclusive_claim_creates_the_job_lease_expired(
    rs: RedisStore, namespace: str
) -> None:
    run = one(rs, namespace, "backup", now(rs) - 1_000, exclusive=False)

    row = lease(rs, namespace, "backup")
    assert (row.fence, row.holder, row.expires_us, row.held) == (run.fence, "", 0, False)
    names = [record.name for record in rs.run(rs.ops.lease_list(namespace))]
    assert names == [job_lease_name("backup")]  # the ledger's own keys are no leases


def test_claims_take_the_lease_for_ttl_and_least(rs: RedisStore, namespace: str) -> None:
    run = one(rs, namespace, "backup", now(rs) - 1_000, least_us=LONG * 2)

    row = lease(rs, namespace, "backup")
    assert (row.acquired_us, row.expires_us, row.min_until_us) == (
        run.now_us,
        run.now_us + LONG,
        run.now_us + 2 * LONG,
    )


def test_fences_keep_increasing_across_claims_of_a_job(rs: RedisStore, namespace: str) -> None:
    base = now(rs) - 10_000
    fences = []
    for offset in range(5):
        run = one(rs, namespace, "backup", base + offset, exclusive=False)
        fences.append(run.fence)
    assert fences == sorted(set(fences))


# -- extend, finish, cancel ------------------------------------------------------------------
def test_extend_renews_the_attempt_and_the_job_lease_with_its_fence(
    rs: RedisStore, namespace: str
) -> None:
    slot = now(rs) - 1_000
    run = one(rs, namespace, "backup", slot, ttl_us=1_000_000)

    renewed = rs.run(rs.ops.run_extend(namespace, "backup", slot, run.fence, LONG))
    assert renewed is not None
    assert renewed.expires_us == renewed.now_us + LONG
    assert lease(rs, namespace, "backup").expires_us == renewed.now_us + LONG
    assert rs.run(rs.ops.run_extend(namespace, "backup", slot, run.fence - 1, LONG)) is None
    assert rs.run(rs.ops.run_extend(namespace, "backup", slot + 1, run.fence, LONG)) is None


def test_cancel_asks_the_unexpired_running_attempts(rs: RedisStore, namespace: str) -> None:
    base = now(rs) - 10_000
    running = one(rs, namespace, "backup", base, exclusive=False)
    done = one(rs, namespace, "backup", base + 1, exclusive=False)
    assert finish(rs, namespace, done, "succeeded")
    vanished = one(rs, namespace, "backup", base + 2, exclusive=False, ttl_us=1)
    assert vanished.expires_us is not None
    wait_until(rs, vanished.expires_us)

    assert rs.run(rs.ops.run_cancel(namespace, "backup")) == 1
    renewed = rs.run(rs.ops.run_extend(namespace, "backup", base, running.fence, LONG))
    assert renewed is not None
    assert renewed.cancel_requested
    assert not get(rs, namespace, "backup", base + 1).cancel_requested
    assert rs.run(rs.ops.run_cancel(namespace, "nothing")) == 0


def test_finish_records_the_outcome_and_releases_the_job_lease(
    rs: RedisStore, namespace: str
) -> None:
    slot = now(rs) - 1_000
    run = one(rs, namespace, "backup", slot)
    output = "é" * 5_000

    assert finish(rs, namespace, run, "succeeded", exit_code=0, error=None, output=output)
    done = get(rs, namespace, "backup", slot)
    assert (done.state, done.exit_code, done.error, done.expires_us, done.retry_at_us) == (
        "succeeded",
        0,
        None,
        None,
        None,
    )
    assert done.output == "é" * 4_096
    assert done.finished_us is not None
    released = lease(rs, namespace, "backup")
    assert released.expires_us == done.finished_us
    assert not released.held
    job = rs.run(rs.ops.job_get(namespace, "backup"))
    assert job is not None
    assert job.last_success_us == done.finished_us
    assert job.last_failure_us is None

    again = one(rs, namespace, "backup", slot + 1)  # the lease is free again
    assert again.fence > run.fence


def test_finish_keeps_the_lease_until_least(rs: RedisStore, namespace: str) -> None:
    run = one(rs, namespace, "backup", now(rs) - 1_000, least_us=LONG)

    assert finish(rs, namespace, run, "failed", error="boom")
    row = lease(rs, namespace, "backup")
    assert row.expires_us == row.min_until_us
    assert row.held
    job = rs.run(rs.ops.job_get(namespace, "backup"))
    assert job is not None
    assert job.last_failure_us is not None
    assert job.last_success_us is None


def test_finish_with_an_old_fence_or_after_expiry_is_refused_and_changes_nothing(
    rs: RedisStore, namespace: str
) -> None:
    slot = now(rs) - 1_000
    run = one(rs, namespace, "backup", slot, ttl_us=400_000)
    before_lease = lease(rs, namespace, "backup")

    stale = replace(run, fence=run.fence - 1)
    assert not finish(rs, namespace, stale, "succeeded")
    assert stored(get(rs, namespace, "backup", slot)) == stored(run)

    assert run.expires_us is not None
    wait_until(rs, run.expires_us)
    assert not finish(rs, namespace, run, "succeeded", exit_code=0)
    assert stored(get(rs, namespace, "backup", slot)) == stored(run)
    assert replace(lease(rs, namespace, "backup"), now_us=0) == replace(before_lease, now_us=0)
    job = rs.run(rs.ops.job_get(namespace, "backup"))
    assert job is not None
    assert job.last_success_us is None
    assert job.last_failure_us is None
    assert not rs.run(
        rs.ops.run_finish(namespace, "backup", slot + 1, run.fence, RunOutcome(state="failed"))
    )


# -- pause, record, list, prune ---------------------------------------------------------------
def test_a_paused_job_is_claimed_by_a_manual_trigger_not_by_its_schedule(
    rs: RedisStore, namespace: str
) -> None:
    assert not rs.run(rs.ops.job_set_paused(namespace, "backup", True))  # unknown job
    rs.run(rs.ops.job_register(namespace, [("backup", "{}", "fp")]))
    assert rs.run(rs.ops.job_set_paused(namespace, "backup", True))
    slot = now(rs) - 1_000

    assert claim(rs, namespace, SlotClaim(job="backup", slot_us=slot, run_id="s")) == []
    run = one(rs, namespace, "backup", slot, trigger="manual")
    assert run.trigger == "manual"

    assert rs.run(rs.ops.job_set_paused(namespace, "backup", False))
    job = rs.run(rs.ops.job_get(namespace, "backup"))
    assert job is not None
    assert not job.paused
    assert finish(rs, namespace, run, "succeeded")
    assert one(rs, namespace, "backup", slot + 1).trigger == "schedule"


def test_record_inserts_a_final_row_and_never_overwrites(rs: RedisStore, namespace: str) -> None:
    base = now(rs) - 10_000

    assert rs.run(rs.ops.run_record(namespace, "backup", base, "missed", "late", "schedule"))
    assert not rs.run(rs.ops.run_record(namespace, "backup", base, "skipped", None, "schedule"))
    missed = get(rs, namespace, "backup", base)
    assert (missed.state, missed.error, missed.attempt, missed.fence, missed.started_us) == (
        "missed",
        "late",
        0,
        0,
        None,
    )
    assert missed.finished_us is not None
    assert missed.expires_us is None
    assert claim(rs, namespace, SlotClaim(job="backup", slot_us=base, run_id="r")) == []

    running = one(rs, namespace, "backup", base + 1)
    assert not rs.run(rs.ops.run_record(namespace, "backup", base + 1, "skipped", None, "exec"))
    assert stored(get(rs, namespace, "backup", base + 1)) == stored(running)


def test_high_water_moves_with_claims_and_records_and_never_back(
    rs: RedisStore, namespace: str
) -> None:
    base = now(rs) - 10_000

    def high_water() -> int | None:
        job = rs.run(rs.ops.job_get(namespace, "backup"))
        assert job is not None
        return job.high_water_us

    rs.run(rs.ops.job_register(namespace, [("backup", "{}", "fp")]))
    assert high_water() is None
    one(rs, namespace, "backup", base + 5, exclusive=False)
    assert high_water() == base + 5
    rs.run(rs.ops.run_record(namespace, "backup", base, "missed", None, "schedule"))
    assert high_water() == base + 5
    rs.run(rs.ops.run_record(namespace, "backup", base + 9, "skipped", None, "schedule"))
    assert high_water() == base + 9


def test_list_is_newest_slot_first_per_job_and_across_jobs(rs: RedisStore, namespace: str) -> None:
    base = now(rs) - 100_000
    for offset in (3, 1, 4):
        rs.run(rs.ops.run_record(namespace, "a", base + offset, "missed", None, "schedule"))
    for offset in (2, 4):
        rs.run(rs.ops.run_record(namespace, "b", base + offset, "skipped", None, "schedule"))

    per_job = rs.run(rs.ops.run_list(namespace, "a", 10))
    assert [run.slot_us - base for run in per_job] == [4, 3, 1]
    assert [run.slot_us - base for run in rs.run(rs.ops.run_list(namespace, "a", 2))] == [4, 3]
    every = rs.run(rs.ops.run_list(namespace, None, 4))
    assert [(run.job, run.slot_us - base) for run in every] == [
        ("a", 4),
        ("b", 4),
        ("a", 3),
        ("b", 2),
    ]
    assert rs.run(rs.ops.run_list(namespace, "nothing", 10)) == []
    assert rs.run(rs.ops.run_list(namespace + "x", None, 10)) == []


def test_prune_keeps_the_newest_final_rows_and_every_running_row(
    rs: RedisStore, namespace: str
) -> None:
    base = now(rs) - 100_000
    oldest = one(rs, namespace, "a", base, exclusive=False)  # running, oldest slot
    for offset in range(1, 5):
        rs.run(rs.ops.run_record(namespace, "a", base + offset, "missed", None, "schedule"))
    rs.run(rs.ops.run_record(namespace, "b", base, "skipped", None, "schedule"))

    assert rs.run(rs.ops.run_prune(namespace, 2, HOUR)) == 2
    assert [run.slot_us - base for run in rs.run(rs.ops.run_list(namespace, "a", 10))] == [
        4,
        3,
        0,
    ]
    assert rs.run(rs.ops.run_prune(namespace, 0, HOUR)) == 3
    left = rs.run(rs.ops.run_list(namespace, None, 10))
    assert [stored(run) for run in left] == [stored(oldest)]


def test_prune_drops_rows_finished_longer_ago_than_the_age(rs: RedisStore, namespace: str) -> None:
    base = now(rs) - 100_000
    rs.run(rs.ops.run_record(namespace, "a", base, "missed", None, "schedule"))
    wait_until(rs, now(rs) + 1_500_000)
    rs.run(rs.ops.run_record(namespace, "a", base + 1, "missed", None, "schedule"))

    # the age (1 s) sits well between the two rows' ages, so a slow machine cannot blur it
    assert rs.run(rs.ops.run_prune(namespace, 100, 1_000_000)) == 1
    assert [run.slot_us for run in rs.run(rs.ops.run_list(namespace, "a", 10))] == [base + 1]


# -- jobs -----------------------------------------------------------------------------------------
def test_register_returns_the_previous_row_and_keeps_pause_and_progress(
    rs: RedisStore, namespace: str
) -> None:
    assert rs.run(rs.ops.job_register(namespace, [("backup", '{"v": 1}', "fp1")])) == [None]
    rs.run(rs.ops.job_set_paused(namespace, "backup", True))
    one(rs, namespace, "backup", now(rs) - 1_000, trigger="manual")

    (before,) = rs.run(rs.ops.job_register(namespace, [("backup", '{"v": 2}', "fp2")]))
    assert before is not None
    assert (before.definition, before.fingerprint, before.paused) == ('{"v": 1}', "fp1", True)
    after = rs.run(rs.ops.job_get(namespace, "backup"))
    assert after is not None
    assert (after.definition, after.fingerprint, after.paused) == ('{"v": 2}', "fp2", True)
    assert after.high_water_us == before.high_water_us  # a manual run moves no progress
    assert after.updated_us >= before.updated_us


def test_a_job_first_seen_by_a_claim_has_an_empty_definition(
    rs: RedisStore, namespace: str
) -> None:
    one(rs, namespace, "zeta", now(rs) - 1_000)
    rs.run(rs.ops.job_register(namespace, [("alpha", '{"cron": "@daily"}', "fp")]))

    jobs = rs.run(rs.ops.job_list(namespace))
    assert [(job.job, job.definition, job.fingerprint) for job in jobs] == [
        ("alpha", '{"cron": "@daily"}', "fp"),
        ("zeta", "{}", ""),
    ]
    assert rs.run(rs.ops.job_list(namespace + "x")) == []


def test_store_now_is_the_servers_clock(rs: RedisStore, backend_url: str) -> None:
    seconds, micros = redis.Redis.from_url(backend_url).time()
    assert abs(now(rs) - (seconds * 1_000_000 + micros)) < 5_000_000


# -- round trips ----------------------------------------------------------------------------------
@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every packed write a sync Redis connection sends: one per round trip."""
    sent: list[bytes] = []
    original: Any = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


def test_a_batch_of_claims_is_one_round_trip(
    rs: RedisStore, namespace: str, writes: list[bytes]
) -> None:
    slot = now(rs) - 1_000
    one(rs, namespace, "warm", slot)  # the script is in the server's cache
    writes.clear()

    claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(20)]
    runs = claim(rs, namespace, *claims)

    assert [run.job for run in runs] == [f"job{k}" for k in range(20)]
    assert len(writes) == 1
    assert len({run.started_us for run in runs}) == 1  # one script, one TIME


def test_a_cluster_batch_is_one_call_per_job_in_one_round_trip(
    rs: RedisStore, namespace: str, writes: list[bytes]
) -> None:
    rs.ops = RedisOperations(cluster=True)
    base = now(rs) - 10_000
    one(rs, namespace, "warm", base)
    writes.clear()

    claims = [
        SlotClaim(job=f"job{k % 3}", slot_us=base + k, run_id=f"r{k}", exclusive=False)
        for k in range(9)
    ]
    runs = claim(rs, namespace, *claims)

    assert [run.run_id for run in runs] == [f"r{k}" for k in range(9)]
    assert len(writes) == 1
    assert len({run.started_us for run in runs if run.job == "job1"}) == 1


def test_a_batch_survives_a_script_cache_the_server_lost(rs: RedisStore, namespace: str) -> None:
    rs._scripts["run_claim"].sha = "0" * 40  # as after SCRIPT FLUSH or a failover
    slot = now(rs) - 1_000
    claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(3)]

    assert [run.job for run in claim(rs, namespace, *claims)] == ["job0", "job1", "job2"]
    assert rs._scripts["run_claim"].sha != "0" * 40


async def test_the_async_store_runs_the_same_ledger(backend_url: str, namespace: str) -> None:
    store = AsyncRedisStore(parse_store_url(backend_url))
    await store.open()
    try:
        slot = await store.run(store.ops.store_now()) - 1_000
        claims = [SlotClaim(job=f"job{k}", slot_us=slot, run_id=f"r{k}") for k in range(3)]
        store._scripts["run_claim"].sha = "0" * 40
        answers = await store.run(store.ops.run_claim(namespace, claims, HOLDER, LONG))
        runs = [answer.run for answer in answers if answer.run is not None]
        assert [run.job for run in runs] == ["job0", "job1", "job2"]
        again = await store.run(store.ops.run_claim(namespace, claims, HOLDER, LONG))
        assert [answer.status for answer in again] == ["taken"] * 3
        outcome = RunOutcome(state="succeeded")
        assert await store.run(
            store.ops.run_finish(namespace, "job0", slot, runs[0].fence, outcome)
        )
        listed = await store.run(store.ops.run_list(namespace, None, 10))
        assert [(run.job, run.state) for run in listed] == [
            ("job0", "succeeded"),
            ("job1", "running"),
            ("job2", "running"),
        ]
        assert len(await store.run(store.ops.lease_list(namespace))) == 3
    finally:
        client = redis.Redis.from_url(backend_url)
        for key in client.scan_iter(match=f"fleetcron:{{{len(namespace)}:{namespace}:*"):
            client.delete(key)
        client.close()
        await store.close()
