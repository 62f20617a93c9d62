"""Alerts are said once across the fleet, on every backend: when the watch moves from one
replica to another, the new watcher finds in the store what the old one said — it does
not repeat an overdue alert, and it owes (and says once) the recovery.

Every time is the store's clock: a job is made overdue by a one-off slot an hour in the
past, so its verdict does not change while a test runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest

from fleetcron.alerts import Alert, AlertSender
from fleetcron.models import RunOutcome, SlotClaim
from fleetcron.pings import AsyncPinger
from fleetcron.scheduling.monitor import Monitor, alert_marker
from fleetcron.status import read_status
from fleetcron.stores import open_async_store, parse_store_url
from fleetcron.stores.base import AsyncStore
from unit.ping_server import PingServer, Received

HOUR = 3_600_000_000
JOB = "report"


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[AsyncStore]:
    opened = await open_async_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        await opened.close()


async def overdue_job(store: AsyncStore, namespace: str) -> int:
    """Register ``JOB`` due once an hour ago, seen since two hours ago (a ledger row), with
    no success: overdue for that slot, which stays its slot. Returns the slot."""
    ops = store.ops
    now = await store.run(ops.store_now())
    slot = now - HOUR
    definition = {"schedule": {"kind": "at", "moment_us": slot}, "timezone": "UTC"}
    await store.run(ops.job_register(namespace, [(JOB, json.dumps(definition), "f" * 32)]))
    assert await store.run(ops.run_record(namespace, JOB, slot - HOUR, "skipped", None, "manual"))
    return slot


async def succeed(store: AsyncStore, namespace: str, slot: int) -> None:
    """A run of ``JOB``'s slot that succeeds: the job is healthy again."""
    ops = store.ops
    claim = SlotClaim(job=JOB, slot_us=slot, run_id=f"run-{slot}", trigger="manual")
    [answer] = await store.run(ops.run_claim(namespace, [claim], "host-c:3:tok", HOUR))
    assert answer.run is not None, answer
    outcome = RunOutcome(state="succeeded", exit_code=0)
    assert await store.run(ops.run_finish(namespace, JOB, slot, answer.run.fence, outcome))


def at_least(count: int) -> Callable[[list[Received]], list[Received]]:
    """A condition of :meth:`PingServer.wait_for`: ``count`` requests received."""
    return lambda received: received if len(received) >= count else []


def events(alerts: list[Alert]) -> list[str]:
    return [alert.event for alert in alerts]


async def take_over(monitor: Monitor, *, timeout: float = 15.0) -> None:
    """Watch until ``monitor`` holds the monitor lease (the other one's has expired)."""
    give_up = time.monotonic() + timeout
    while await monitor.watch() is None:
        assert time.monotonic() < give_up, "the monitor lease never came free"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("handover", ["stop", "expiry"])
async def test_a_new_watcher_repeats_no_alert_and_says_the_recovery_once(
    store: AsyncStore, namespace: str, handover: str
) -> None:
    slot = await overdue_job(store, namespace)
    said_a: list[Alert] = []
    said_b: list[Alert] = []
    # A short period for the first watcher: its lease (3 periods) expires within the test.
    a = Monitor(store, namespace, "host-a:1:tok-a", every_s=0.2, on_alert=said_a.append)
    b = Monitor(store, namespace, "host-b:2:tok-b", on_alert=said_b.append)

    assert await a.watch() is not None
    await a.watch()
    assert events(said_a) == ["overdue"]
    assert said_a[0].slot_us == slot
    if handover == "stop":
        await a.stop()  # hands the lease back
        assert await b.watch() is not None
    else:
        await take_over(b)  # a stopped watching without a word: its lease expires
    assert said_b == [], "the overdue slot was alerted by the first watcher already"
    await b.watch()
    assert said_b == []

    await succeed(store, namespace, slot)
    await b.watch()
    await b.watch()
    assert events(said_b) == ["recovered"]
    assert await a.watch() is None, "the first watcher is back, but the second one watches"
    await b.stop()
    assert await a.watch() is not None
    assert events(said_a) == ["overdue"], "the recovery was said already"


async def test_a_recovery_while_nobody_watched_is_said_by_the_next_watcher(
    store: AsyncStore, namespace: str
) -> None:
    slot = await overdue_job(store, namespace)
    said_a: list[Alert] = []
    said_b: list[Alert] = []
    a = Monitor(store, namespace, "host-a:1:tok-a", on_alert=said_a.append)
    assert await a.watch() is not None
    await a.stop()
    await succeed(store, namespace, slot)  # nobody watches now

    b = Monitor(store, namespace, "host-b:2:tok-b", on_alert=said_b.append)
    assert await b.watch() is not None
    await b.watch()
    assert events(said_a) == ["overdue"]
    assert events(said_b) == ["recovered"], "it never saw the job unhealthy, the store did"


async def test_the_marker_is_kept_apart_from_the_leases(store: AsyncStore, namespace: str) -> None:
    await overdue_job(store, namespace)
    monitor = Monitor(store, namespace, "host-a:1:tok-a")
    assert await monitor.watch() is not None
    every = [lease.name for lease in await store.run(store.ops.lease_list(namespace))]
    assert alert_marker(JOB) in every
    status = await store.run(read_status(store.ops, namespace))
    assert [lease.name for lease in status.markers] == [alert_marker(JOB)]
    assert alert_marker(JOB) not in [lease.name for lease in status.leases]
    assert "fleetcron:monitor" in [lease.name for lease in status.leases]
    assert "tok-a" not in status.markers[0].holder, "a marker shows no secret token"
    await monitor.stop()


async def test_the_webhook_gets_one_post_per_alert_across_two_watchers(
    store: AsyncStore, namespace: str
) -> None:
    slot = await overdue_job(store, namespace)
    server = PingServer()
    pingers = [AsyncPinger(), AsyncPinger()]
    try:
        watchers = [
            Monitor(
                store,
                namespace,
                f"host-{index}:{index}:tok",
                on_alert=AlertSender(
                    pinger, namespace, lambda: "replica", {}, f"{server.base}/hook/secret"
                ),
            )
            for index, pinger in enumerate(pingers)
        ]
        assert await watchers[0].watch() is not None
        # Order holds per replica; across replicas only if one's POST is out before the
        # other's (as when a stopping replica drains its pinger), so wait for it here.
        await asyncio.to_thread(server.wait_for, at_least(1), what="the overdue alert")
        await watchers[0].stop()
        assert await watchers[1].watch() is not None
        await watchers[1].watch()
        await succeed(store, namespace, slot)
        await watchers[1].watch()
        await watchers[1].watch()
        await asyncio.to_thread(server.wait_for, at_least(2), what="the recovery")
        for pinger in pingers:
            await pinger.close()  # everything queued has gone out
        bodies = [json.loads(received.body) for received in server.received]
    finally:
        server.close()
    assert [body["event"] for body in bodies] == ["overdue", "recovered"]
    keys = [body["idempotency_key"] for body in bodies]
    assert all(isinstance(key, str) and len(key) == 32 for key in keys)
    assert len(set(keys)) == 2
