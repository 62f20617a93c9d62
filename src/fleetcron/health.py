"""A job's health, computed from the store alone: the dead man's switch.

Nothing here asks a replica how it is doing. Whether a job is *overdue* is decided from
its row in the store and its ledger, at the store's clock, so the verdict is the same
whether every replica skipped the slot, the store was down when it fell, the job keeps
failing, or no replica runs at all — and a plain monitor on another host
(``fleetcron status --check``) reaches it without the jobs file.

The rules (docs/operations.md):

- **expected slot**: the latest slot ``s`` whose grace has passed (``s + grace <= now``)
  and that falls after the job was first seen (its registration, or its oldest ledger
  row of a slot its schedule reached — not a backfilled or triggered one). ``grace`` is
  the job's ``grace``; by default the gap to the slot after ``s``, at least one minute.
- **overdue**: there is an expected slot and no run succeeded since it (``last success <
  s``).
- **failing**: the latest outcome is a failure (``failed``/``lost``) not followed by a
  success.
- **stuck**: a run holds the slot longer than ``stuck_after`` — set per job, or by default
  three times the 95th percentile of the job's recent successful durations (at least five
  of them, and at least a minute more than the percentile).
- **starved**: the job's latest slots (three or more) were all skipped because a previous
  run still held it.
- **state**, the one word a table shows: ``paused`` > ``overdue`` > ``stuck`` >
  ``failing`` > ``running`` > ``ok``; ``unknown`` for a job whose schedule the store does
  not hold.

:func:`assess` gives all of it from the job's row and its recent ledger rows;
:func:`row_state` gives the state alone from the row, for a job that no run holds and that
has succeeded before — what a paged status read needs of the jobs it does not show.
Cron arithmetic is the costly part of both (tens of µs a call): what depends only on a
slot (the slot before it, the slot after it) is kept between reads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fleetcron.errors import ConfigurationError
from fleetcron.models import PROGRESS_TRIGGERS, JobRecord, RunRecord
from fleetcron.schedules import CronSchedule, Schedule, iso_utc, schedule_from_definition

__all__ = [
    "MIN_GRACE_US",
    "STATES",
    "JobHealth",
    "JobState",
    "assess",
    "expected_slot",
    "row_state",
    "unchanged_until",
]

JobState = Literal["ok", "running", "overdue", "failing", "stuck", "paused", "unknown"]
STATES: tuple[JobState, ...] = ("ok", "running", "overdue", "failing", "stuck", "paused", "unknown")
UNHEALTHY: frozenset[JobState] = frozenset({"overdue", "failing", "stuck"})

MIN_GRACE_US = 60_000_000  # a default grace is never shorter than a minute
STUCK_FACTOR = 3
STUCK_MARGIN_US = 60_000_000
STUCK_SAMPLES = 5  # successful runs needed before a percentile means anything
STARVED_SLOTS = 3
_PREVIOUS_RUNNING = "previous run still running"
_STEPS = 64  # slots walked back looking for one whose default grace has passed


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHealth:
    """What the store says about one job, at its clock (``now_us``). Times are µs since
    the epoch on the store's clock; durations are µs."""

    job: str
    state: JobState
    schedule: str  # e.g. "cron '*/5 * * * *' in Europe/Berlin"
    timezone: str | None
    paused: bool
    next_slot_us: int | None
    expected_slot_us: int | None
    grace_us: int | None
    overdue: bool
    failing: bool
    stuck: bool
    starved: bool
    running: RunRecord | None
    last_run: RunRecord | None  # the newest slot with an outcome or a run in progress
    last_success_us: int | None
    last_failure_us: int | None
    lock_at_most_us: int | None
    stuck_after_us: int | None
    p95_duration_us: int | None
    durations_us: tuple[int, ...]  # recent successful run durations, oldest first
    reasons: tuple[str, ...]  # why the state is what it is, one line each
    now_us: int

    @property
    def healthy(self) -> bool:
        """Neither overdue, failing nor stuck (paused counts as healthy)."""
        return self.state not in UNHEALTHY

    @property
    def lease_age_us(self) -> int | None:
        """How long the run in progress has held its slot."""
        if self.running is None or self.running.started_us is None:
            return None
        return self.now_us - self.running.started_us


