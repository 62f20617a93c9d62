"""Alert webhooks: the monitor's alerts become one JSON POST each, in order, per job."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fleetcron.alerts import AlertSender
from fleetcron.errors import ConfigurationError
from fleetcron.jobsfile import load_jobs_file
from fleetcron.pings import AsyncPinger
from fleetcron.scheduling.monitor import Monitor
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock
from unit.ping_server import PingServer, Received

NS = "alerts"
MIN = 60_000_000
T0 = 1_800_000_000_000_000


async def test_an_overdue_job_posts_one_json_alert_per_slot_and_one_when_it_recovers() -> None:
    clock = FakeClock(wall_us=T0)
    store = MemoryStore(clock=clock)
    definition = {"schedule": {"kind": "every", "every_us": 5 * MIN}, "timezone": "UTC"}
    store.run(store.ops.job_register(NS, [("report", json.dumps(definition), "f" * 32)]))
    server = PingServer()
    pinger = AsyncPinger()
    sender = AlertSender(pinger, NS, lambda: "host:1:abc", {}, f"{server.base}/hook/secret")
    monitor = Monitor(AsyncMemoryStore(store), NS, "host:1:t", on_alert=sender)
    try:
        await monitor.watch()
        clock.advance(11 * 60)
        await monitor.watch()
        await monitor.watch()  # no change: nothing posted
        clock.advance(5 * 60)
        await monitor.watch()
        store.run(store.ops.job_set_paused(NS, "report", True))
        await monitor.watch()

        def three(received: list[Received]) -> list[Received]:
            return received if len(received) >= 3 else []

        posted = await asyncio.to_thread(server.wait_for, three, what="three alerts")
        await pinger.close()
    finally:
        server.close()
    assert [r.method for r in posted] == ["POST"] * 3
    assert {r.path for r in posted} == {"/hook/secret"}
    bodies = [json.loads(r.body) for r in posted]
    assert [b["event"] for b in bodies] == ["overdue", "overdue", "recovered"]
    assert [b["slot"] for b in bodies[:2]] == ["2027-01-15T08:05:00Z", "2027-01-15T08:10:00Z"]
    assert bodies[0]["job"] == "report"
    assert bodies[0]["namespace"] == NS
    assert bodies[0]["replica"] == "host:1:abc"
    assert "no success since the slot of" in bodies[0]["summary"]
    keys = [b["idempotency_key"] for b in bodies]  # receivers drop a POST seen twice
    assert len(set(keys)) == 3
    assert all(len(key) == 32 for key in keys)
    assert len(server.received) == 3


def test_alert_webhook_is_read_per_job_and_globally_and_checked(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[fleetcron]\nalert_webhook = "https://hooks.example.com/T000/B000/xyz"\n'
        '[jobs.a]\nevery = "1m"\ncommand = ["true"]\n'
        '[jobs.b]\nevery = "1m"\ncommand = ["true"]\n'
        'alert_webhook = "https://alerts.example.com/b"\n'
    )
    loaded = load_jobs_file(str(jobs))
    hooks = {spec.name: spec.alert_webhook for spec in loaded.jobs}
    assert hooks == {
        "a": "https://hooks.example.com/T000/B000/xyz",
        "b": "https://alerts.example.com/b",
    }
    assert loaded.alert_webhook == "https://hooks.example.com/T000/B000/xyz"
    assert "xyz" not in json.dumps(loaded.jobs[0].definition())
    jobs.write_text('[jobs.a]\nevery = "1m"\ncommand = ["true"]\nalert_webhook = "ftp://x/y"\n')
    with pytest.raises(ConfigurationError, match="alert_webhook"):
        load_jobs_file(str(jobs))
