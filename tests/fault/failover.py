"""PostgreSQL failover scenarios: the primary crashes and its streaming standby is promoted.

Each runs on a :class:`~fault.pg_pair.PostgresPair` of its own (``Scenario.needs ==
"pair"``): three lock contenders and two ``fleetcron run`` replicas (two jobs every second)
work against the pair's multi-host URL (``target_session_attrs=read-write``, ``timeout`` 2
s); replication to the standby is cut (the primary's walsender SIGSTOPped); the primary is
SIGKILLed with everything it forked; the standby is promoted and ``synchronous_standby_names``
cleared on it, as Patroni does; the clients find the new primary by connecting again.

Between the crash and the promotion the standby — what the new primary will start from —
is read (a hot standby answers reads): the fence of the lease and the ledger rows. Every
write a client was told was done before the crash is looked for there:

- a grant (``acquire_ok``) is there when the standby's fence of the lease is at least its
  fence (fences only increase, so a later grant covers an earlier one);
- a claim (the job body's ``run_start``: the replica claimed the slot, then started it)
  is there when the standby has the slot's row with at least the run's fence.

Fences are compared across the failover too: every fence acknowledged by the old primary
(grants heard before the crash, the fences of the runs started before it and of the rows
the standby kept) must be below every fence the new primary issued (grants heard after the
crash, rows of the final ledger the standby did not have).

The scenarios (:data:`FAILOVER_SCENARIOS`):

- ``pg_failover_sync`` — synchronous replication: after the cut every commit waits for the
  standby, and the calls must end at the URL's ``timeout`` (not hang). Nothing
  acknowledged may be lost, no fence may go back, and the checker must find nothing.
- ``pg_failover_sync_cancelled`` — the same, and the commits waiting for the standby are
  cancelled on the primary (``pg_cancel_backend``: PostgreSQL then ends the wait with the
  warning "canceling wait for synchronous replication" and reports the commit done, on the
  primary only); the client that heard it must take it as not done. Other sessions of the
  primary now see those commits, which the failover takes away (``rows_unreplicated``):
  a slot a replica then took as claimed or missed can be left with no ledger row
  (``slot_accounting``, allowed: PostgreSQL's own hole, docs/ha.md).

- ``pg_failover_async`` — asynchronous replication: what the primary acknowledged during
  the cut is lost at the promotion. That is the documented cost of an asynchronous
  standby, allowed and counted in the figures: a holder granted during the cut still
  holds when the new primary grants the lease again (``overlap``; the fence-checking
  resource rejects the old holder's writes), and the slots claimed during the cut — their
  runs happened — have no ledger row on the new primary (``slot_accounting``: the replicas
  that ran them do not claim them again; a fleet that had not would run them twice).
  Fences must still not go back, and the scenario fails if the cut lost nothing (then it
  tested nothing).
- ``pg_failover_async_clock_behind`` — the same with the standby's clock 5 s behind the
  primary's (libfaketime), and leases of 1 s: a grant made a lease after the cut is lost,
  and the new primary grants the lease while its clock is still below that grant's, so a
  fence built from its clock alone would go back; the timeline the promotion raised keeps
  it above (checked, and by the checker's ``fence_order``). ``overlap`` here also counts
  grants of the two servers whose store times, read on two clocks 5 s apart, interleave.
  The runner's samples of the old primary's clock are lowered by the offset, so that runs
  after the failover are judged against the new, earlier clock (runs.py assumes a store
  clock that never goes back).

The figures (:attr:`~fault.runner.Run.figures`) say what was acknowledged during the cut,
what of it was lost, the highest fence before and the lowest after the failover, how many
calls timed out or had their synchronous wait cancelled, and how long the failover took.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fault.history import Event
from fault.load import (
    JOBS,
    LEASE,
    LOCKERS,
    LOST_OK,
    SECOND,
    events_of,
    expect_every_slot,
    mono,
    ok_runs_started_after,
    start_load,
)
from fault.pg_pair import PostgresPair
from fault.runner import Run, Scenario, ScenarioFailed, wait_until
from fault.runs import ClockSample
from fleetcron.models import RunRecord

__all__ = ["FAILOVER_SCENARIOS"]

# Calls are bounded by the URL's timeout (the pair's, 2 s); a loaded 2-core machine may
# deschedule a worker for a while after its watchdog fired.
_SLACK_S = 3.0
_OPS = ("acquire", "extend", "release")
_OUTCOMES = frozenset(
    f"{op}_{end}" for op in _OPS for end in ("ok", "refused", "error", "lost")
) - {"acquire_lost"}


def _pair(run: Run) -> PostgresPair:
    if not isinstance(run.server, PostgresPair):
        raise ScenarioFailed(f"{run.scenario} needs a PostgresPair, not {run.server!r}")
    return run.server


@dataclass(frozen=True, slots=True)
class _Call:
    """A contender's call: its invoke and its outcome (``None``: none logged)."""

    invoke: Event
    outcome: Event | None

    @property
    def seconds(self) -> float | None:
        if self.outcome is None:
            return None
        return (self.outcome.mono_us - self.invoke.mono_us) / SECOND


