"""The monitor's alert markers over a memory store: a store failure delays an alert and
never doubles it, a watcher whose view is stale says nothing, the marker of a job that
is gone is let go, and no listing shows a marker."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from starlette.testclient import TestClient

from fleetcron.alerts import Alert
from fleetcron.cli.main import main
from fleetcron.errors import StoreUnavailable
from fleetcron.models import LeaseRecord
from fleetcron.scheduling.monitor import Monitor, alert_marker
from fleetcron.status import ALERT_MARKER_PREFIX, is_alert_marker
from fleetcron.stores import open_async_store, parse_store_url
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import AsyncMemoryStore, MemoryOperations, MemoryStore
from fleetcron.testing import FakeClock
from fleetcron.web import create_app

T = TypeVar("T")
NS = "marks"
MIN = 60_000_000
T0 = 1_800_000_000_000_000  # on a minute boundary
DEFINITION = json.dumps({"schedule": {"kind": "every", "every_us": 5 * MIN}, "timezone": "UTC"})


class MarkerOps(MemoryOperations):
    """Memory operations that spring ``trap`` on the next write of an alert marker."""

    def __init__(self) -> None:
        super().__init__()
        self.trap: str | None = None  # "down", "lost" or "interleave"
        self.sprung: str | None = None

    def _written(self, name: str) -> None:
        if self.trap is not None and is_alert_marker(name):
            self.sprung, self.trap = self.trap, None

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        self._written(name)
        return super().lease_acquire(namespace, name, holder, ttl_us, least_us)

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        self._written(name)
        return super().lease_release(namespace, name, holder, fence)


class TrappedStore(AsyncMemoryStore):
    """The memory store, but a marker write whose trap sprang fails before it reaches the
    store (``down``), loses its answer after the store carried it out (``lost``), or
    lets ``interleave`` run first (another replica, in the middle of this one's watch)."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.marker_ops = MarkerOps()
        self.ops = self.marker_ops
        self.interleave: Callable[[], Awaitable[None]] | None = None

    async def run(self, operation: Operation[T]) -> T:
        sprung, self.marker_ops.sprung = self.marker_ops.sprung, None
        if sprung == "down":
            operation.close()
            raise StoreUnavailable("the store is down")
        if sprung == "interleave" and self.interleave is not None:
            await self.interleave()
        result = await super().run(operation)
        if sprung == "lost":
            raise StoreUnavailable("the connection dropped before the answer")
        return result


def fleet() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(wall_us=T0)
    store = MemoryStore(clock=clock)
    store.run(store.ops.job_register(NS, [("report", DEFINITION, "f" * 32)]))
    return store, clock


def actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "action", "")) for r in caplog.records if r.name == "fleetcron"]


