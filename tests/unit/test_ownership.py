"""Replicas share out the slots: each claims the slots it owns at once and another's only
after the hand-over, when the store says it is still free — so a slot of a replica that is
down still runs, and live replicas do not race for every slot."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.models import ReplicaInfo, ReplicaRecord
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.handover import RING_FULL_EVERY_S, Handover
from fleetcron.scheduling.heartbeat import Heartbeat, jobs_fingerprint
from fleetcron.scheduling.ownership import BACKUPS, Ring
from fleetcron.scheduling.planning import DueHeap, PlannedJob
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock
from passes import until_signalled
from unit.fakes import Recorded
from unit.test_scheduler import spec

NS = "ownership"


def _row(
    replica_id: str, *, mode: str = "claim", fp: str = "fp", alive: bool = True
) -> ReplicaRecord:
    return ReplicaRecord(
        namespace=NS,
        replica_id=replica_id,
        host="h",
        pid=1,
        version="0",
        mode=mode,
        jobs_fingerprint=fp,
        started_us=0,
        last_seen_us=0,
        expires_us=10 if alive else 0,
        now_us=5,
    )


def test_every_slot_has_exactly_one_owner_and_the_shares_are_even() -> None:
    ids = [f"host:{pid}:ab" for pid in range(5)]
    rings = [Ring(me, "fp") for me in ids]
    for ring in rings:
        ring.update([_row(i) for i in ids])
    slots = [
        (f"job{j}", 1_700_000_000_000_000 + s * 60_000_000) for j in range(200) for s in range(10)
    ]

    owners: Counter[str] = Counter()
    for job, slot in slots:
        owning = [ring.me for ring in rings if ring.owns(job, slot)]
        assert len(owning) == 1, (job, slot, owning)
        owners[owning[0]] += 1

    fair = len(slots) / len(ids)
    assert all(0.85 * fair <= owners[i] <= 1.15 * fair for i in ids), owners


def test_the_ring_holds_live_claim_replicas_of_the_same_jobs_and_always_this_one() -> None:
    ring = Ring("me", "fp")
    ring.update(
        [
            _row("b"),
            _row("a"),
            _row("leader", mode="leader"),
            _row("other-jobs", fp="other"),
            _row("gone", alive=False),
        ]
    )
    assert ring.members == ("a", "b", "me")

    ring.update([])
    assert list(ring.members) == ["me"]
    assert ring.owns("job", 1)


async def test_the_slots_of_a_replica_that_is_down_still_run_exactly_once() -> None:
    store = MemoryStore()
    jobs = [spec(f"job{i}", lambda ctx: None, every="200ms") for i in range(6)]
    scheduler = AsyncScheduler(
        AsyncMemoryStore(store), jobs, SchedulerOptions(namespace=NS, shutdown_grace_s=1.0)
    )
    # A replica of the same jobs that beat once and then froze: it owns about half of the
    # slots and never claims one until its row expires (not within this test).
    frozen = ReplicaInfo(
        replica_id="frozen:1:00",
        host="frozen",
        pid=1,
        version="0",
        mode="claim",
        jobs_fingerprint=scheduler.heartbeat.info.jobs_fingerprint,
    )
    store.run(store.ops.replica_beat(NS, frozen, 600_000_000))
    assert scheduler.heartbeat.info.jobs_fingerprint == jobs_fingerprint(
        scheduler.definitions.local
    )

    def rows() -> list[Any]:
        return [r for job in jobs for r in store.run(store.ops.run_list(NS, job.name, 1000))]

    def enough() -> bool:
        return len(scheduler.handover.ring.members) == 2 and len(rows()) >= 60

    task = asyncio.create_task(scheduler.run())
    try:
        await until_signalled([scheduler], enough)
    finally:
        scheduler.stop()
        await task

    frozen_owned = [r for r in rows() if not scheduler.handover.ring.owns(r.job, r.slot_us)]
    assert len(frozen_owned) >= 10  # the frozen replica's slots ran, here
    assert all(r.state in ("succeeded", "running") for r in rows()), Counter(
        r.state for r in rows()
    )


def _statuses(store: Recorded) -> Counter[str]:
    """How the claims the store ran were answered."""
    return Counter(answer.status for answers in store.answers["run_claim"] for answer in answers)


async def test_live_replicas_claim_their_own_slots_instead_of_racing_for_all() -> None:
    store = MemoryStore()
    jobs = [spec(f"job{i}", lambda ctx: None, every="200ms") for i in range(20)]
    stores = [Recorded(store), Recorded(store)]
    for recorded in stores:
        recorded.recording = False  # from the moment the rings agree
    schedulers = [
        AsyncScheduler(s, jobs, SchedulerOptions(namespace=NS, shutdown_grace_s=1.0))
        for s in stores
    ]
    tasks = [asyncio.create_task(s.run()) for s in schedulers]
    ran: list[int] = []

    def claimed() -> int:
        return sum(_statuses(s)["claimed"] for s in stores)

    def rings_agree() -> bool:
        return all(len(s.handover.ring.members) == 2 for s in schedulers)

    try:
        await until_signalled(schedulers, rings_agree)
        for s in stores:
            s.recording = True
        await until_signalled(schedulers, lambda: claimed() >= 200)
        ran.append(claimed())
    finally:
        for scheduler in schedulers:
            scheduler.stop()
        await asyncio.gather(*tasks)

    taken = sum(_statuses(s)["taken"] for s in stores)
    # Racing for every slot, each claimed slot would cost the other replica a "taken".
    assert taken <= ran[0] // 10, (taken, ran[0], [_statuses(s) for s in stores])
    shares = [_statuses(s)["claimed"] for s in stores]
    assert min(shares) >= ran[0] // 4, shares


def test_a_job_whose_next_slot_another_replica_owns_waits_in_the_later_heap() -> None:
    theirs = {"b"}
    heap = DueHeap(delay=lambda job, slot: 250_000 if job.spec.name in theirs else 0)
    jobs = {
        name: PlannedJob(spec=spec(name, lambda ctx: None, every="1s"), cursor_us=0)
        for name in "ab"
    }
    for job in jobs.values():
        heap.push(job)

    assert heap.soonest() == 1_000_000  # a's next slot, collected at its fire time
    assert heap.soonest_later() == 1_250_000  # b's, after its hand-over delay
    assert heap.pop_due(1_000_000) == ["a"]
    assert heap.pop_later(1_249_999) == []
    assert heap.pop_later(1_250_000) == ["b"]


class _RingReadFails(Recorded):
    """Refuses the first ``fails`` reads of the replica table."""

    def __init__(self, store: MemoryStore, fails: int) -> None:
        super().__init__(store)
        self.fails = fails

    async def run(self, operation: Any) -> Any:
        if getattr(operation, "__name__", "") == "replica_list" and self.fails > 0:
            self.fails -= 1
            operation.close()
            raise StoreUnavailable("the store is down")
        return await super().run(operation)


async def test_a_failed_ring_read_is_tried_again_within_a_second_not_a_heartbeat_later() -> None:
    clock = FakeClock()
    store = _RingReadFails(MemoryStore(clock=clock), fails=1)
    options = SchedulerOptions(namespace=NS, heartbeat_s=30.0)
    scheduler = AsyncScheduler(store, [spec("job", lambda ctx: None)], options, clock=clock)

    with pytest.raises(StoreUnavailable):
        await scheduler.handover.read_ring()
    await scheduler.handover.read_ring()
    assert store.calls["replica_list"] == []  # too soon: the failed read was just now
    clock.advance(1.0)
    await scheduler.handover.read_ring()
    assert len(store.calls["replica_list"]) == 1  # a second later, not 30 s later
    clock.advance(1.0)
    await scheduler.handover.read_ring()
    assert len(store.calls["replica_list"]) == 1  # read: fresh until the next heartbeat


# -- bounded store work per slot, whatever the number of replicas --------------------------
def _rings(count: int) -> list[Ring]:
    ids = [f"host:{pid}:ab" for pid in range(count)]
    rings = [Ring(me, "fp") for me in ids]
    rows = [_row(i) for i in ids]
    for ring in rings:
        ring.update(rows)
    return rings


@pytest.mark.parametrize("count", [1, 2, 3, 4, 10, 100])
def test_each_slot_has_one_owner_and_at_most_two_backups_spread_over_the_members(
    count: int,
) -> None:
    rings = _rings(count)
    firsts: Counter[str] = Counter()
    for slot in range(2_000):
        ranks = sorted(ring.rank("job", 1_700_000_000_000_000 + slot) for ring in rings)
        looking = [rank for rank in ranks if rank <= BACKUPS]
        assert looking == list(range(min(count, BACKUPS + 1))), ranks
        firsts.update(r.me for r in rings if r.rank("job", 1_700_000_000_000_000 + slot) == 1)
    if count > 3:
        # A dead owner's slots fall on every member, not on one neighbour.
        assert len(firsts) == count
        assert max(firsts.values()) <= 3 * 2_000 / (count - 1) + 10


class _Settled(AsyncMemoryStore):
    """Answers ``run_settled`` with nothing settled, counting the slots asked about."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.asked = 0
        self.reads = 0

    async def run(self, operation: Any) -> Any:
        if getattr(operation, "__name__", "") == "run_settled":
            slots = operation.gi_frame.f_locals["slots"]
            operation.close()
            self.asked += len(slots)
            self.reads += 1
            return set()
        return await super().run(operation)