def _calls(events: Iterable[Event]) -> list[_Call]:
    """The contenders' acquire, extend and release calls (one at a time per worker)."""
    open_: dict[tuple[str, str], Event] = {}
    calls: list[_Call] = []
    for event in events:
        op, _, phase = event.event.partition("_")
        if op not in _OPS:
            continue
        key = (event.worker, op)
        if phase == "invoke":
            open_[key] = event
        elif event.event in _OUTCOMES and key in open_:
            calls.append(_Call(open_.pop(key), event))
    calls += [_Call(invoke, None) for invoke in open_.values()]
    return calls


@dataclass
class _Failover:
    """When each step happened (CLOCK_MONOTONIC µs) and what the standby held."""

    cut: int = 0
    cut_store_us: int = 0
    crash: int = 0
    crash_store_us: int = 0
    """The old primary's clock read just before the crash."""
    promoted: int = 0
    behind_bytes: int = 0
    fence: int = 0
    """The standby's fence of the lease, read between the crash and the promotion."""
    rows: tuple[RunRecord, ...] = ()
    """The standby's ledger rows, read then."""
    doomed: tuple[RunRecord, ...] = ()
    """The old primary's ledger rows, read just before the crash."""


def _cut(run: Run, pair: PostgresPair) -> _Failover:
    """Stop replication; the times are read once it is stopped, so whatever was asked
    after them (a call invoked, a slot due) was committed after the cut."""
    pid = pair.cut()
    steps = _Failover(cut=mono(), cut_store_us=run.store_now())
    run.fault(f"cut replication: SIGSTOP the primary's walsender (pid {pid})")
    return steps


def _sync_waits(run: Run, pair: PostgresPair, steps: _Failover, *, cancel: bool) -> None:
    """Synchronous: commits now wait for the standby. Calls of every contender must end by
    the URL's timeout; then, with ``cancel``, the waits are cancelled on the server until a
    client still connected heard of a cancelled one (it must take it as not done)."""
    timeout = pair.timeout_s

    def timed_out() -> list[_Call]:
        return [
            call
            for call in _calls(run.histories())
            if call.invoke.mono_us > steps.cut
            and call.outcome is not None
            and call.outcome.event.endswith("_error")
            and (call.seconds or 0) >= 0.9 * timeout
        ]

    wait_until(
        lambda: len(timed_out()) >= LOCKERS,
        timeout=30,
        what=f"{LOCKERS} calls to time out after {timeout:g} s",
    )
    run.fault("commits wait for the standby; calls time out")
    if not cancel:
        return
    began = mono()
    # Two seconds of the store's clock at least: two slots of each job, whose claims (and
    # the replicas' tries again) meet the rows the cancelled commits left on the primary.
    until = run.store_now() + 2 * SECOND
    cancelled = 0

    def released() -> bool:
        nonlocal cancelled
        cancelled += pair.cancel_sync_waits()
        # A call still connected when its wait was cancelled ends well before its timeout.
        return (
            cancelled > 0
            and any(
                call.invoke.mono_us > steps.cut
                and call.outcome is not None
                and call.outcome.mono_us > began
                and (call.seconds or timeout) < 0.8 * timeout
                for call in _calls(run.histories())
            )
            and run.store_now() >= until
        )

    wait_until(released, timeout=30, what="a client to hear of a cancelled synchronous wait")
    run.fault(f"{cancelled} synchronous waits cancelled (pg_cancel_backend)")
    run.figures["sync_waits_cancelled"] = cancelled


