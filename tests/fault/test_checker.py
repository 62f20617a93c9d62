"""The checker on synthetic histories (each check: a violation caught, a near miss not),
the history files, the protected resource, and the negative controls: each broken
stand-in caught on a real store, each fleetcron counterpart clean."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fault import broken
from fault import checker as checker_module
from fault.checker import CHECKS, Report, check
from fault.history import Event, HistoryWriter, read_history
from fault.protected import ProtectedResource
from fleetcron.models import RunRecord
from services import require_service

S = 1_000_000  # µs per second
T0 = 1_000 * S  # store time of mono 0 in these histories (the store is 1000 s "ahead")


def ev(mono_s: float, worker: str, event: str, *, name: str = "L", **kw: Any) -> Event:
    """An event at ``mono_s`` seconds; ``store_s``/``expires_s``/``slot_s`` in seconds."""
    fields: dict[str, Any] = {}
    data: dict[str, Any] = dict(kw.pop("data", {}))
    if "store_s" in kw:
        fields["store_us"] = T0 + round(kw.pop("store_s") * S)
    if "expires_s" in kw:
        data["expires_us"] = T0 + round(kw.pop("expires_s") * S)
    if "slot_s" in kw:
        fields["slot_us"] = T0 + round(kw.pop("slot_s") * S)
    if "fence" in kw:
        fields["fence"] = kw.pop("fence")
    data.update(kw)
    return Event(
        mono_us=round(mono_s * S), worker=worker, name=name, event=event, data=data, **fields
    )


def grant(
    inv: float,
    ok: float,
    worker: str,
    fence: int,
    ttl: float,
    *,
    store: float | None = None,
    name: str = "L",
) -> list[Event]:
    """acquire_invoke at ``inv``, acquire_ok at ``ok``; store time ``store`` (default: the
    mono time of the answer, i.e. a store exactly T0 ahead), lease ``ttl`` seconds."""
    at = ok if store is None else store
    return [
        ev(inv, worker, "acquire_invoke", name=name),
        ev(ok, worker, "acquire_ok", name=name, fence=fence, store_s=at, expires_s=at + ttl),
    ]


def extend(
    inv: float, ok: float, worker: str, fence: int, ttl: float, *, store: float | None = None
) -> list[Event]:
    at = ok if store is None else store
    return [
        ev(inv, worker, "extend_invoke", fence=fence),
        ev(ok, worker, "extend_ok", fence=fence, store_s=at, expires_s=at + ttl),
    ]


def release(
    inv: float, out: float | None, worker: str, fence: int, outcome: str = "release_ok"
) -> list[Event]:
    events = [ev(inv, worker, "release_invoke", fence=fence)]
    if out is not None:
        events.append(ev(out, worker, outcome, fence=fence))
    return events


def write(
    inv: float, out: float | None, worker: str, fence: int, outcome: str = "write_ok", **kw: Any
) -> list[Event]:
    events = [ev(inv, worker, "write_invoke", fence=fence)]
    if out is not None:
        events.append(ev(out, worker, outcome, fence=fence, **kw))
    return events


def judge(*parts: list[Event], **kw: Any) -> Report:
    return check([e for part in parts for e in part], **kw)


def rules(report: Report) -> list[tuple[str, str]]:
    return [(a.kind, a.rule) for a in report.anomalies]


# -- 1. overlap ----------------------------------------------------------------------------
def test_overlap_caught_when_a_grant_falls_inside_another_holders_lease() -> None:
    report = judge(grant(0, 0.1, "A", 1, 10), grant(2, 2.1, "B", 2, 10), release(5, 5.1, "A", 1))
    assert rules(report) == [("overlap", "two_holders")]
    anomaly = report.anomalies[0]
    assert [e.worker for e in anomaly.events] == ["A", "B"]
    assert "A (fence 1)" in anomaly.message
    assert "fence=1" in str(anomaly)
    assert "store=" in str(anomaly)


def test_release_invoked_before_the_next_grant_returns_is_not_an_overlap() -> None:
    # B's acquire is in flight when A starts releasing: the release may have come first.
    report = judge(
        grant(0, 0.1, "A", 1, 10), release(2.0, 2.5, "A", 1), grant(1.9, 2.2, "B", 2, 10)
    )
    assert report.ok, report.summary()


def test_a_release_that_returned_before_the_earlier_answer_does_not_excuse() -> None:
    # A released (fence 1) long before; its extend later says it holds again until 20.
    report = judge(
        grant(0, 0.1, "A", 1, 10),
        release(0.5, 0.6, "A", 1, "release_lost"),
        extend(1, 1.1, "A", 1, 19),
        grant(3, 3.1, "B", 2, 10),
    )
    assert rules(report) == [("overlap", "two_holders")]


def test_grants_after_expiry_and_after_an_extend_moved_it() -> None:
    clean = judge(grant(0, 0.1, "A", 1, 2), grant(3, 3.1, "B", 2, 2))  # A expired at 2.1
    assert clean.ok, clean.summary()
    moved = judge(grant(0, 0.1, "A", 1, 2), extend(1, 1.1, "A", 1, 2), grant(2.5, 2.6, "B", 2, 2))
    assert rules(moved) == [("overlap", "two_holders")]  # the extend moved A's expiry to 3.1
    after = judge(grant(0, 0.1, "A", 1, 2), extend(1, 1.1, "A", 1, 2), grant(3.2, 3.3, "B", 2, 2))
    assert after.ok, after.summary()


def test_grant_exactly_at_expiry_and_tolerance() -> None:
    at_expiry = judge(grant(0, 0.1, "A", 1, 2), grant(2, 2.1, "B", 2, 2, store=2.1))
    assert at_expiry.ok  # a lease is free at its expiry
    early = judge(grant(0, 0.1, "A", 1, 2), grant(2, 2.1, "B", 2, 2, store=2.0995))
    assert rules(early) == [("overlap", "two_holders")]
    assert judge(
        grant(0, 0.1, "A", 1, 2), grant(2, 2.1, "B", 2, 2, store=2.0995), tolerance_us=1000
    ).ok


def test_an_indeterminate_acquire_is_never_an_overlap() -> None:
    report = judge(
        grant(0, 0.1, "A", 1, 10),
        [ev(1, "B", "acquire_invoke"), ev(1.5, "B", "acquire_error", error="timeout")],
    )
    assert report.ok


def test_equal_store_times_are_checked_both_ways() -> None:
    report = judge(grant(0, 0.1, "A", 1, 10, store=5), grant(0, 0.2, "B", 2, 10, store=5))
    assert [a.kind for a in report.anomalies] == ["overlap"]


def test_an_allowed_check_is_reported_but_does_not_fail() -> None:
    report = judge(grant(0, 0.1, "A", 1, 10), grant(2, 2.1, "B", 2, 10), allow={"overlap"})
    assert report.ok
    assert [a.kind for a in report.allowed] == ["overlap"]
    assert "allowed: overlap ×1" in report.summary()
    with pytest.raises(ValueError, match="unknown checks"):
        check([], allow={"overlaps"})


# -- 2. fence_order -------------------------------------------------------------------------
def test_lower_fence_after_a_returned_grant_is_caught() -> None:
    report = judge(grant(0, 0.1, "A", 5, 1), grant(2, 2.1, "B", 4, 1))
    assert rules(report) == [("fence_order", "lower_after_higher")]


def test_a_reused_fence_is_caught() -> None:
    report = judge(grant(0, 0.1, "A", 5, 1), grant(2, 2.1, "B", 5, 1))
    assert rules(report) == [("fence_order", "fence_reused")]


def test_concurrent_grants_are_ordered_by_the_stores_clock() -> None:
    # The calls overlap in mono time; the store granted A first (store 1.0) with fence 9.
    caught = judge(grant(0, 3, "A", 9, 0.5, store=1.0), grant(0.5, 2, "B", 8, 0.5, store=1.8))
    assert rules(caught) == [("fence_order", "store_order")]
    equal = judge(grant(0, 3, "A", 9, 0.5, store=1.0), grant(0.5, 2, "B", 8, 0.5, store=1.0))
    assert ("fence_order", "store_order") not in rules(equal)  # ambiguous


def test_fences_increasing_across_a_gap_are_fine() -> None:
    report = judge(
        grant(0, 0.1, "A", 1, 1), grant(2, 2.1, "B", 2, 1), grant(50, 50.1, "A", 10**15, 1)
    )
    assert report.ok
    assert report.grants == 3


def test_real_time_order_wins_over_a_store_clock_stepped_back() -> None:
    # A's grant returned before B asked; the store's clock went back 100 s in between.
    report = judge(grant(0, 0.1, "A", 1, 1, store=100), grant(2, 2.1, "B", 2, 1, store=2.1))
    assert report.ok, report.summary()


# -- 3. stale_write ----------------------------------------------------------------------------
def test_a_lower_fence_accepted_after_a_higher_one_is_caught() -> None:
    report = judge(write(0, 0.1, "C", 5), write(1, 1.1, "B", 4))
    assert rules(report) == [("stale_write", "accepted_lower_fence")]
    assert [e.event for e in report.anomalies[0].events] == ["write_ok", "write_invoke", "write_ok"]


def test_equal_fence_written_twice_by_one_holder_is_fine() -> None:
    report = judge(write(0, 0.1, "B", 4), write(1, 1.1, "B", 4), write(2, 2.1, "C", 5))
    assert report.ok
    assert report.writes == 3


def test_concurrent_or_indeterminate_writes_are_not_stale() -> None:
    concurrent = judge(write(0, 2, "C", 5), write(1, 3, "B", 4))  # B invoked before C's ok
    assert concurrent.ok
    errored = judge(write(0, 0.1, "C", 5, "write_error", error="disk"), write(1, 1.1, "B", 4))
    assert errored.ok


def test_a_rejected_write_retried_under_the_same_fence_is_caught() -> None:
    report = judge(
        write(0, 0.1, "C", 5),
        write(1, 1.1, "B", 4, "write_rejected", highest=5),
        write(2, 2.1, "B", 4, "write_rejected", highest=5),
    )
    assert rules(report) == [("stale_write", "retried_after_rejection")]


def test_a_rejected_write_then_a_new_lease_is_fine() -> None:
    report = judge(
        write(0, 0.1, "C", 5),
        write(1, 1.1, "B", 4, "write_rejected", highest=5),
        write(3, 3.1, "B", 6),
    )
    assert report.ok


# -- 4. alive_after_expiry -------------------------------------------------------------------
def test_a_sign_of_life_after_the_lease_expired_is_caught() -> None:
    report = judge(grant(0, 1, "A", 1, 2), [ev(3.5, "A", "alive", fence=1)])
    assert rules(report) == [("alive_after_expiry", "sign_after_expiry")]
    assert "500.0 ms" in report.anomalies[0].message


def test_a_sign_before_the_expiry_is_fine() -> None:
    report = judge(grant(0, 1, "A", 1, 2), [ev(2.9, "A", "alive", fence=1)])
    assert report.ok
    assert report.signs == 1


def test_the_answer_may_have_been_old_when_heard() -> None:
    # The grant was made at store 1.0 but heard at mono 2.5 (a slow answer): the store's
    # clock at mono m is at least 1.0 + (m - 2.5); the lease (2 s) ends at store 3.0.
    assert judge(grant(0, 2.5, "A", 1, 2, store=1.0), [ev(4.4, "A", "alive", fence=1)]).ok
    late = judge(grant(0, 2.5, "A", 1, 2, store=1.0), [ev(4.6, "A", "alive", fence=1)])
    assert [a.kind for a in late.anomalies] == ["alive_after_expiry"]


def test_an_extend_moving_the_expiry_keeps_the_holder_alive() -> None:
    report = judge(
        grant(0, 1, "A", 1, 2), extend(1.8, 2, "A", 1, 2), [ev(3.5, "A", "alive", fence=1)]
    )
    assert report.ok, report.summary()
    late = judge(
        grant(0, 1, "A", 1, 2), extend(1.8, 2, "A", 1, 2), [ev(4.5, "A", "alive", fence=1)]
    )
    assert [a.kind for a in late.anomalies] == ["alive_after_expiry"]


def test_an_indeterminate_extend_is_given_its_latest_possible_effect() -> None:
    failed = [ev(1.8, "A", "extend_invoke", fence=1), ev(2.5, "A", "extend_error", fence=1)]
    # The grant (asked at mono 0.9, store 1.0) bounds the store's clock: at mono 2.5 it
    # read at most 1.0 + (2.5 - 0.9) = 2.6. The renewal may have taken effect as late as
    # that: the lease may run until 4.6, not later.
    assert judge(grant(0.9, 1, "A", 1, 2), failed, [ev(4.5, "A", "alive", fence=1)]).ok
    late = judge(grant(0.9, 1, "A", 1, 2), failed, [ev(4.7, "A", "write_invoke", fence=1)])
    assert [a.kind for a in late.anomalies] == ["alive_after_expiry"]
    # Never answered (the worker died mid-call): later signs cannot be judged.
    hung = [ev(1.8, "A", "extend_invoke", fence=1)]
    report = judge(grant(0, 1, "A", 1, 2), hung, [ev(9, "A", "run_alive", fence=1)])
    assert report.ok
    assert report.signs == 0


def test_a_run_start_with_its_expiry_is_an_answer() -> None:
    start = [ev(1, "r1", "run_start", name="job", fence=7, store_s=1, expires_s=3, slot_s=1)]
    late = judge(start, [ev(3.2, "r1", "run_alive", name="job", fence=7, slot_s=1)])
    assert [a.kind for a in late.anomalies] == ["alive_after_expiry"]
    assert judge(start, [ev(2.9, "r1", "run_alive", name="job", fence=7, slot_s=1)]).ok


def test_signs_of_another_fence_or_without_an_answer_are_not_judged() -> None:
    report = judge(grant(0, 1, "A", 1, 2), [ev(9, "A", "alive", fence=2)])
    assert report.ok
    assert any("not judged" in note for note in report.notes)


# -- 5. slot_accounting and 6. early_start ------------------------------------------------------
def row(
    slot_s: float,
    state: str = "succeeded",
    *,
    started_s: float | None = None,
    error: str | None = None,
    trigger: str = "schedule",
    job: str = "job",
) -> RunRecord:
    slot = T0 + round(slot_s * S)
    started = slot + S if started_s is None else T0 + round(started_s * S)
    return RunRecord(
        namespace="n",
        job=job,
        slot_us=slot,
        state=state,
        attempt=1,
        fence=slot,
        holder="h",
        run_id="r",
        trigger=trigger,
        started_us=started,
        finished_us=started + S,
        expires_us=None,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=0,
        error=error,
        output=None,
        now_us=started + S,
    )


SLOTS = {"job": [T0 + 10 * S, T0 + 20 * S, T0 + 30 * S]}


def test_every_slot_finished_once_or_recorded_with_a_reason() -> None:
    ledger = [
        row(10),
        row(20, "missed", error="the replicas were down"),
        row(30, "skipped", error="the previous run was still running"),
    ]
    report = check([], ledger=ledger, slots=SLOTS)
    assert report.ok, report.summary()
    assert report.slots == 3


def test_slot_accounting_violations() -> None:
    ledger = [
        row(10, "failed", error="exit 1"),
        row(20, "missed", error=""),
        row(25),  # not in the schedule, inside the window
        row(40),  # outside the window: not judged
        row(15, trigger="manual"),  # a manual run off the schedule is fine
    ]
    report = check([], ledger=ledger, slots=SLOTS)
    assert sorted(rules(report)) == [
        ("slot_accounting", "bad_outcome"),
        ("slot_accounting", "no_reason"),
        ("slot_accounting", "no_row"),
        ("slot_accounting", "off_schedule"),
    ]
    assert check(
        [],
        ledger=[row(10, "failed", error="x"), row(20), row(30)],
        slots=SLOTS,
        ok_states={"succeeded", "failed"},
    ).ok
    running = check([], ledger=[row(10, "running"), row(20), row(30)], slots=SLOTS)
    assert rules(running) == [("slot_accounting", "unfinished")]


def test_two_successful_runs_of_one_slot_are_caught() -> None:
    def run(worker: str, fence: int, outcome: str) -> list[Event]:
        return [
            ev(1, worker, "run_start", name="job", fence=fence, slot_s=10),
            ev(2, worker, "run_end", name="job", fence=fence, slot_s=10, outcome=outcome),
        ]

    assert rules(judge(run("r1", 1, "ok"), run("r2", 2, "succeeded"))) == [
        ("slot_accounting", "double_run")
    ]
    retried = judge(run("r1", 1, "failed"), run("r2", 2, "ok"))
    assert retried.ok
    assert retried.runs == 2


def test_a_run_started_before_its_slot_is_caught() -> None:
    ledger = [row(10, started_s=9.5), row(20, started_s=20), row(30)]
    report = check([], ledger=ledger, slots=SLOTS)
    assert rules(report) == [("early_start", "ledger_started_before_slot")]
    early = judge([ev(1, "r", "run_start", name="job", fence=1, slot_s=10, store_s=9.99)])
    assert rules(early) == [("early_start", "run_start_before_slot")]
    assert judge([ev(1, "r", "run_start", name="job", fence=1, slot_s=10, store_s=10)]).ok


# -- the report ---------------------------------------------------------------------------------
def test_the_summary_says_what_was_checked_and_what_failed() -> None:
    clean = judge(grant(0, 0.1, "A", 1, 1), release(0.5, 0.6, "A", 1), write(0.2, 0.3, "A", 1))
    assert clean.summary().startswith("ok — 3 operations, 1 grants, 1 writes")
    failed = judge(grant(0, 0.1, "A", 1, 10), grant(2, 2.1, "B", 2, 10))
    text = failed.summary()
    assert text.startswith("FAILED — 1 anomalies (overlap ×1)")
    assert "B acquire_ok 'L' fence=2" in text
    assert set(CHECKS) >= {a.kind for a in failed.anomalies}


def test_outcomes_pair_with_the_latest_invoke() -> None:
    # A worker killed mid-release restarts under the same name: its new release pairs with
    # the new invoke; the orphan stays an operation without an outcome.
    events = [
        *grant(0, 0.1, "A", 1, 10),
        ev(1, "A", "release_invoke", fence=1),
        *grant(5, 5.1, "A", 2, 10),
        *release(6, 6.1, "A", 2),
    ]
    report = check(events)
    assert report.operations == 4
    assert report.ok, report.summary()
    unmatched = check([ev(1, "A", "write_ok", fence=1)])
    assert any("without their invoke" in note for note in unmatched.notes)


# -- history files --------------------------------------------------------------------------------
def test_history_round_trip_and_merge(tmp_path: Path) -> None:
    with (
        HistoryWriter(tmp_path / "a.jsonl", "A") as a,
        HistoryWriter(tmp_path / "b.jsonl", "B") as b,
    ):
        first = a.log("acquire_invoke", "L")
        b.log("acquire_ok", "L", fence=3, store_us=T0, expires_us=T0 + S, holder="h")
        a.log("run_end", "job", slot_us=T0, fence=3, outcome="ok")
        with pytest.raises(ValueError, match="unknown history event"):
            a.log("acquire_okay", "L")
    events = read_history([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert [e.event for e in events] == ["acquire_invoke", "acquire_ok", "run_end"]
    assert events[0] == first
    assert events[1].data == {"expires_us": T0 + S, "holder": "h"}
    assert events[2].slot_us == T0
    assert all(x.mono_us <= y.mono_us for x, y in itertools.pairwise(events))


def test_a_truncated_last_line_is_dropped_and_a_broken_middle_line_is_not(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, "A") as writer:
        writer.log("alive", "L", fence=1)
    with path.open("a") as handle:
        handle.write('{"mono_us": 12, "worker": "A", "na')
    assert [e.event for e in read_history([path])] == ["alive"]
    with path.open("a") as handle:
        handle.write("\n")
    with pytest.raises(ValueError, match=r"h\.jsonl:2"):
        read_history([path])


def test_a_sigkilled_writer_leaves_a_readable_history(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    code = (
        "import sys\nfrom fault.history import HistoryWriter\n"
        "w = HistoryWriter(sys.argv[1], 'K')\n"
        "while True:\n    w.log('alive', 'L', fence=1, pad='x' * 500)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], env=env)
    try:
        give_up = time.monotonic() + 30
        while not path.exists() or path.stat().st_size < 200_000:  # a condition, not a delay
            assert child.poll() is None, "the writer died"
            assert time.monotonic() < give_up, "the writer wrote nothing"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    events = read_history([path])
    assert len(events) > 300
    assert {e.worker for e in events} == {"K"}


# -- the protected resource ----------------------------------------------------------------
def test_the_protected_resource_checks_fences(tmp_path: Path) -> None:
    resource = ProtectedResource(tmp_path / "p.db")
    with HistoryWriter(tmp_path / "h.jsonl", "W") as writer:
        assert resource.write(writer, "L", 5)
        assert resource.write(writer, "L", 5)  # the same holder again
        assert not resource.write(writer, "L", 4)
        assert resource.write(writer, "M", 1)  # another name has its own fences
        assert resource.write(writer, "L", 6, slot_us=T0)
    assert resource.highest("L") == 6
    assert resource.accepted("L") == [("W", 5), ("W", 5), ("W", 6)]
    events = read_history([tmp_path / "h.jsonl"])
    rejected = [e for e in events if e.event == "write_rejected"]
    assert len(rejected) == 1
    assert rejected[0].data == {"highest": 5}
    assert events[-1].slot_us == T0
    assert check(events).ok
    resource.close()


# -- the negative controls ------------------------------------------------------------------
def _workers(events: list[Event], event: str) -> list[str]:
    return [e.worker for e in events if e.event == event]


@pytest.fixture(params=["sqlite", "postgres"])
def pg_url(request: pytest.FixtureRequest) -> str | None:
    """``None`` for SQLite, else the PostgreSQL service's URL (skipped when absent)."""
    return None if request.param == "sqlite" else require_service("postgres")


