"""A Redis that keeps nothing is said loudly, once per loss of its data; a Redis that
persists keeps the ledger across a restart, so a finished slot does not run again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import Cli
from redis_server import RedisServer

WARNING = "keeps nothing across a restart"
YEARLY = "0 0 1 1 *"  # every invocation of the test counts for the same (latest) slot


@pytest.fixture
def ephemeral_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, ["--save", "", "--appendonly", "no"])
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, ["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
    try:
        yield server
    finally:
        server.close()


def _exec(cli: Cli, runs: Path) -> str:
    result = cli.run(
        "exec", "report", "--schedule", YEARLY, "--", "sh", "-c", f"echo ran >> {runs}"
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_redis_without_persistence_is_warned_about_once_per_loss_of_its_data(
    ephemeral_redis: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(ephemeral_redis.url, namespace, tmp_path)
    runs = tmp_path / "runs"

    first, second = _exec(cli, runs), _exec(cli, runs)
    assert first.count(WARNING) == 1, first
    assert WARNING not in second, second
    assert runs.read_text().splitlines() == ["ran"]

    # The restart loses the ledger with everything else: the finished slot runs again,
    # and the warning comes again, once.
    ephemeral_redis.stop()
    ephemeral_redis.start()
    third = _exec(cli, runs)
    assert third.count(WARNING) == 1, third
    assert runs.read_text().splitlines() == ["ran", "ran"]


def test_a_persistent_redis_keeps_a_finished_slot_finished_across_a_restart(
    persistent_redis: RedisServer, namespace: str, tmp_path: Path
) -> None:
    cli = Cli(persistent_redis.url, namespace, tmp_path)
    runs = tmp_path / "runs"

    assert WARNING not in _exec(cli, runs)
    persistent_redis.stop()
    persistent_redis.start()
    assert WARNING not in _exec(cli, runs)

    assert runs.read_text().splitlines() == ["ran"], "the finished slot ran again"