def _async_acks(run: Run, steps: _Failover, *, grant_after_us: int) -> None:
    """Asynchronous: the primary goes on acknowledging. Wait until a grant asked after the
    cut, at least ``grant_after_us`` after it on the store's clock, and claims of slots due
    after it (a slot is never claimed before it is due) were acknowledged: none of them
    can be on the standby."""

    def acknowledged() -> bool:
        events = run.histories()
        claims = {
            e.name for e in events_of(events, "run_start") if (e.slot_us or 0) > steps.cut_store_us
        }
        late = steps.cut_store_us + grant_after_us
        granted = any((e.store_us or 0) > late for e in _granted_in_cut(events, steps))
        return granted and claims == set(JOBS)

    wait_until(acknowledged, timeout=30, what="grants and claims acknowledged during the cut")


def _granted_in_cut(events: Iterable[Event], steps: _Failover) -> list[Event]:
    """Grants asked for after the cut and acknowledged before the crash."""
    return [
        call.outcome
        for call in _calls(events)
        if call.outcome is not None
        and call.outcome.event == "acquire_ok"
        and call.invoke.mono_us > steps.cut
        and call.outcome.mono_us < (steps.crash or float("inf"))
    ]


def _ledger_of(run: Run, url: str) -> tuple[RunRecord, ...]:
    """Every ledger row of the jobs on the server ``url`` (a read: the old primary answers
    it during the cut, the standby before its promotion)."""
    with run.store(url) as store:
        return tuple(
            row for job in JOBS for row in store.run(store.ops.run_list(run.namespace, job, 10_000))
        )


def _crash_and_promote(run: Run, pair: PostgresPair, steps: _Failover) -> None:
    """Crash the primary, read what the standby holds, promote it, clear its synchronous
    standby names; then wait until the clients work on the new primary."""
    steps.behind_bytes = pair.lsn_diff(pair.primary_lsn(), pair.received_lsn())
    steps.crash_store_us = run.store_now()
    steps.doomed = _ledger_of(run, pair.primary_url)
    pair.crash_primary()
    steps.crash = mono()
    run.fault("SIGKILL the primary and every process it forked")
    wait_until(pair.replayed, timeout=30, what="the standby to replay what it received")
    with run.store(pair.standby_url) as store:
        lease = store.run(store.ops.lease_get(run.namespace, LEASE))
        steps.fence = 0 if lease is None else lease.fence
    steps.rows = _ledger_of(run, pair.standby_url)
    started = time.monotonic()
    pair.promote()
    pair.clear_synchronous()
    steps.promoted = mono()
    run.fault("promote the standby (pg_ctl promote), clear synchronous_standby_names")
    run.figures["promotion_s"] = round(time.monotonic() - started, 2)
    timeline = pair.timeline()
    run.figures["timeline"] = timeline
    if timeline < 2:
        raise ScenarioFailed(f"the promoted standby writes on timeline {timeline}, not 2")

    def working() -> bool:
        events = run.histories()
        granted = any(e.mono_us > steps.promoted for e in events_of(events, "acquire_ok"))
        return granted and all(
            ok_runs_started_after(events, job, steps.promoted) >= 2 for job in JOBS
        )

    wait_until(working, timeout=90, what="a grant and two runs of each job after the promotion")
    first = min(
        e.mono_us for e in events_of(run.histories(), "acquire_ok") if e.mono_us > steps.crash
    )
    run.figures["crash_to_grant_s"] = round((first - steps.crash) / SECOND, 2)


# -- the verdict -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Losses:
    grants: list[Event]
    """Grants acknowledged before the crash that the standby did not have."""
    claims: list[Event]
    """Runs started (claims acknowledged) before the crash whose row the standby lacked."""
    missing: list[Event]
    """Runs started whose slot has no row in the final ledger at all."""
    back: list[str]
    """Where a fence issued after the failover is not above every fence before it."""


