"""Replica heartbeats on the in-memory store: a running scheduler keeps its row fresh and
deletes it when it stops; a failed beat is logged at DEBUG and is no error."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import pytest

from fleetcron import AsyncFleet, Fleet, __version__
from fleetcron.context import RunContext
from fleetcron.errors import ConfigurationError, StoreUnavailable
from fleetcron.models import ReplicaRecord
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.scheduling.heartbeat import Heartbeat, jobs_fingerprint, replica_info
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from passes import until_signalled
from unit.test_scheduler import NS, spec


def idle(ctx: RunContext) -> None:
    pass


def replicas(store: MemoryStore, *, gone_within_us: int = 0) -> list[ReplicaRecord]:
    return store.run(store.ops.replica_list(NS, gone_within_us))


async def test_a_running_scheduler_beats_and_leaves_its_row_when_it_stops() -> None:
    store = MemoryStore()
    jobs = [spec("a", idle, every="1h"), spec("b", idle, every="1h")]
    scheduler = AsyncScheduler(
        AsyncMemoryStore(store),
        jobs,
        SchedulerOptions(namespace=NS, heartbeat_s=0.05, shutdown_grace_s=1.0),
    )
    task = asyncio.create_task(scheduler.run())
    try:
        await asyncio.wait_for(scheduler.signals.started.wait(), 10)
        (first,) = replicas(store)  # beating by the time it has started
        assert first.replica_id == scheduler.replica_id

        async with asyncio.timeout(10):  # a bound for a loaded machine
            while replicas(store)[0].last_seen_us == first.last_seen_us:
                await asyncio.sleep(0.01)
        (later,) = replicas(store)
    finally:
        scheduler.stop()
        await task

    assert later.started_us == first.started_us
    assert later.last_seen_us > first.last_seen_us
    assert later.expires_us == later.last_seen_us + 150_000  # three beats
    host, pid = socket.gethostname(), os.getpid()
    assert (later.host, later.pid, later.version, later.mode) == (host, pid, __version__, "claim")
    assert later.replica_id.startswith(f"{host}:{pid}:")
    assert later.jobs_fingerprint == jobs_fingerprint({s.name: s.fingerprint() for s in jobs})
    # The replica id is not the secret token of the holder its leases carry.
    assert scheduler.holder.rpartition(":")[2] not in later.replica_id
    assert replicas(store, gone_within_us=3_600_000_000) == []  # left, not gone


async def test_a_standby_in_leader_mode_beats_too() -> None:
    store = MemoryStore()
    jobs = [spec("a", idle, every="1h")]
    leader, standby = (
        AsyncScheduler(
            AsyncMemoryStore(store),
            jobs,
            SchedulerOptions(namespace=NS, mode="leader", heartbeat_s=0.05),
        )
        for _ in range(2)
    )
    tasks = [asyncio.create_task(s.run()) for s in (leader, standby)]
    try:
        await until_signalled([leader, standby], lambda: len(replicas(store)) == 2)
        assert {r.mode for r in replicas(store)} == {"leader"}
        assert {r.replica_id for r in replicas(store)} == {leader.replica_id, standby.replica_id}
    finally:
        for scheduler in (leader, standby):
            scheduler.stop()
        await asyncio.gather(*tasks)
    assert replicas(store) == []


def test_the_jobs_fingerprint_depends_on_the_pairs_not_their_order() -> None:
    one = jobs_fingerprint({"a": "1", "b": "2"})

    assert one == jobs_fingerprint({"b": "2", "a": "1"})
    assert one != jobs_fingerprint({"a": "1", "b": "3"})
    assert one != jobs_fingerprint({"a": "1"})
    assert len(one) == 32


def test_each_replica_has_an_id_of_its_own() -> None:
    first, second = replica_info("claim", {}), replica_info("claim", {})

    assert first.replica_id != second.replica_id
    assert first.replica_id.rsplit(":", 1)[0] == f"{socket.gethostname()}:{os.getpid()}"


def test_a_heartbeat_interval_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_s"):
        AsyncScheduler(
            AsyncMemoryStore(), [spec("a", idle)], SchedulerOptions(namespace=NS, heartbeat_s=0)
        )


class _DownStore(AsyncMemoryStore):
    """A store that cannot be reached."""

    async def run(self, operation: Operation[Any]) -> Any:
        operation.close()
        raise StoreUnavailable("connection refused")


async def test_a_failed_beat_or_leave_is_logged_at_debug_and_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heartbeat = Heartbeat(_DownStore(), NS, replica_info("claim", {}), every_s=0.01)

    with caplog.at_level(logging.DEBUG, logger="fleetcron"):
        assert await heartbeat.beat() is None
        heartbeat.start()
        await asyncio.sleep(0.05)
        await heartbeat.leave()

    failures = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert failures
    assert {r.levelno for r in failures} == {logging.DEBUG}
    assert any("leaving the replica table failed" in r.getMessage() for r in caplog.records)
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


async def test_an_async_fleet_lists_its_running_replica_and_none_once_stopped() -> None:
    fleet = AsyncFleet(AsyncMemoryStore(MemoryStore()), namespace=NS)

    @fleet.job(every="1h")
    def hourly(ctx: RunContext) -> None:
        pass

    await fleet.start()
    try:
        (replica,) = await fleet.replicas()
        assert replica.alive
        assert replica.jobs_fingerprint == jobs_fingerprint({"hourly": fleet.jobs[0].fingerprint()})
    finally:
        await fleet.stop()
    assert await fleet.replicas(include_gone=True) == []


def test_a_fleet_lists_its_running_replica_and_none_once_stopped() -> None:
    fleet = Fleet(MemoryStore(), namespace=NS)

    @fleet.job(every="1h")
    def hourly(ctx: RunContext) -> None:
        pass

    fleet.start()
    try:
        give_up = time.monotonic() + 10
        while not fleet.replicas():
            assert time.monotonic() < give_up, "the replica never beat"
            time.sleep(0.01)
        (replica,) = fleet.replicas()
        assert replica.mode == "claim"
        assert not replica.gone
    finally:
        fleet.stop()
    assert fleet.replicas(include_gone=True) == []
    fleet.close()