def test_a_lock_that_trusts_the_client_clock_is_caught(tmp_path: Path, pg_url: str | None) -> None:
    events = broken.client_clock_control(tmp_path, broken=True, pg_url=pg_url)
    assert _workers(events, "acquire_ok") == ["A", "B"]
    report = check(events, tolerance_us=1000)
    assert [a.kind for a in report.anomalies] == ["overlap"], report.summary()


def test_fleetcron_under_a_client_clock_offset_is_clean(tmp_path: Path, pg_url: str | None) -> None:
    events = broken.client_clock_control(tmp_path, broken=False, pg_url=pg_url)
    assert _workers(events, "acquire_ok") == ["A"]
    assert _workers(events, "acquire_refused") == ["B"]
    report = check(events, tolerance_us=1000)
    assert report.ok, report.summary()


def test_a_release_without_the_owner_check_is_caught(tmp_path: Path, pg_url: str | None) -> None:
    events = broken.ownerless_release_control(tmp_path, broken=True, pg_url=pg_url)
    assert _workers(events, "acquire_ok") == ["A", "B", "C"]
    report = check(events, tolerance_us=1000)
    assert sorted(a.kind for a in report.anomalies) == ["overlap", "stale_write"], report.summary()
    overlap = next(a for a in report.anomalies if a.kind == "overlap")
    assert {e.worker for e in overlap.events} == {"B", "C"}