def _old_runs(events: Iterable[Event], steps: _Failover) -> list[Event]:
    """The runs claimed on the old primary: started before the crash, or later with a fence
    of the old primary's clock (a claim acknowledged just before the crash whose command
    started after it). 50 ms of slack: a claim acknowledged between the last reading of
    the old primary's clock and the crash; the new primary issues its first fence later
    than that after the crash (it is promoted first), at a clock, or a timeline, above."""
    return [
        e
        for e in events_of(events, "run_start")
        if e.mono_us < steps.crash or (e.fence or 0) <= steps.crash_store_us + 50_000
    ]


def _losses(run: Run, steps: _Failover, final: Sequence[RunRecord]) -> _Losses:
    events = run.histories()
    before = [e for e in events_of(events, "acquire_ok") if e.mono_us < steps.crash]
    after = [e for e in events_of(events, "acquire_ok") if e.mono_us > steps.crash]
    kept = {(row.job, row.slot_us): row.fence for row in steps.rows}
    starts = _old_runs(events, steps)
    final_slots = {(row.job, row.slot_us) for row in final}
    claims = [e for e in starts if kept.get((e.name, e.slot_us or 0), -1) < (e.fence or 0)]
    missing = [
        e for e in events_of(events, "run_start") if (e.name, e.slot_us or 0) not in final_slots
    ]
    back: list[str] = []
    old = max((e.fence or 0 for e in before), default=0)
    new = min((e.fence or 0 for e in after), default=None)
    run.figures["lease_fence_before"] = old
    run.figures["lease_fence_after"] = new
    if new is not None and new <= old:
        back.append(f"lease {LEASE!r}: fence {new} granted after the failover, {old} before")
    known = {(row.job, row.slot_us, row.fence) for row in steps.rows}
    for job in JOBS:
        old_runs = [e.fence or 0 for e in starts if e.name == job]
        old_runs += [row.fence for row in steps.rows if row.job == job]
        new_runs = [
            row.fence
            for row in final
            if row.job == job
            and row.started_us is not None
            and (row.job, row.slot_us, row.fence) not in known
        ]
        if old_runs and new_runs and min(new_runs) <= max(old_runs):
            back.append(
                f"job {job!r}: run fence {min(new_runs)} claimed after the failover, "
                f"{max(old_runs)} before"
            )
    return _Losses(
        grants=[e for e in before if (e.fence or 0) > steps.fence],
        claims=claims,
        missing=missing,
        back=back,
    )


def _describe(events: Sequence[Event], limit: int = 3) -> str:
    shown = "; ".join(event.describe() for event in events[:limit])
    return shown + (f"; … {len(events) - limit} more" if len(events) > limit else "")


def _unreplicated(steps: _Failover) -> list[RunRecord]:
    """Ledger rows the old primary had just before the crash that the standby lacked (or
    had with a lower fence): claims it committed but never sent to the standby."""
    kept = {(row.job, row.slot_us): row.fence for row in steps.rows}
    return [row for row in steps.doomed if kept.get((row.job, row.slot_us), -1) < row.fence]


def _figures(run: Run, steps: _Failover, losses: _Losses, timeout_s: float) -> None:
    events = run.histories()
    in_cut = _granted_in_cut(events, steps)
    claims = [e for e in _old_runs(events, steps) if (e.slot_us or 0) > steps.cut_store_us]
    timeouts = [
        call
        for call in _calls(events)
        if steps.cut < call.invoke.mono_us < steps.crash
        and call.outcome is not None
        and call.outcome.event.endswith("_error")
        and 0.9 * timeout_s <= (call.seconds or 0) <= timeout_s + _SLACK_S
    ]
    run.figures.update(
        {
            "wal_behind_bytes": steps.behind_bytes,
            "grants_acked_in_cut": len(in_cut),
            "claims_acked_in_cut": len(claims),
            "lost_grants": len(losses.grants),
            "lost_claims": len(losses.claims),
            "started_runs_without_row": len(losses.missing),
            "rows_unreplicated": len(_unreplicated(steps)),
            "fence_went_back": bool(losses.back),
            "calls_timed_out": len(timeouts),
        }
    )