@pytest.mark.parametrize("count", [10, 100, 1_000])
async def test_a_slot_costs_at_most_two_lookups_whatever_the_number_of_replicas(
    count: int,
) -> None:
    # The store-call model: every replica collects every slot (each plans every job), but
    # only the slot's backups look it up, however many replicas there are — with the owner
    # dead, the slot is found free and adopted by them, not by the whole fleet.
    store = _Settled()
    clock = FakeClock()
    every = spec("job", lambda ctx: None, every="1s")
    replicas = []  # each replica plans the job on its own
    for ring in _rings(count):
        handover = Handover(store, NS, ring, claiming=True, ring_every_s=10.0, clock=clock)
        replicas.append((handover, PlannedJob(spec=every, cursor_us=0)))
    slots = [1_700_000_000_000_000 + k * 1_000_000 for k in range(30)]
    adopted: Counter[int] = Counter()
    for slot in slots:
        for handover, job in replicas:
            shared, slot_deadline = handover.slot_facts(job, slot)
            if shared:
                handover.wait_for_owner("job", slot, slot_deadline, slot)
        for handover, job in replicas:
            free, _ = await handover.adopt(slot + 600_000, {"job": job})
            adopted.update(claim.slot_us for claim in free)

    assert store.asked <= 2 * len(slots), (store.asked, len(slots))
    assert store.reads <= 2 * len(slots)
    # Every slot found free is adopted by its backups only (the store gives it to one).
    assert set(adopted) == set(slots)
    assert max(adopted.values()) <= 2


