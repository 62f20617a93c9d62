"""Replicas that disagree on a job's definition, on every backend.

The definition in the store governs (the one the replica that started last registered).
The store refuses a claim made for another definition — ``conflict``, with the registered
fingerprint, writing nothing — so two replicas with different definitions of one job never
both claim its slots, and the fleet never runs the union of two schedules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from fleetcron.context import RunContext
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec
from fleetcron.models import CLAIM_STATUSES, ClaimResult, RunRecord, SlotClaim, job_lease_name
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores import SyncStore, open_async_store, parse_store_url
from fleetcron.stores.base import AsyncStore, Capability, Operation, Operations
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled

SECOND = 1_000_000
TTL = 30 * SECOND
JOB = "tick"


def claim(
    job: str, slot_us: int, fingerprint: str | None, *, trigger: str = "schedule", **kw: Any
) -> SlotClaim:
    return SlotClaim(
        job=job,
        slot_us=slot_us,
        run_id=f"run-{job}-{slot_us}-{fingerprint}",
        trigger=trigger,
        fingerprint=fingerprint,
        **kw,
    )


def answer(store: SyncStore, namespace: str, claims: Sequence[SlotClaim]) -> list[ClaimResult]:
    answers = store.run(store.ops.run_claim(namespace, list(claims), "h1", TTL))
    assert [(a.job, a.slot_us) for a in answers] == [(c.job, c.slot_us) for c in claims]
    assert all(a.status in CLAIM_STATUSES for a in answers), answers
    return answers


# -- the store: run_claim refuses another definition ----------------------------------------
def test_a_claim_for_another_definition_than_the_registered_one_is_refused_writing_nothing(
    store: SyncStore, namespace: str
) -> None:
    store.run(store.ops.job_register(namespace, [("j", "{}", "fp-new")]))
    now = store.run(store.ops.store_now())
    slot = now - 10 * SECOND
    # Past its deadline too: a claim that passed the check would record the slot missed.
    [refused] = answer(store, namespace, [claim("j", slot, "fp-old", deadline_us=slot + 1)])

    assert (refused.status, refused.stored_fingerprint, refused.run) == (
        "conflict",
        "fp-new",
        None,
    )
    assert store.run(store.ops.run_get(namespace, "j", slot)) is None
    assert store.run(store.ops.lease_get(namespace, job_lease_name("j"))) is None
    row = store.run(store.ops.job_get(namespace, "j"))
    assert row is not None
    assert (row.fingerprint, row.high_water_us) == ("fp-new", None)
    # The registered definition's claim of the same slot runs it.
    [claimed] = answer(store, namespace, [claim("j", slot, "fp-new")])
    assert claimed.status == "claimed"
    assert claimed.stored_fingerprint is None


def test_a_manual_run_is_left_queued_for_a_replica_of_the_registered_definition(
    store: SyncStore, namespace: str
) -> None:
    store.run(store.ops.job_register(namespace, [("j", "{}", "fp-new")]))
    slot = store.run(store.ops.store_now()) - SECOND
    assert store.run(store.ops.run_record(namespace, "j", slot, "queued", None, "manual"))

    [refused] = answer(store, namespace, [claim("j", slot, "fp-old", trigger="manual")])

    assert refused.status == "conflict"
    row = store.run(store.ops.run_get(namespace, "j", slot))
    assert row is not None
    assert (row.state, row.trigger, row.attempt) == ("queued", "manual", 0)
    [claimed] = answer(store, namespace, [claim("j", slot, "fp-new", trigger="manual")])
    assert claimed.status == "claimed"


def test_claims_without_a_fingerprint_or_of_an_unregistered_job_are_not_checked(
    store: SyncStore, namespace: str
) -> None:
    store.run(store.ops.job_register(namespace, [("j", "{}", "fp-new")]))
    now = store.run(store.ops.store_now())
    # A batch mixing every case, each answered on its own, in order.
    answers = answer(
        store,
        namespace,
        [
            claim("j", now - 3 * SECOND, "fp-old"),  # conflict
            claim("j", now - 2 * SECOND, None, exclusive=False),  # exec: no check
            claim("unregistered", now - 2 * SECOND, "fp-any"),  # no definition registered
            claim("j", now + 60 * SECOND, "fp-old"),  # not due: the first rule
        ],
    )

    assert [a.status for a in answers] == ["conflict", "claimed", "claimed", "not_due"]
    assert [a.stored_fingerprint for a in answers] == ["fp-new", None, None, None]


def test_the_conflict_ends_when_the_registered_definition_is_the_claimers_again(
    store: SyncStore, namespace: str
) -> None:
    store.run(store.ops.job_register(namespace, [("j", "{}", "fp-b")]))
    slot = store.run(store.ops.store_now()) - SECOND
    assert answer(store, namespace, [claim("j", slot, "fp-a")])[0].status == "conflict"

    [before] = store.run(store.ops.job_register(namespace, [("j", "{}", "fp-a")]))

    assert before is not None
    assert before.fingerprint == "fp-b"  # what the registering replica reports it replaced
    assert answer(store, namespace, [claim("j", slot, "fp-a")])[0].status == "claimed"
    assert answer(store, namespace, [claim("j", slot + 1, "fp-b")])[0].status == "conflict"


# -- two schedulers with different definitions of one job ------------------------------------
class Answered:
    """An async store that keeps every claim answer it gave (the other calls pass through)."""

    def __init__(self, inner: AsyncStore) -> None:
        self.inner = inner
        self.answers: list[ClaimResult] = []

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def capabilities(self) -> Capability:
        return self.inner.capabilities

    @property
    def ops(self) -> Operations:
        return self.inner.ops

    async def run(self, operation: Operation[Any]) -> Any:
        result = await self.inner.run(operation)
        if isinstance(result, list) and all(isinstance(a, ClaimResult) for a in result):
            self.answers.extend(result)
        return result

    async def migrate(self) -> list[str]:
        return await self.inner.migrate()

    async def close(self) -> None:
        await self.inner.close()

    def conflicts(self) -> int:
        return sum(1 for a in self.answers if a.status == "conflict" and a.job == JOB)


@pytest.fixture
async def two_stores(backend_url: str) -> AsyncIterator[tuple[Answered, Answered]]:
    """Two connections to the backend under test, as two replicas have (one shared
    in-memory store for ``memory://``)."""
    if backend_url == "memory://":
        shared = MemoryStore()
        stores = (Answered(AsyncMemoryStore(shared)), Answered(AsyncMemoryStore(shared)))
    else:
        url = parse_store_url(backend_url)
        stores = (
            Answered(await open_async_store(url)),
            Answered(await open_async_store(url)),
        )
    try:
        yield stores
    finally:
        for opened in stores:
            await opened.close()


def _work(ctx: RunContext) -> None:
    pass


def spec(every: str) -> JobSpec:
    return job_spec(JOB, where="test", call=_work, every=every, lock_at_most="10s")


async def test_two_replicas_with_different_definitions_never_both_claim_the_jobs_slots(
    two_stores: tuple[Answered, Answered],
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Replica A runs the job every 200 ms; replica B starts with every 300 ms. From B's
    registration on, only B claims the job's slots, all of them on B's schedule; each
    replica logged the conflict once, whatever the number of claims A had refused."""
    a_store, b_store = two_stores
    old, new = spec("200ms"), spec("300ms")
    options = SchedulerOptions(namespace=namespace, shutdown_grace_s=2.0, kill_grace_s=1.0)
    a = AsyncScheduler(a_store, [old], options)
    b = AsyncScheduler(b_store, [new], options)
    runs: list[RunRecord] = []
    since = 0

    async def read_runs() -> None:
        runs[:] = await a_store.inner.run(a_store.ops.run_list(namespace, JOB, 10_000))

    def claimed_by(scheduler: AsyncScheduler) -> list[RunRecord]:
        return [
            r
            for r in runs
            if r.holder == scheduler.holder and r.started_us is not None and r.started_us >= since
        ]

    with caplog.at_level(logging.INFO, logger="fleetcron"):
        tasks = [asyncio.create_task(a.run())]
        try:

            async def a_ran() -> bool:
                await read_runs()
                return bool(claimed_by(a))

            await until_signalled([a], a_ran)  # A alone runs the job: it is live
            tasks.append(asyncio.create_task(b.run()))
            await b.signals.started.wait()
            row = await b_store.run(b_store.ops.job_get(namespace, JOB))
            assert row is not None
            since = row.updated_us  # B's registration, on the store's clock
            if b_store.url.startswith("etcd"):
                # Each etcd client knows its member's clock within bounds that are up to a
                # second wide until they narrow: times two clients wrote compare only
                # within that (the claims themselves are judged inside one txn).
                since += 1_000_000

            async def settled() -> bool:
                if JOB not in a.conflicts or a_store.conflicts() < 3:
                    return False
                await read_runs()
                return len(claimed_by(b)) >= 3

            await until_signalled([a, b], settled)
        finally:
            for scheduler in (a, b):
                scheduler.stop()
            await asyncio.gather(*tasks)

    await read_runs()
    assert claimed_by(a) == [], "the replica whose definition was superseded claimed a slot"
    assert len(claimed_by(b)) >= 3
    later = [r for r in runs if r.slot_us >= since]
    assert all(r.slot_us % 300_000 == 0 for r in later), "a slot of the superseded schedule"
    assert a.conflicts[JOB].other_fingerprint == new.fingerprint()
    assert b.replaced[JOB].other_fingerprint == old.fingerprint()
    conflicts = [
        r for r in caplog.records if getattr(r, "action", None) == "job_definition_conflict"
    ]
    by_replica = sorted(str(getattr(r, "local_fingerprint", "")) for r in conflicts)
    assert by_replica == sorted([old.fingerprint(), new.fingerprint()]), by_replica
    assert all(r.levelno == logging.WARNING for r in conflicts)
