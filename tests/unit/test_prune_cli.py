"""``fleetcron prune --runs --dry-run`` in process: a dry run counts a bounded number of
rows per job and says "at least" when it reached the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

import fleetcron.cli.main as cli_main
import fleetcron.scheduling.retention as retention
from fleetcron import Fleet


def test_a_dry_run_that_reaches_its_count_bound_says_at_least(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'fleetcron.db'}"
    with Fleet(url, namespace="ns") as fleet:
        store, ops = fleet.store, fleet.store.ops
        store.run(ops.job_register("ns", [("big", "{}", "fp"), ("small", "{}", "fp")]))
        now = store.run(ops.store_now())
        for index in range(1, 6):
            assert store.run(ops.run_record("ns", "big", now - index, "skipped", None, "schedule"))
        assert store.run(ops.run_record("ns", "small", now - 1, "skipped", None, "schedule"))
        finished = store.run(ops.run_get("ns", "small", now - 1))
        assert finished is not None
        assert finished.finished_us is not None
        while store.run(ops.store_now()) <= finished.finished_us:  # "older than 0s": past it
            pass
    monkeypatch.setattr(retention, "COUNT_LIMIT", 3)
    monkeypatch.setattr(cli_main, "COUNT_LIMIT", 3)
    args = ["--backend", url, "--namespace", "ns", "prune", "--runs"]

    assert cli_main.main([*args, "--older-than", "0s", "--keep", "0", "--dry-run"]) == 0

    assert capsys.readouterr().out.splitlines() == [
        "would delete at least 4 run row(s) of 2 job(s)",
        "  big: at least 3",
        "  small: 1",
    ]
    assert cli_main.main([*args, "--older-than", "0s", "--keep", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "deleted 6 run row(s) of 2 job(s)",
        "  big: 5",
        "  small: 1",
    ]