async def test_a_slot_whose_owner_and_backups_left_is_looked_at_once_the_ring_drops_them() -> None:
    # Four members: the slot's other member parks it. The owner and both backups leave
    # before its deadline: once the ring drops them, the remaining member looks at it.
    store = _Settled()
    clock = FakeClock()
    every = spec("job", lambda ctx: None, every="1m")
    rings = _rings(4)
    slot = next(
        s
        for s in range(1_700_000_000_000_000, 1_700_000_000_000_000 + 10**9, 60_000_000)
        if rings[0].rank("job", s) > BACKUPS
    )
    handover = Handover(store, NS, rings[0], claiming=True, ring_every_s=10.0, clock=clock)
    job = PlannedJob(spec=every, cursor_us=0)
    shared, slot_deadline = handover.slot_facts(job, slot)
    assert shared
    handover.wait_for_owner("job", slot, slot_deadline, slot)
    free, _ = await handover.adopt(slot + 20_000_000, {"job": job})
    assert (free, store.asked) == ([], 0)  # parked: not looked at while they are members

    rings[0].update([_row(rings[0].me)])  # the others' rows expired
    assert handover.look_again(slot + 20_000_000) == 1
    free, _ = await handover.adopt(slot + 20_000_000, {"job": job})
    assert [claim.slot_us for claim in free] == [slot]


async def test_the_replica_table_is_read_again_only_when_the_members_changed() -> None:
    # Joins and leaves move the members lease's fence; a replica reads the whole table
    # only when it moved (or every RING_FULL_EVERY_S, for replicas that died silently).
    clock = FakeClock()
    memory = MemoryStore(clock=clock)
    store = Recorded(memory)
    options = SchedulerOptions(namespace=NS, heartbeat_s=5.0)
    scheduler = AsyncScheduler(store, [spec("job", lambda ctx: None)], options, clock=clock)
    await scheduler.heartbeat.beat()
    await scheduler.heartbeat.announce()
    reads = store.calls["replica_list"]

    assert not await scheduler.handover.read_ring()  # the first reading: alone
    assert len(reads) == 1
    for _ in range(4):
        clock.advance(5.0)
        await scheduler.handover.read_ring()
    assert len(reads) == 1  # nobody joined or left: the table is not read

    other = Heartbeat(AsyncMemoryStore(memory), NS, scheduler.heartbeat.info, every_s=5.0)
    other.info = ReplicaInfo(**{**vars_of(other.info), "replica_id": "other:2:cd"})
    await other.beat()
    clock.advance(0.001)
    await other.announce()
    clock.advance(5.0)
    assert await scheduler.handover.read_ring()  # it joined: read, and the ring changed
    assert len(reads) == 2
    assert len(scheduler.handover.ring.members) == 2

    # It dies without leaving: nothing moves the version, the full reading finds it gone.
    clock.advance(5.0)
    await scheduler.handover.read_ring()
    assert len(reads) == 2
    clock.advance(RING_FULL_EVERY_S)
    await scheduler.heartbeat.beat()
    assert await scheduler.handover.read_ring()
    assert len(reads) == 3
    assert list(scheduler.handover.ring.members) == [scheduler.heartbeat.info.replica_id]


def vars_of(info: ReplicaInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in info.__dataclass_fields__}