def _no_hang(run: Run, steps: _Failover, timeout: float) -> None:
    """Every call made during the cut ended by the URL's timeout (plus slack for a loaded
    machine), unless the crash came first."""
    bound = timeout + _SLACK_S
    hung = [
        call
        for call in _calls(run.histories())
        if steps.cut < call.invoke.mono_us
        and call.invoke.mono_us + bound * SECOND < steps.crash
        and (call.outcome is None or (call.seconds or 0) > bound)
    ]
    longest = max(
        (
            call.seconds or 0
            for call in _calls(run.histories())
            if steps.cut < call.invoke.mono_us < steps.crash
        ),
        default=0.0,
    )
    run.figures["longest_call_in_cut_s"] = round(longest, 2)
    if hung:
        raise ScenarioFailed(
            f"{len(hung)} calls outlived the {timeout:g} s timeout during the cut: "
            + _describe([call.invoke for call in hung])
        )


# -- the scenarios -----------------------------------------------------------------------
def _failover_sync(run: Run, *, cancel: bool) -> None:
    pair = _pair(run)
    # Short holds: many grants and releases, each waiting for the standby during the cut.
    start_load(run, ttl_ms=3000, hold_ms=300, keepalive=True)
    steps = _cut(run, pair)
    _sync_waits(run, pair, steps, cancel=cancel)
    _crash_and_promote(run, pair, steps)
    run.stop_all()
    final = expect_every_slot(run)
    losses = _losses(run, steps, final)
    _figures(run, steps, losses, pair.timeout_s)
    _no_hang(run, steps, pair.timeout_s)
    if run.figures["calls_timed_out"] == 0:
        raise ScenarioFailed("no call during the cut reported the URL's timeout")
    problems = []
    if losses.grants:
        problems.append(
            f"{len(losses.grants)} acknowledged grants lost: {_describe(losses.grants)}"
        )
    if losses.claims:
        problems.append(
            f"{len(losses.claims)} acknowledged claims lost: {_describe(losses.claims)}"
        )
    if losses.missing:
        problems.append(
            f"{len(losses.missing)} started runs have no ledger row: {_describe(losses.missing)}"
        )
    problems += losses.back
    if problems:
        raise ScenarioFailed("; ".join(problems))


def failover_sync(run: Run) -> None:
    """Synchronous standby: the cut makes every commit wait (calls end at the timeout);
    the primary crashes; the standby is promoted. Nothing acknowledged is lost, no fence
    goes back, the checker finds nothing."""
    _failover_sync(run, cancel=False)


def failover_sync_cancelled(run: Run) -> None:
    """As :func:`failover_sync`, and the commits waiting for the standby are cancelled
    (``pg_cancel_backend``): done on the primary only, they must not be taken as done."""
    _failover_sync(run, cancel=True)


def _failover_async(run: Run, *, clock_behind_s: float) -> None:
    pair = _pair(run)
    # Without keepalive: each holder's answers then come from one server, so the checker
    # never compares store times of two clocks for one holder (they differ when the
    # standby's clock is behind).
    if clock_behind_s:
        # Short leases, and a grant lost at least one lease after the cut: whatever the
        # standby kept of the lease has expired by then on the old primary's clock, so the
        # new primary's first grant comes while its clock (behind) is still below that
        # lost grant's — a fence from its clock alone would go back.
        start_load(run, ttl_ms=1000, hold_ms=300, keepalive=False)
        steps = _cut(run, pair)
        _async_acks(run, steps, grant_after_us=1_100_000)
    else:
        # Holds nearly as long as the lease: a holder granted during the cut still holds,
        # and writes, when the new primary (which never heard of its grant) grants the
        # lease again — the overlap the lost write costs, and the fence that stops its
        # writes.
        start_load(run, ttl_ms=3000, hold_ms=2500, keepalive=False)
        steps = _cut(run, pair)
        _async_acks(run, steps, grant_after_us=0)
    _crash_and_promote(run, pair, steps)
    offset = pair.clock_offset_s()
    run.figures["new_primary_clock_s"] = round(offset, 2)
    if clock_behind_s and not -clock_behind_s - 1 < offset < -clock_behind_s + 1:
        raise ScenarioFailed(
            f"the promoted standby's clock is {offset:+.2f} s off, not −{clock_behind_s:g} s"
        )
    if offset < -0.1:
        _lower_old_samples(run, steps, -offset)
    run.stop_all()
    final = expect_every_slot(run)
    losses = _losses(run, steps, final)
    _figures(run, steps, losses, pair.timeout_s)
    acked = run.figures["grants_acked_in_cut"] + run.figures["claims_acked_in_cut"]
    if acked == 0 or steps.behind_bytes <= 0:
        raise ScenarioFailed(
            f"nothing was acknowledged during the cut ({acked} writes, the standby "
            f"{steps.behind_bytes} bytes of WAL behind): the cut tested nothing"
        )
    if not losses.grants and not losses.claims:
        raise ScenarioFailed(
            f"{acked} writes were acknowledged during the cut and none was lost: the standby "
            "was not cut off"
        )
    if losses.back:
        raise ScenarioFailed("; ".join(losses.back))