def test_fences_checked_by_the_resource_stop_the_stale_write(tmp_path: Path) -> None:
    events = broken.ownerless_release_control(tmp_path, broken=True, check_fences=True)
    assert _workers(events, "write_ok") == ["C"]
    assert _workers(events, "write_rejected") == ["B"]
    report = check(events, tolerance_us=1000)
    assert [a.kind for a in report.anomalies] == ["overlap"], report.summary()


def test_fleetcron_release_checks_the_owner(tmp_path: Path, pg_url: str | None) -> None:
    events = broken.ownerless_release_control(tmp_path, broken=False, pg_url=pg_url)
    assert _workers(events, "acquire_ok") == ["A", "B"]
    assert _workers(events, "release_lost") == ["A"]
    assert "C" in _workers(events, "acquire_refused")
    assert _workers(events, "write_ok") == ["B"]
    report = check(events, tolerance_us=1000)
    assert report.ok, report.summary()


def test_a_scheduler_that_kills_late_is_caught(tmp_path: Path) -> None:
    events = broken.late_kill_control(tmp_path, broken=True)
    report = check(events, tolerance_us=1000)
    assert [a.kind for a in report.anomalies] == ["alive_after_expiry"], report.summary()


def test_fleetcron_exec_stops_the_job_before_its_lease_expires(tmp_path: Path) -> None:
    events = broken.late_kill_control(tmp_path, broken=False)
    assert _workers(events, "run_start"), "the job never started"
    assert not _workers(events, "run_end"), "the job was not stopped"
    report = check(events, tolerance_us=1000)
    assert report.signs > 0
    assert report.ok, report.summary()