# Cron arithmetic, memoised. A slot's neighbours are the same at every read, so they are
# kept for many reads (a dashboard or a monitor asks again every few seconds): two or three
# entries a cron job, enough for 8,000 cron jobs in about 4 MB a cache; the answers for the
# moment of one read are kept only briefly, for the jobs that share a schedule. Interval
# schedules are plain arithmetic, cheaper than a cache lookup.
@functools.lru_cache(maxsize=1 << 14)
def _cron_after_slot(schedule: CronSchedule, slot_us: int) -> int | None:
    return schedule.next_after(slot_us)


@functools.lru_cache(maxsize=1 << 14)
def _cron_before_slot(schedule: CronSchedule, slot_us: int) -> int | None:
    return schedule.at_or_before(slot_us - 1)


@functools.lru_cache(maxsize=1 << 12)
def _cron_at_or_before(schedule: CronSchedule, moment_us: int) -> int | None:
    return schedule.at_or_before(moment_us)


@functools.lru_cache(maxsize=1 << 12)
def _cron_next_after(schedule: CronSchedule, moment_us: int) -> int | None:
    return schedule.next_after(moment_us)


def _after_slot(schedule: Schedule, slot_us: int) -> int | None:
    """The slot after the slot ``slot_us``."""
    if isinstance(schedule, CronSchedule):
        return _cron_after_slot(schedule, slot_us)
    return schedule.next_after(slot_us)


def _next_after(schedule: Schedule, moment_us: int) -> int | None:
    """The first slot after ``moment_us``."""
    if isinstance(schedule, CronSchedule):
        return _cron_next_after(schedule, moment_us)
    return schedule.next_after(moment_us)


def _before_slot(schedule: Schedule, slot_us: int) -> int | None:
    """The slot before the slot ``slot_us``."""
    if isinstance(schedule, CronSchedule):
        return _cron_before_slot(schedule, slot_us)
    return schedule.at_or_before(slot_us - 1)


def _at_or_before(schedule: Schedule, moment_us: int) -> int | None:
    """The latest slot at or before ``moment_us``."""
    if isinstance(schedule, CronSchedule):
        return _cron_at_or_before(schedule, moment_us)
    return schedule.at_or_before(moment_us)


def _grace(schedule: Schedule, slot_us: int, grace_us: int | None) -> int:
    if grace_us is not None:
        return grace_us
    following = _after_slot(schedule, slot_us)
    interval = following - slot_us if following is not None else 0
    return max(interval, MIN_GRACE_US)


def expected_slot(
    schedule: Schedule, grace_us: int | None, now_us: int, since_us: int
) -> int | None:
    """The latest slot after ``since_us`` whose grace has passed at ``now_us``, if any."""
    moment = now_us - (grace_us if grace_us is not None else MIN_GRACE_US)
    slot = _at_or_before(schedule, moment)
    for _ in range(_STEPS):
        if slot is None or slot <= since_us:
            return None
        if slot + _grace(schedule, slot, grace_us) <= now_us:
            return slot
        slot = _before_slot(schedule, slot)
    return None