@pytest.mark.parametrize("trap", ["down", "lost"])
async def test_a_store_failure_delays_an_alert_and_never_doubles_it(
    trap: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, clock = fleet()
    trapped = TrappedStore(store)
    said: list[Alert] = []
    monitor = Monitor(trapped, NS, "host:1:secret", on_alert=said.append)
    clock.advance(11 * 60)  # the slot T0+5m had until T0+10m
    trapped.marker_ops.trap = trap
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        assert await monitor.watch() is not None
    assert said == [], "nothing is said without its marker"
    assert "alert_delayed" in actions(caplog)
    await monitor.watch()  # the store answers again
    await monitor.watch()
    assert [(a.event, a.slot_us) for a in said] == [("overdue", T0 + 5 * MIN)]
    marker = store.run(store.ops.lease_get(NS, alert_marker("report")))
    assert marker is not None
    assert marker.holder.startswith("host:1:"), "who said it, without the secret token"
    assert "secret" not in marker.holder


async def test_a_watcher_whose_lease_moved_on_during_its_watch_says_nothing() -> None:
    store, clock = fleet()
    trapped = TrappedStore(store)
    said_a: list[Alert] = []
    said_b: list[Alert] = []
    a = Monitor(trapped, NS, "host-a:1:x", on_alert=said_a.append)
    b = Monitor(AsyncMemoryStore(store), NS, "host-b:2:y", on_alert=said_b.append)
    clock.advance(11 * 60)
    await a.watch()  # overdue for T0+5m
    clock.advance(5 * 60)  # T0+10m is due as well

    async def b_takes_over() -> None:
        clock.advance(60)  # a's lease (45 s) has expired in the middle of its watch
        assert await b.watch() is not None

    trapped.interleave = b_takes_over
    trapped.marker_ops.trap = "interleave"
    await a.watch()  # read T0+10m as due; b said it before a changed the marker
    assert [a.slot_us for a in said_a] == [T0 + 5 * MIN]
    assert [b.slot_us for b in said_b] == [T0 + 10 * MIN]

    # A view older than the marker it meets: a's last (overdue) view and a's term, against
    # the recovery b said since. The marker is b's, held: only its term tells a to hold on.
    assert a.lease is not None
    stale = a.last
    assert stale is not None
    [health] = stale.jobs
    store.run(store.ops.job_set_paused(NS, "report", True))
    assert await b.watch() is not None
    marker = store.run(store.ops.lease_get(NS, alert_marker("report")))
    assert marker is not None
    assert marker.held
    await a._settle(health, marker, a.lease.fence)
    assert [b.event for b in said_b] == ["overdue", "recovered"]
    assert len(said_a) == 1


async def test_the_marker_of_a_job_that_is_gone_is_let_go() -> None:
    store, clock = fleet()
    said: list[Alert] = []
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:x", on_alert=said.append)
    clock.advance(11 * 60)
    await monitor.watch()
    name = alert_marker("report")
    held = store.run(store.ops.lease_get(NS, name))
    assert held is not None
    assert held.held
    assert store.run(store.ops.job_delete(NS, "report"))
    await monitor.watch()
    gone = store.run(store.ops.lease_get(NS, name))
    assert gone is not None
    assert not gone.held, "released: fleetcron prune may delete it"
    assert [a.event for a in said] == ["overdue"], "nothing is said of a job that is gone"
    clock.advance(3600)
    assert name in store.run(store.ops.lease_prune(NS, 60_000_000, False))


def test_a_marker_name_fits_a_lease_name_column() -> None:
    assert alert_marker("report") == "fleetcron:alert:report"
    long = alert_marker("ж" * 400)
    assert long.startswith(ALERT_MARKER_PREFIX)
    assert len(long.encode()) <= 800
    assert long != alert_marker("ж" * 399)


async def test_no_listing_shows_a_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'fleetcron.db'}"
    store = await open_async_store(parse_store_url(url))
    now = await store.run(store.ops.store_now())
    slot = now - 3_600_000_000
    definition = {"schedule": {"kind": "at", "moment_us": slot}, "timezone": "UTC"}
    await store.run(store.ops.job_register(NS, [("report", json.dumps(definition), "f" * 32)]))
    await store.run(store.ops.run_record(NS, "report", slot - MIN, "skipped", None, "manual"))
    monitor = Monitor(store, NS, "host:1:x")
    try:
        assert await monitor.watch() is not None
        names = [lease.name for lease in await store.run(store.ops.lease_list(NS))]
        assert alert_marker("report") in names
    finally:
        await store.close()

    common = ["--backend", url, "--namespace", NS]
    for command in (["locks"], ["locks", "--json"], ["status"], ["status", "--json"]):
        main([*command, *common])
        out = capsys.readouterr().out
        assert ALERT_MARKER_PREFIX not in out, command
        if command[0] == "locks":
            assert "fleetcron:monitor" in out, command

    memory = MemoryStore()
    memory.run(memory.ops.lease_acquire(NS, alert_marker("report"), "host:1:1.failing.-", MIN, 0))
    memory.run(memory.ops.lease_acquire(NS, "nightly", "host:2:tok", MIN, 0))
    with TestClient(create_app(AsyncMemoryStore(memory), NS, None)) as client:
        page = client.get("/leases").text
        api = client.get("/api/leases").json()
    assert 'data-lease="nightly"' in page
    assert ALERT_MARKER_PREFIX not in page
    assert [lease["name"] for lease in api] == ["nightly"]