# -- the fast checker against a brute-force reading of the same rules ----------------------------
def _random_history(seed: int) -> list[Event]:
    """Random operations of 4 workers on one name: any orders, overlaps, lost outcomes."""
    rng = random.Random(seed)
    events: list[Event] = []
    fences = dict.fromkeys("ABCD", 0)
    for _ in range(rng.randrange(4, 30)):
        worker = rng.choice("ABCD")
        start = rng.uniform(0, 20)
        end = start + rng.uniform(0, 2)
        store = rng.uniform(start, end) + rng.choice([0, 0, 0, rng.uniform(-1, 1)])
        kind = rng.choice(["grant", "grant", "extend", "release", "write", "alive", "error"])
        if kind == "grant" or fences[worker] == 0:
            fences[worker] = rng.choice([fences[worker] + 1, rng.randrange(1, 12)])
            events += grant(start, end, worker, fences[worker], rng.uniform(0.5, 5), store=store)
            continue
        fence = fences[worker]
        if kind == "extend":
            events += extend(start, end, worker, fence, rng.uniform(0.5, 5), store=store)
        elif kind == "release":
            events += release(start, rng.choice([end, None]), worker, fence)
        elif kind == "write":
            outcome = rng.choice(["write_ok", "write_ok", "write_rejected", "write_error"])
            events += write(start, rng.choice([end, end, None]), worker, fence, outcome)
        elif kind == "alive":
            events.append(ev(start, worker, rng.choice(["alive", "run_alive"]), fence=fence))
        else:
            events.append(ev(start, worker, "extend_invoke", fence=fence))
            if rng.random() < 0.8:
                events.append(ev(end, worker, "extend_error", fence=fence))
    return sorted(events, key=lambda e: e.mono_us)


