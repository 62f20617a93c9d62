"""``fleetcron backfill``: at most a bounded number of slots, written in one step or none.

The job is registered straight into the store (as a replica would have registered it; the
schedule is all a backfill reads), then the CLI runs as a subprocess against the same store.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error, wait_for
from fleetcron import Fleet
from fleetcron.models import micros_to_datetime

SECOND = 1_000_000
EVERY_SECOND = {"kind": "every", "every_us": SECOND}
# The command runs with at most 1 GiB of address space (it needs about 60 MB of memory):
# one that held a range's slots beyond the ceiling fails here instead of taking the host's.
BOUNDED = ("prlimit", f"--as={1 << 30}", "--")


@pytest.fixture
def fleet(cli: Cli) -> Iterator[Fleet]:
    with Fleet(cli.backend, namespace=cli.namespace) as opened:
        yield opened


def register(fleet: Fleet, job: str, schedule: dict[str, object]) -> None:
    definition = json.dumps({"schedule": schedule})
    store = fleet.store
    store.run(store.ops.job_register(fleet.namespace, [(job, definition, f"fp-{job}")]))


def ledger(fleet: Fleet, job: str) -> list[tuple[int, str, str]]:
    return sorted((r.slot_us, r.state, r.trigger) for r in fleet.runs(job, limit=1000))


def iso(micros: int) -> str:
    """An instant as the command reads and writes it (whole seconds, UTC)."""
    return micros_to_datetime(micros).isoformat(timespec="seconds").replace("+00:00", "Z")


@CROSS_PROCESS_BACKENDS
def test_a_backfill_beyond_the_ceiling_or_its_limit_is_refused_at_once_and_writes_nothing(
    cli: Cli, fleet: Fleet
) -> None:
    register(fleet, "beat", EVERY_SECOND)
    store = fleet.store
    now = store.run(store.ops.store_now())
    assert store.run(
        store.ops.run_record(fleet.namespace, "beat", now - SECOND, "missed", None, "schedule")
    )
    before = ledger(fleet, "beat")
    years = ("--from", iso(now - 6 * 365 * 24 * 3600 * SECOND), "--to", iso(now - SECOND))

    for limit, message in [
        (("--limit", "1000000000"), "--limit must be between 1 and 100000"),
        (("--limit", "100000"), "the range holds more than 100000 slots; nothing was queued"),
        ((), "the range holds more than 1000 slots; nothing was queued"),
    ]:
        result = cli.run("backfill", "beat", *years, *limit, timeout=60, prefix=BOUNDED)
        assert_clean_error(result, 2, message)

    assert ledger(fleet, "beat") == before


@CROSS_PROCESS_BACKENDS
def test_a_backfill_says_how_many_slots_it_queued_and_how_many_had_a_row(
    cli: Cli, fleet: Fleet
) -> None:
    register(fleet, "beat", EVERY_SECOND)
    store = fleet.store
    now = store.run(store.ops.store_now())
    start = now - now % SECOND - 20 * SECOND
    slots = [start + index * SECOND for index in range(10)]
    for slot in slots[2:5]:
        assert store.run(
            store.ops.run_record(fleet.namespace, "beat", slot, "skipped", None, "schedule")
        )
    span = ("--from", iso(slots[0]), "--to", iso(slots[-1]))

    result = cli.run("backfill", "beat", *span, "--limit", "10")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"beat: queued 7 of 10 slot(s) from {iso(slots[0])} to {iso(slots[-1])}; "
        "3 already have a ledger row"
    )
    assert ledger(fleet, "beat") == [
        (slot, "skipped", "schedule") if slot in slots[2:5] else (slot, "queued", "backfill")
        for slot in slots
    ]
    again = cli.run("backfill", "beat", *span, "--limit", "10")
    assert "queued 0 of 10 slot(s)" in again.stdout
    assert_clean_error(
        cli.run("backfill", "beat", *span, "--limit", "9"),
        2,
        "the range holds more than 9 slots; nothing was queued: narrow it or raise --limit",
    )


HOURLY = """
[jobs.hourly]
every = "1h"
grace = "10m"
command = ["true"]
"""


@CROSS_PROCESS_BACKENDS
def test_backfilling_days_of_a_job_registered_just_now_leaves_it_healthy(
    cli: Cli, fleet: Fleet
) -> None:
    jobs = cli.workdir / "jobs.toml"
    jobs.write_text(HOURLY)
    replica = cli.spawn("run", str(jobs))  # registers the job, as a deploy does
    assert wait_for(lambda: fleet.store.run(fleet.store.ops.job_get(fleet.namespace, "hourly")))
    replica.proc.send_signal(signal.SIGTERM)
    assert replica.wait(timeout=60).returncode == 0
    store = fleet.store
    now = store.run(store.ops.store_now())
    days = ("--from", iso(now - 3 * 24 * 3600 * SECOND), "--to", iso(now - 2 * 24 * 3600 * SECOND))

    backfilled = cli.run("backfill", "hourly", *days)
    assert backfilled.returncode == 0, backfilled.stderr
    assert backfilled.stdout.endswith("; 0 already have a ledger row\n"), backfilled.stdout

    check = cli.run("status", "--check", "hourly")
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(cli.run("status", "--json", "hourly").stdout)["jobs"][0]
    assert (report["state"], report["overdue"], report["expected_slot"]) == ("ok", False, None)
