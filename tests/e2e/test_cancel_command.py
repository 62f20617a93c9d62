"""``fleetcron cancel``: the request side, as a process against every shared store. The
running attempt is made directly with the store's ``run_claim`` (as a replica's claim
makes it); that its replica then stops it is the scheduler's part."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterator

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_NONE_RUNNING, EXIT_USAGE
from fleetcron.models import RunRecord, SlotClaim
from fleetcron.schedules import iso_utc
from fleetcron.stores import SyncStore, open_store, parse_store_url

MINUTE = 60_000_000
LONG = 120_000_000  # no attempt of these tests expires while they run


@pytest.fixture
def store(cli: Cli) -> Iterator[SyncStore]:
    """The store the command uses, opened by the test (schema created)."""
    opened = open_store(parse_store_url(cli.backend))
    try:
        yield opened
    finally:
        opened.close()


def _running(store: SyncStore, namespace: str, job: str, slot_us: int) -> RunRecord:
    claim = SlotClaim(job=job, slot_us=slot_us, run_id=f"{job}-{slot_us}", exclusive=False)
    [answer] = store.run(store.ops.run_claim(namespace, [claim], "host-a:17:secret", LONG))
    assert answer.run is not None, answer
    return answer.run


def _row(store: SyncStore, namespace: str, job: str, slot_us: int) -> RunRecord:
    row = store.run(store.ops.run_get(namespace, job, slot_us))
    assert row is not None
    return row


@CROSS_PROCESS_BACKENDS
def test_cancel_asks_the_running_attempt_to_stop_noting_who_asked(
    cli: Cli, store: SyncStore
) -> None:
    ns = cli.namespace
    store.run(store.ops.job_register(ns, [("job", "{}", ""), ("other", "{}", "")]))
    now = store.run(store.ops.store_now())
    s1, s2 = now - 2 * MINUTE, now - MINUTE
    _running(store, ns, "job", s1)
    _running(store, ns, "job", s2)
    _running(store, ns, "other", s2)

    one = cli.run("cancel", "job", "--slot", iso_utc(s2), "--by", "ops@host-a")
    assert (one.returncode, one.stderr) == (0, ""), one.stderr
    assert one.stdout.strip() == (
        f"asked 1 running attempt of job to stop (slot {iso_utc(s2)}); it stops within "
        "about a second, recorded cancelled by ops@host-a"
    )
    asked = _row(store, ns, "job", s2)
    assert (asked.state, asked.cancel_requested, asked.error) == (
        "running",
        True,
        "cancelled by ops@host-a",
    )
    assert not _row(store, ns, "job", s1).cancel_requested

    every = cli.run("cancel", "job", "--json")
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout) == {"job": "job", "slot": None, "asked": 2, "by": me}
    for slot in (s1, s2):
        row = _row(store, ns, "job", slot)
        assert (row.cancel_requested, row.error) == (True, f"cancelled by {me}")
    other = _row(store, ns, "other", s2)
    assert (other.cancel_requested, other.error) == (False, None)


@CROSS_PROCESS_BACKENDS
def test_cancel_with_nothing_running_exits_1_and_changes_nothing(
    cli: Cli, store: SyncStore
) -> None:
    ran = cli.run("exec", "beat", "--schedule", "* * * * *", "--", "true")
    assert ran.returncode == 0, ran.stderr
    [finished] = store.run(store.ops.run_list(cli.namespace, "beat", 10))

    idle = cli.run("cancel", "beat")
    assert (idle.returncode, idle.stderr) == (EXIT_NONE_RUNNING, "")
    assert idle.stdout.strip() == "beat has no running attempt (nothing to cancel)"
    at = cli.run("cancel", "beat", "--slot", iso_utc(finished.slot_us), "--json")
    assert at.returncode == EXIT_NONE_RUNNING
    assert json.loads(at.stdout)["asked"] == 0
    [after] = store.run(store.ops.run_list(cli.namespace, "beat", 10))
    assert (after.state, after.cancel_requested, after.error) == (
        "succeeded",
        False,
        finished.error,
    )


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
def test_an_unknown_job_or_a_bad_argument_is_exit_2_before_anything_changes(
    cli: Cli, store: SyncStore
) -> None:
    ns = cli.namespace
    store.run(store.ops.job_register(ns, [("job", "{}", "")]))
    slot = store.run(store.ops.store_now()) - MINUTE
    _running(store, ns, "job", slot)

    for argv, message in [
        (("cancel", "ghost"), f"no job 'ghost' in namespace {ns!r} (jobs register when"),
        (("cancel", "job", "--slot", "yesterday"), "--slot: 'yesterday' is not an ISO 8601 time"),
        (("cancel", "job", "--by", "ops\nforged"), "--by must be printable text on one line"),
        (("cancel", "job", "--by", " "), "--by must name who asks the run to stop"),
        (("cancel", "tab\there"), "control character"),
        (("cancel",), "the following arguments are required: JOB"),
    ]:
        result = cli.run(*argv)
        assert_clean_error(result, EXIT_USAGE, message)
        assert result.stdout == ""
    row = _row(store, ns, "job", slot)
    assert (row.cancel_requested, row.error) == (False, None)