def _reference(events: list[Event], tol: int) -> set[tuple[Any, ...]]:
    """The rules of fault.checker read literally, pair by pair (quadratic, obviously)."""
    ops = checker_module._pair(events)
    answers = [
        checker_module._answer(op, op.outcome)
        for op in ops
        if op.outcome is not None and op.outcome.event in ("acquire_ok", "extend_ok")
    ]
    ans = [a for a in answers if a is not None]
    releases = [op for op in ops if op.op == "release"]

    def holder(op: Any) -> tuple[str, str, int]:
        first = op.first
        return (first.worker, first.name, first.fence)

    def released_between(a: Any, b: Any) -> bool:
        return any(
            holder(r) == a.holder
            and (r.start is None or r.start < b.o)
            and (r.end is None or a.v is None or r.end > a.v)
            for r in releases
        )

    found: set[tuple[Any, ...]] = set()
    for a in ans:
        for b in ans:
            if a.holder != b.holder and a.s <= b.s < a.expires - tol:
                if not released_between(a, b):
                    found.add(("overlap", frozenset((a.holder, b.holder))))
    grants = [a for a in ans if a.event.event == "acquire_ok"]
    for a in grants:
        for b in grants:
            if a is b or a.holder[2] <= b.holder[2]:
                continue
            if b.v is not None and a.o < b.v:
                found.add(("lower_after_higher", b.holder))
            elif not (a.v is not None and b.o < a.v) and a.s < b.s - tol:
                found.add(("store_order", a.holder, b.holder))
    for h in {a.holder for a in ans}:
        mine = [a for a in ans if a.holder == h]
        ttl = max(a.expires - a.s for a in mine)
        known = [a for a in mine if a.v is not None]
        signs = [
            e
            for e in events
            if e.event in ("alive", "run_alive", "write_invoke")
            and (e.worker, e.name, e.fence) == h
        ]
        for sign in signs:
            m = sign.mono_us
            heard = [a for a in mine if a.o <= m]
            asked = [a for a in mine if a.v is None or a.v < m]
            if not heard or not asked:
                continue
            bounds = []
            unbounded = False
            for op in ops:
                if op.op != "extend" or holder(op) != h:
                    continue
                if op.outcome is not None and op.outcome.event != "extend_error":
                    continue
                if op.start is not None and op.start >= m:
                    continue
                if op.end is None or not known:
                    unbounded = True
                else:
                    bounds.append(op.end + min(a.s - (a.v or 0) for a in known) + ttl)
            if unbounded:
                continue
            expiry = max([a.expires for a in asked] + bounds)
            if m + max(a.s - a.o for a in heard) > expiry + tol:
                found.add(("alive", h))
    return found


def _fast(report: Report) -> set[tuple[Any, ...]]:
    found: set[tuple[Any, ...]] = set()
    for a in report.anomalies:
        holders = [(e.worker, e.name, e.fence) for e in a.events]
        if a.kind == "overlap":
            found.add(("overlap", frozenset(holders)))
        elif a.rule == "lower_after_higher":
            found.add(("lower_after_higher", holders[1]))
        elif a.rule == "store_order":
            found.add(("store_order", holders[0], holders[1]))
        elif a.kind == "alive_after_expiry":
            found.add(("alive", holders[-1]))
    return found


@pytest.mark.parametrize("tol", [0, 300_000])
def test_the_checker_agrees_with_a_brute_force_reading_of_its_rules(tol: int) -> None:
    for seed in range(400):
        events = _random_history(seed)
        assert _fast(check(events, tolerance_us=tol)) == _reference(events, tol), seed
