"""``fleetcron locks``, ``prune`` and ``migrate``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, wait_for
from fleetcron import Fleet


def _secret_token(cli: Cli, name: str) -> str:
    with Fleet(cli.backend, namespace=cli.namespace) as fleet:
        record = fleet.get(name)
    assert record is not None
    token = record.holder.rpartition(":")[2]
    assert len(token) >= 16
    return token


@CROSS_PROCESS_BACKENDS
def test_locks_shows_name_holder_and_fence_but_never_the_holder_token(
    cli: Cli, tmp_path: Path
) -> None:
    fence_file = tmp_path / "fence"
    # --lock-at-least keeps the lease held after the command ends, with no process left.
    result = cli.run(
        "exec", "report", "--lock-at-least", "1m", "--",
        "sh", "-c", 'echo "$FLEETCRON_FENCE" > "$1"', "sh", str(fence_file),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    fence = int(fence_file.read_text())
    token = _secret_token(cli, "report")

    as_json = cli.run("locks", "--json")
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    assert row["name"] == "report"
    assert row["fence"] == fence
    assert row["held"] is True
    host, pid = row["holder"].split(":")
    assert host == socket.gethostname()
    assert int(pid) > 0
    assert 0 < row["expires_in_s"] <= 60

    table = cli.run("locks")
    assert table.returncode == 0, table.stderr
    header, line = table.stdout.strip().splitlines()
    assert header.split()[:4] == ["NAME", "STATE", "HOLDER", "FENCE"]
    assert line.split()[:4] == ["report", "held", row["holder"], str(fence)]
    for output in (as_json.stdout, table.stdout, as_json.stderr, table.stderr):
        assert token not in output


@CROSS_PROCESS_BACKENDS
def test_prune_dry_run_lists_without_deleting_then_prune_deletes(cli: Cli) -> None:
    assert cli.run("exec", "old", "--", "true").returncode == 0
    assert cli.run("exec", "held", "--lock-at-least", "1m", "--", "true").returncode == 0

    def listed_by_dry_run() -> str | None:
        result = cli.run("prune", "--older-than", "1s", "--dry-run")
        assert result.returncode == 0, result.stderr
        return result.stdout if "old" in result.stdout else None

    dry = wait_for(listed_by_dry_run, timeout=10, what="'old' to be older than 1s")
    assert dry.splitlines() == ["would delete 1 lease row(s)", "  old"]
    assert sorted(row["name"] for row in cli.locks()) == ["held", "old"]

    pruned = cli.run("prune", "--older-than", "1s")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.splitlines() == ["deleted 1 lease row(s)", "  old"]
    assert [row["name"] for row in cli.locks()] == ["held"]


@CROSS_PROCESS_BACKENDS
def test_prune_older_than_0s_takes_every_lease_not_held_and_never_a_held_one(cli: Cli) -> None:
    assert cli.run("exec", "done", "--", "true").returncode == 0
    assert cli.run("exec", "held", "--lock-at-least", "1m", "--", "true").returncode == 0

    def listed() -> str | None:  # once the store's clock has passed the fence of "done"
        result = cli.run("prune", "--older-than", "0s", "--dry-run")
        assert result.returncode == 0, result.stderr
        return result.stdout if "done" in result.stdout else None

    assert wait_for(listed, timeout=10).splitlines() == ["would delete 1 lease row(s)", "  done"]
    pruned = cli.run("prune", "--older-than", "0s")
    assert pruned.stdout.splitlines() == ["deleted 1 lease row(s)", "  done"]
    assert [row["name"] for row in cli.locks()] == ["held"]


@CROSS_PROCESS_BACKENDS
def test_migrate_is_idempotent_and_keeps_leases(cli: Cli) -> None:
    assert cli.run("exec", "kept", "--lock-at-least", "1m", "--", "true").returncode == 0
    before = cli.lease("kept")
    for _ in range(2):
        result = cli.run("migrate")
        assert result.returncode == 0, result.stderr
        assert "up to date" in result.stdout
    after = cli.lease("kept")
    assert before is not None
    assert after is not None
    stable = ("name", "holder", "fence", "held", "acquired_at", "expires_at")
    assert {k: after[k] for k in stable} == {k: before[k] for k in stable}


def test_migrate_creates_a_fresh_sqlite_schema_once(sqlite_cli: Cli, tmp_path: Path) -> None:
    first = sqlite_cli.run("migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied ")
    assert (tmp_path / "fleetcron.db").exists()
    second = sqlite_cli.run("migrate")
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