def _lower_old_samples(run: Run, steps: _Failover, behind_s: float) -> None:
    """The store's clock went back by ``behind_s`` at the promotion (the new primary's clock
    is behind). A sample of the old primary's clock is then a lower bound of the new one's
    only once lowered by that much (and 0.1 s for the measurement), which keeps judging
    the runs after the failover sound: without it, their signs of life would look that
    much later than they were."""
    lowered = int((behind_s + 0.1) * SECOND)
    run.samples[:] = [
        ClockSample(s.invoke, s.store_us - lowered, s.heard) if s.heard < steps.promoted else s
        for s in list(run.samples)
    ]


def failover_async(run: Run) -> None:
    """Asynchronous standby: what the primary acknowledged during the cut is lost at the
    promotion (overlapping holders, slots run twice: allowed, counted); fences still
    increase."""
    _failover_async(run, clock_behind_s=0)


def failover_async_clock_behind(run: Run) -> None:
    """Asynchronous standby whose clock is 5 s behind the primary's: the new primary's
    fences still stay above every fence of the old one, lost writes included."""
    _failover_async(run, clock_behind_s=5)


_ASYNC_ALLOWED = frozenset({"overlap", "slot_accounting"})
# PostgreSQL's own hole (Patroni's docs say it too): a commit whose wait for the standby
# was cancelled is visible on the primary before any standby has it. A replica that read
# such a row (a slot claimed, or marked missed) acted on a write the failover takes away:
# the slot is left with no ledger row. Nothing acknowledged to fleetcron is lost; the
# figures count the rows.
_CANCELLED_ALLOWED = frozenset({"slot_accounting"})

FAILOVER_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "pg_failover_sync",
        "PostgreSQL primary crashed, synchronous standby promoted (Patroni-style)",
        failover_sync,
        backends=("postgres",),
        needs="pair",
        fast=True,
        ok_states=LOST_OK,
        server_options={"postgres": {"synchronous": True}},
    ),
    Scenario(
        "pg_failover_sync_cancelled",
        "as pg_failover_sync, the commits' waits for the standby cancelled on the primary",
        failover_sync_cancelled,
        backends=("postgres",),
        needs="pair",
        allow=_CANCELLED_ALLOWED,
        ok_states=LOST_OK,
        server_options={"postgres": {"synchronous": True}},
    ),
    Scenario(
        "pg_failover_async",
        "PostgreSQL primary crashed, asynchronous standby promoted: acknowledged writes lost",
        failover_async,
        backends=("postgres",),
        needs="pair",
        allow=_ASYNC_ALLOWED,
        ok_states=LOST_OK,
        server_options={"postgres": {"synchronous": False}},
    ),
    Scenario(
        "pg_failover_async_clock_behind",
        "as pg_failover_async, the standby's clock 5 s behind: fences still increase",
        failover_async_clock_behind,
        backends=("postgres",),
        needs="pair",
        fast=True,
        allow=_ASYNC_ALLOWED,
        ok_states=LOST_OK,
        server_options={"postgres": {"synchronous": False, "standby_offset_s": -5.0}},
    ),
)
"""The failover scenarios, registered in :data:`fault.scenarios.SCENARIOS`."""
