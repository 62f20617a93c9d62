"""The view model behind ``fleetcron status`` and the dashboard: the replicas seen lately
and the leases, read with the jobs; a replica on other definitions is a note."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from fleetcron.cli import status_cmd, web_cmd
from fleetcron.errors import ConfigurationError
from fleetcron.models import REPLICA_RETAIN_US, ReplicaInfo
from fleetcron.status import read_status, read_status_in_turns
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock

NS = "view"
S = 1_000_000
TTL = 30 * S


def _beat(store: MemoryStore, pid: int, fingerprint: str = "1" * 32) -> None:
    info = ReplicaInfo(
        replica_id=f"host:{pid}:abcd",
        host="host",
        pid=pid,
        version="1.0",
        mode="claim",
        jobs_fingerprint=fingerprint,
    )
    store.run(store.ops.replica_beat(NS, info, TTL))


def test_the_status_carries_replicas_up_and_gone_and_the_leases() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    _beat(store, 1)
    clock.advance(REPLICA_RETAIN_US / S)  # replica 1 expired a while ago: gone, still listed
    _beat(store, 2)
    store.run(store.ops.lease_acquire(NS, "nightly", "host:2:secret", TTL, 0))
    status = store.run(read_status(store.ops, NS))
    assert [(r.replica_id, r.alive) for r in status.replicas] == [
        ("host:1:abcd", False),
        ("host:2:abcd", True),
    ]
    assert [lease.name for lease in status.leases] == ["nightly"]
    assert status.now_us == clock.wall_us()
    clock.advance(TTL / S + 1)  # replica 1 is past the retention now
    status = store.run(read_status(store.ops, NS))
    assert [r.replica_id for r in status.replicas] == ["host:2:abcd"]


def test_only_live_replicas_on_other_definitions_differ() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    _beat(store, 1, "0" * 32)
    clock.advance(TTL / S + 1)  # gone: runs nothing, compared with nobody
    _beat(store, 2)
    _beat(store, 3)
    assert store.run(read_status(store.ops, NS)).differing_replicas == frozenset()
    _beat(store, 4, "2" * 32)
    status = store.run(read_status(store.ops, NS))
    assert status.differing_replicas == {"host:4:abcd"}
    assert status.notes == (
        "replica host:4:abcd runs other job definitions than 2 other live replica(s) "
        "(jobs fingerprint 222222222222)",
    )
    _beat(store, 5, "2" * 32)  # two against two: neither side is the odd one
    status = store.run(read_status(store.ops, NS))
    assert status.differing_replicas == {f"host:{pid}:abcd" for pid in (2, 3, 4, 5)}


def _status_args(backend: str, *arguments: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetcron")
    status_cmd.add_parser(parser.add_subparsers(dest="command"), [])
    args = parser.parse_args(["status", *arguments])
    args.backend, args.namespace = backend, NS
    return args


def test_fleetcron_status_lists_the_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'fleetcron.db'}"
    store = open_store(parse_store_url(url))
    try:
        schedule = {"kind": "every", "every_us": 60 * S}
        definition = json.dumps({"schedule": schedule, "timezone": "UTC"})
        store.run(store.ops.job_register(NS, [("report", definition, "f" * 32)]))
        for pid, fingerprint in ((7, "a" * 32), (8, "a" * 32), (9, "b" * 32)):
            info = ReplicaInfo(
                replica_id=f"web-{pid}:{pid}:0f0f",
                host=f"web-{pid}",
                pid=pid,
                version="1.0",
                mode="claim",
                jobs_fingerprint=fingerprint,
            )
            store.run(store.ops.replica_beat(NS, info, TTL))
    finally:
        store.close()

    assert status_cmd.run(_status_args(url)) == 0
    lines = capsys.readouterr().out.splitlines()
    section = lines[lines.index("replicas:") :]
    assert section[1].split() == ["REPLICA", "MODE", "STATE", "VERSION", "STARTED", "LAST",
                                  "BEAT", "JOBS"]  # fmt: skip
    assert section[2].split()[:4] == ["web-7:7:0f0f", "claim", "up", "1.0"]
    assert section[2].split()[-1] == "a" * 12
    assert section[-1] == (
        "note: replica web-9:9:0f0f runs other job definitions than 2 other live replica(s) "
        "(jobs fingerprint bbbbbbbbbbbb)"
    )

    assert status_cmd.run(_status_args(url, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["replica_id"] for r in report["replicas"]] == [
        "web-7:7:0f0f",
        "web-8:8:0f0f",
        "web-9:9:0f0f",
    ]
    assert [r["differs"] for r in report["replicas"]] == [False, False, True]
    assert report["replicas"][0]["alive"] is True
    assert report["notes"] == [section[-1].removeprefix("note: ")]


@pytest.mark.parametrize("where", ["8080", "localhost", "127.0.0.1:http", "127.0.0.1:70000"])
def test_a_malformed_listen_address_is_refused(where: str) -> None:
    with pytest.raises(ConfigurationError, match="--listen must be HOST:PORT"):
        web_cmd.listen(where, "--listen")


def test_a_port_in_use_is_refused_before_anything_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"--web 127.0.0.1:{port}: cannot listen"):
            web_cmd.listen(f"127.0.0.1:{port}", "--web")


def test_the_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetcron.web.app import TOKEN_ENV

    assert web_cmd.TOKEN_ENV == TOKEN_ENV
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert web_cmd.web_token() is None
    monkeypatch.setenv(TOKEN_ENV, "  \n")
    assert web_cmd.web_token() is None
    monkeypatch.setenv(TOKEN_ENV, "0123456789abcdef0123\n")
    assert web_cmd.web_token() == "0123456789abcdef0123"


def test_every_job_is_assessed_with_its_own_ledger_rows_past_one_batch_of_jobs() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    names = [f"job-{index:04d}" for index in range(1_203)]  # three round trips of jobs
    store.run(store.ops.job_register(NS, [(name, "{}", "f" * 32) for name in names]))
    slot = clock.wall_us() - 60 * S
    failed = set(names[498:503] + names[-2:])  # on both sides of each batch's edge
    for name in failed:
        assert store.run(store.ops.run_record(NS, name, slot, "missed", "late", "schedule"))

    status = store.run(read_status(store.ops, NS))

    assert sorted(health.job for health in status.jobs) == names
    latest = {health.job: health.last_run for health in status.jobs}
    assert {name for name, run in latest.items() if run is not None} == failed
    assert {name: run.job for name, run in latest.items() if run is not None} == {
        name: name for name in failed
    }


class _Turns(AsyncMemoryStore):
    """An async store that counts the operations it is given."""

    turns = 0

    async def run(self, operation: Any) -> Any:
        self.turns += 1
        return await super().run(operation)


async def test_a_status_read_in_turns_is_the_same_read_split_into_operations() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    names = [f"job-{index:04d}" for index in range(1_000)]
    store.run(store.ops.job_register(NS, [(name, "{}", "f" * 32) for name in names]))
    slot = clock.wall_us() - 60 * S
    for name in names[::7]:
        assert store.run(store.ops.run_record(NS, name, slot, "missed", "late", "schedule"))
    _beat(store, 1)
    turns = _Turns(store)

    whole = store.run(read_status(store.ops, NS, [*names[:700], "nobody"]))
    split = await read_status_in_turns(turns, NS, [*names[:700], "nobody"])

    assert split == whole
    assert turns.turns == 3  # the fleet's rows, then 500 + 200 jobs' ledger rows
    assert split.unknown_jobs == ("nobody",)
    assert len(split.jobs) == 700