def _p95(values: Sequence[int]) -> int | None:
    if len(values) < STUCK_SAMPLES:
        return None
    ordered = sorted(values)
    index = max(0, -(-95 * len(ordered) // 100) - 1)  # nearest rank
    return ordered[index]


def _durations(runs: Sequence[RunRecord]) -> list[int]:
    return [
        run.finished_us - run.started_us
        for run in reversed(runs)
        if run.state == "succeeded" and run.finished_us is not None and run.started_us is not None
    ]


def _starved(runs: Sequence[RunRecord]) -> bool:
    settled = [run for run in runs if run.state not in ("queued", "running")]
    latest = settled[:STARVED_SLOTS]
    return len(latest) == STARVED_SLOTS and all(
        run.state == "skipped" and _PREVIOUS_RUNNING in (run.error or "") for run in latest
    )


@dataclass(frozen=True, slots=True)
class _Definition:
    """What the health rules read of a registered definition."""

    schedule: Schedule
    grace_us: int | None
    lock_at_most_us: int | None
    stuck_after_us: int | None
    timezone: str | None


def _parse(text: str) -> _Definition | None:
    """A definition's text as the rules read it; ``None`` when it cannot be read (not
    remembered: a failure may be this host's, a time zone missing from its database)."""
    try:
        return _parsed(text)
    except (ValueError, KeyError, TypeError, ConfigurationError):
        return None


@functools.lru_cache(maxsize=1 << 17)
def _parsed(text: str) -> _Definition:
    """Parsed once for every watch that reads it unchanged (the monitor assesses every job
    every pass); raises when it cannot be read."""
    definition = json.loads(text)
    schedule = schedule_from_definition(definition["schedule"])
    return _Definition(
        schedule=schedule,
        grace_us=_int(definition.get("grace_us")),
        lock_at_most_us=_int(definition.get("lock_at_most_us")),
        stuck_after_us=_int(definition.get("stuck_after_us")),
        timezone=str(definition.get("timezone") or "") or None,
    )


def _failing(job: JobRecord) -> bool:
    return job.last_failure_us is not None and (
        job.last_success_us is None or job.last_failure_us > job.last_success_us
    )


def _since(job: JobRecord, runs: Sequence[RunRecord]) -> int:
    """When the job was first seen: its registration, or its oldest ledger row read of a
    slot the schedule reached (trigger ``schedule`` or ``exec``).

    A backfilled or triggered row names a slot someone asked for, not one the job was
    there for: a backfill of last month's slots of a job registered a minute ago leaves it
    new, not overdue since last month."""
    evidence = [job.updated_us, job.high_water_us, job.last_success_us, job.last_failure_us]
    evidence.append(
        next((run.slot_us for run in reversed(runs) if run.trigger in PROGRESS_TRIGGERS), None)
    )
    return min(value for value in evidence if value is not None)


def row_state(job: JobRecord, *, now_us: int | None = None) -> JobState | None:
    """The state :func:`assess` gives ``job`` when none of its recent ledger rows is a run
    in progress, from its row alone; ``None`` when the row cannot tell: the job never
    succeeded, so whether a slot fell after it was first seen depends on its oldest
    ledger rows.

    The same rules as :func:`assess`, and the same verdict: with a success recorded, the
    time the job was first seen is no later than that success, and a slot whose grace has
    passed makes the job overdue only if it falls after that success — so the ledger's
    oldest rows cannot change the answer. Most jobs need one cron step here (the latest
    slot whose grace may have passed), none when they succeeded within the grace."""
    now = job.now_us if now_us is None else now_us
    parsed = _parse(job.definition or "{}")
    if parsed is None:
        return "paused" if job.paused else "failing" if _failing(job) else "unknown"
    if job.paused:
        return "paused"
    success = job.last_success_us
    if success is None:
        return None
    grace = parsed.grace_us
    latest = now - (grace if grace is not None else MIN_GRACE_US)
    # expected_slot walks back from the latest slot at or before `latest`: when that one is
    # no later than the success, so is the slot it returns.
    if success < latest and (first := _at_or_before(parsed.schedule, latest)) is not None:
        if first > success:
            expected = expected_slot(parsed.schedule, grace, now, _since(job, ()))
            if expected is not None and success < expected:
                return "overdue"
    return "failing" if _failing(job) else "ok"


def assess(job: JobRecord, runs: Sequence[RunRecord], *, now_us: int | None = None) -> JobHealth:
    """The health of ``job`` from its row and its recent ledger rows (newest first, as
    ``run_list`` returns them), at the store's clock ``now_us`` (default: the row's)."""
    now = job.now_us if now_us is None else now_us
    parsed = _parse(job.definition or "{}")
    if parsed is None:
        return _unknown(job, runs, now)
    schedule, grace, lock_at_most = parsed.schedule, parsed.grace_us, parsed.lock_at_most_us
    since = _since(job, runs)

    expected = expected_slot(schedule, grace, now, since) if not job.paused else None
    overdue = expected is not None and (
        job.last_success_us is None or job.last_success_us < expected
    )
    failing = _failing(job)
    running = next(
        (r for r in runs if r.state == "running" and (r.expires_us or 0) > now),
        None,
    )
    durations = _durations(runs)
    p95 = _p95(durations)
    stuck_after = parsed.stuck_after_us
    if stuck_after is None and p95 is not None:
        stuck_after = max(STUCK_FACTOR * p95, p95 + STUCK_MARGIN_US)
    age = now - running.started_us if running is not None and running.started_us else None
    stuck = age is not None and stuck_after is not None and age > stuck_after
    starved = _starved(runs)

    due_grace = _grace(schedule, expected, grace) if expected is not None else grace
    reasons: list[str] = []
    if job.paused:
        reasons.append("paused")
    if overdue:
        assert expected is not None
        assert due_grace is not None
        reasons.append(
            f"no success since the slot of {iso_utc(expected)} (due by "
            f"{iso_utc(expected + due_grace)})"
        )
    if stuck:
        assert age is not None
        assert stuck_after is not None
        reasons.append(
            f"a run has held the slot {age // 1_000_000}s, over {stuck_after // 1_000_000}s"
        )
    if failing:
        reasons.append("the latest outcome is a failure")
    if starved:
        reasons.append(f"the last {STARVED_SLOTS} slots were skipped: a previous run still ran")

    state: JobState
    if job.paused:
        state = "paused"
    elif overdue:
        state = "overdue"
    elif stuck:
        state = "stuck"
    elif failing:
        state = "failing"
    elif running is not None:
        state = "running"
    else:
        state = "ok"
    return JobHealth(
        job=job.job,
        state=state,
        schedule=schedule.describe(),
        timezone=parsed.timezone,
        paused=job.paused,
        next_slot_us=_next_after(schedule, now),
        expected_slot_us=expected,
        grace_us=due_grace,
        overdue=overdue,
        failing=failing,
        stuck=stuck,
        starved=starved,
        running=running,
        last_run=next((r for r in runs if r.state not in ("queued",)), None),
        last_success_us=job.last_success_us,
        last_failure_us=job.last_failure_us,
        lock_at_most_us=lock_at_most,
        stuck_after_us=stuck_after,
        p95_duration_us=p95,
        durations_us=tuple(durations),
        reasons=tuple(reasons),
        now_us=now,
    )


def unchanged_until(job: JobRecord, runs: Sequence[RunRecord], health: JobHealth) -> int | None:
    """Until when ``health`` (:func:`assess` of ``job`` and ``runs``) holds as the store's
    clock moves on and the row and the ledger rows stay as they are: the first moment at
    which :func:`assess` may judge otherwise (``now_us`` aside), ``None`` when never.

    That moment is the earliest of the job's next slot (shown as ``next_slot_us``) and the
    end of the grace of the first slot that may become the expected one (overdue from then
    on, unless a success came). A job with a running row answers ``health.now_us``: a run
    in progress may expire or become stuck, its age is part of what is said of it, and a
    running row whose lease expired is closed as ``lost`` by the next claim of its slot
    without a word to the job's row — so it is judged afresh each time."""
    now = health.now_us
    if any(run.state == "running" for run in runs):
        return now
    parsed = _parse(job.definition or "{}")
    if parsed is None:
        return None  # the row and the ledger alone decide
    until = health.next_slot_us
    if not job.paused:
        # The slots grow older in order, and so does the end of their grace: the next one
        # after the expected slot (after the job was first seen) is the first to pass it.
        schedule, grace, expected = parsed.schedule, parsed.grace_us, health.expected_slot_us
        candidate: int | None
        if expected is not None:
            candidate = _after_slot(schedule, expected)
        else:
            # The first slot after the job was first seen. Mostly it is the first slot at
            # or after the moment expected_slot looked back from — worked out by that
            # look-up, and kept for every job of the schedule — so this job needs no cron
            # step of its own.
            since = _since(job, runs)
            moment = now - (grace if grace is not None else MIN_GRACE_US)
            latest = _at_or_before(schedule, moment)
            first = _next_after(schedule, moment - 1)
            if (latest is None or latest <= since) and (first is None or first > since):
                candidate = first
            else:
                candidate = _next_after(schedule, since)
        if candidate is not None:
            passes = candidate + _grace(schedule, candidate, grace)
            until = passes if until is None else min(until, passes)
    return until


def _unknown(job: JobRecord, runs: Sequence[RunRecord], now: int) -> JobHealth:
    """A job row without a readable definition (made by a claim before any replica or
    ``exec --schedule`` of this version registered the job, or by a newer version): its
    schedule is not known here, so neither is its due time."""
    failing = _failing(job)
    return JobHealth(
        job=job.job,
        state="paused" if job.paused else "failing" if failing else "unknown",
        schedule="-",
        timezone=None,
        paused=job.paused,
        next_slot_us=None,
        expected_slot_us=None,
        grace_us=None,
        overdue=False,
        failing=failing,
        stuck=False,
        starved=_starved(runs),
        running=next((r for r in runs if r.state == "running"), None),
        last_run=next((r for r in runs if r.state != "queued"), None),
        last_success_us=job.last_success_us,
        last_failure_us=job.last_failure_us,
        lock_at_most_us=None,
        stuck_after_us=None,
        p95_duration_us=_p95(_durations(runs)),
        durations_us=tuple(_durations(runs)),
        reasons=(
            (
                "paused ahead of its registration: no replica has registered it yet; it "
                "starts paused when one does"
            )
            if job.paused and not job.fingerprint
            else "no schedule registered for this job (older fleetcron exec, or another version)",
        ),
        now_us=now,
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
