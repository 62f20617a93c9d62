"""``fleetcron prune --runs`` and ``prune --jobs``: retention and forgotten jobs by hand.

Ledger rows are written straight into the store (as replicas would have left them), then
the CLI runs as a subprocess against the same store. Tests wait on the store's clock
through the CLI's own answers, never on fixed sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.helpers import Cli, assert_clean_error, wait_for
from fleetcron import Fleet

MINUTE = 60_000_000
ON_SQLITE_AND_POSTGRES = pytest.mark.parametrize(
    "backend_url", ["sqlite", "postgres"], indirect=True
)


@pytest.fixture
def fleet(cli: Cli) -> Iterator[Fleet]:
    with Fleet(cli.backend, namespace=cli.namespace) as opened:
        yield opened


def seed(fleet: Fleet, job: str, definition: dict[str, int], *states: str) -> list[int]:
    """Register ``job`` and give it one row per state, a minute apart, all in the past."""
    store, ns = fleet.store, fleet.namespace
    store.run(store.ops.job_register(ns, [(job, json.dumps(definition), f"fp-{job}")]))
    now = store.run(store.ops.store_now())
    slots = [now - (len(states) - index) * MINUTE for index in range(len(states))]
    for slot, state in zip(slots, states, strict=True):
        trigger = "manual" if state == "queued" else "schedule"
        assert store.run(store.ops.run_record(ns, job, slot, state, None, trigger))
    return slots


def slots_of(fleet: Fleet, job: str) -> list[int]:
    return sorted(run.slot_us for run in fleet.runs(job, limit=100))


def jobs_of(fleet: Fleet) -> list[str]:
    return [row.job for row in fleet.store.run(fleet.store.ops.job_list(fleet.namespace))]


def lines(cli: Cli, *args: str) -> list[str]:
    result = cli.run("prune", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@ON_SQLITE_AND_POSTGRES
def test_prune_runs_dry_run_says_what_each_job_would_lose_then_prune_deletes_it(
    cli: Cli, fleet: Fleet
) -> None:
    # report's replicas registered retention = "1s", retention_keep = 2; other has defaults.
    report = seed(
        fleet, "report", {"retention_us": 1_000_000, "retention_keep": 2}, *5 * ["skipped"]
    )
    other = seed(fleet, "other", {}, "succeeded", "failed", "missed")

    def dry_run() -> list[str] | None:
        found = lines(cli, "--runs", "--dry-run")
        return found if found[0] != "would delete 0 run row(s) of 0 job(s)" else None

    assert wait_for(dry_run, timeout=20, what="report's rows to pass 1s") == [
        "would delete 3 run row(s) of 1 job(s)",
        "  report: 3",
    ]
    assert slots_of(fleet, "report") == report, "a dry run changes nothing"

    assert lines(cli, "--runs") == ["deleted 3 run row(s) of 1 job(s)", "  report: 3"]
    assert slots_of(fleet, "report") == report[3:], "the newest two stay"
    assert slots_of(fleet, "other") == other, "30 days and 100 runs by default"

    by_hand = ("--runs", "--job", "other", "--older-than", "0s", "--keep", "1")
    assert lines(cli, *by_hand, "--dry-run") == [
        "would delete 2 run row(s) of 1 job(s)",
        "  other: 2",
    ]
    assert lines(cli, *by_hand) == ["deleted 2 run row(s) of 1 job(s)", "  other: 2"]
    assert slots_of(fleet, "other") == other[2:]
    assert slots_of(fleet, "report") == report[3:], "--job leaves the other jobs alone"


@ON_SQLITE_AND_POSTGRES
def test_prune_jobs_lists_idle_jobs_and_forgets_those_with_nothing_queued_or_running(
    cli: Cli, fleet: Fleet
) -> None:
    seed(fleet, "gone", {}, "succeeded", "failed")
    busy = seed(fleet, "busy", {}, "skipped", "queued")

    def listed() -> list[str] | None:
        found = lines(cli, "--jobs", "--older-than", "5s", "--dry-run")
        return found if len(found) == 3 else None

    dry = wait_for(listed, timeout=30, what="both jobs to be idle for 5s")
    assert dry[0] == "would delete 1 job row(s) idle for more than 5s"
    assert dry[1].startswith("  busy: idle "), dry
    assert dry[1].endswith(", kept: it has a queued or running run"), dry
    assert dry[2].startswith("  gone: idle "), dry
    assert dry[2].endswith(", with 2 run row(s)"), dry
    assert jobs_of(fleet) == ["busy", "gone"], "a dry run changes nothing"
    assert len(slots_of(fleet, "gone")) == 2

    seed(fleet, "alive", {})  # registered just now by a replica
    pruned = lines(cli, "--jobs", "--older-than", "5s")

    assert pruned[0] == "deleted 1 job row(s) idle for more than 5s"
    assert [line.split(":")[0] for line in pruned[1:]] == ["  busy", "  gone"]
    assert jobs_of(fleet) == ["alive", "busy"]
    assert slots_of(fleet, "gone") == [], "its finished runs went with it"
    assert slots_of(fleet, "busy") == busy


def test_prune_refuses_bad_input_with_a_clear_message_and_changes_nothing(
    sqlite_cli: Cli,
) -> None:
    cli = sqlite_cli
    with Fleet(cli.backend, namespace=cli.namespace) as fleet:
        slots = seed(fleet, "report", {"retention_us": 0, "retention_keep": 0}, "skipped")
        cases = [
            (("--runs", "--keep", "-1"), "--keep must be 0 or more, got -1"),
            (("--runs", "--older-than", "-1d"), "--older-than must not be negative"),
            (("--runs", "--older-than", "soon"), "'soon' is not a duration"),
            (("--runs", "--job", "nope"), "no job 'nope' in namespace"),
            (("--runs", "--job", "bad name!"), "invalid job name"),
            (("--keep", "3"), "--keep applies to prune --runs only"),
            (("--jobs", "--job", "report"), "--job applies to prune --runs only"),
            (("--jobs", "--older-than", "0s"), "--older-than must be positive with --jobs"),
            (("--runs", "--jobs"), "not allowed with argument"),
            (("--runs", "--keep", "many"), "invalid int value"),
        ]
        for args, fragment in cases:
            assert_clean_error(cli.run("prune", *args), 2, fragment)
        assert slots_of(fleet, "report") == slots
        assert jobs_of(fleet) == ["report"]


def test_prune_help_names_the_three_modes(sqlite_cli: Cli) -> None:
    result = sqlite_cli.run("prune", "--help", flags=False)

    assert result.returncode == 0, result.stderr
    for mode in ("--leases (default)", "--runs", "--jobs", "--dry-run says what"):
        assert mode in result.stdout, mode
