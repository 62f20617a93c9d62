"""The doctor's checks of each job's definition — its schedule, daylight saving, the
lengths of its lease, jitter, timeout and grace, and whether the store holds the same
definition — and the job's facts they look at."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fleetcron.clock import SYSTEM_CLOCK
from fleetcron.doctor.facts import DstEffect, JobFacts
from fleetcron.doctor.findings import LOCK_AT_MOST_WARN_RATIO, Finding
from fleetcron.doctor.findings import duration_text as _d
from fleetcron.errors import ConfigurationError
from fleetcron.jobspec import JobSpec
from fleetcron.models import JobRecord
from fleetcron.schedules import (
    AtSchedule,
    CronSchedule,
    Schedule,
    iso_utc,
    preview,
    schedule_from_definition,
    to_datetime,
)

__all__ = [
    "JobTerms",
    "definition_failures",
    "dst_effects",
    "job_facts",
    "job_findings",
    "spec_terms",
    "stored_terms",
]

_DAY_US = 86_400_000_000
_YEAR_US = 366 * _DAY_US
_DST_WINDOW_SLOTS = 5_000  # slots looked at around one transition, at most


def job_findings(job: JobFacts) -> list[Finding]:
    return [
        _job_schedule(job),
        *_job_dst(job),
        *_job_lock_at_least(job),
        *_job_jitter(job),
        *_job_lock_at_most(job),
        *_job_timeout(job),
        *_job_grace(job),
        *_job_definition(job),
    ]


def definition_failures(spec: JobSpec, now_us: int | None = None) -> list[Finding]:
    """The ``fail`` findings of combinations of ``spec``'s keys that ``fleetcron run``
    refuses (``lock_at_least``, ``jitter``, ``timeout`` against the others), judged
    from the definition alone at ``now_us`` (default: now)."""
    now = SYSTEM_CLOCK.wall_us() if now_us is None else now_us
    job = job_facts(spec_terms(spec), now, None, None)
    found = [*_job_lock_at_least(job), *_job_jitter(job), *_job_timeout(job)]
    return [finding for finding in found if finding.level == "fail"]


def _check(job: JobFacts, aspect: str) -> str:
    return f"job {job.name} ({aspect})"


def _job_schedule(job: JobFacts) -> Finding:
    check = _check(job, "schedule")
    if job.next_slot_us is not None:
        following = f"{job.schedule}: next slot {iso_utc(job.next_slot_us)}"
        return Finding(level="ok", check=check, message=following)
    if job.one_off:
        ran = job.durations_us is not None and len(job.durations_us) > 0
        return Finding(
            level="ok" if ran else "warn",
            check=check,
            message=f"{job.schedule}: in the past, nothing more to run"
            + ("" if ran else " (no successful run in the ledger)"),
            advice="" if ran else "remove the job, or give it a moment to come",
        )
    return Finding(
        level="fail",
        check=check,
        message=f"{job.schedule} never fires (no slot in the next 50 years)",
        advice="check the day-of-month, month and day-of-week fields: `fleetcron next "
        "EXPRESSION` previews the fire times",
    )


def _job_dst(job: JobFacts) -> list[Finding]:
    if not job.dst_effects:
        return []
    first = job.dst_effects[0]
    more = len(job.dst_effects) - 1
    extra = f" (and {more} more slot(s) in the coming year)" if more else ""
    return [
        Finding(
            level="warn",
            check=_check(job, "daylight saving"),
            message=f"{job.schedule}: {first.note}{extra}",
            advice="the schedule follows the wall clock of its time zone; `fleetcron next "
            f"'{job.expression}' --timezone {job.timezone}` shows each effect: schedule it "
            'outside the hours the clocks change, or use timezone = "UTC"',
        )
    ]


def _job_lock_at_least(job: JobFacts) -> list[Finding]:
    least, most, interval = job.lock_at_least_us, job.lock_at_most_us, job.min_interval_us
    check = _check(job, "lock_at_least")
    if least > most:
        return [
            Finding(
                level="fail",
                check=check,
                message=f"{_d(least)} is longer than lock_at_most {_d(most)}",
                advice="lock_at_least cannot outlast the lease: make it shorter than "
                "lock_at_most (`fleetcron run` refuses this definition)",
            )
        ]
    if least == 0 or interval is None:
        return []
    if least >= interval:
        return [
            Finding(
                level="fail",
                check=check,
                message=f"{_d(least)} is not shorter than the shortest interval of the "
                f"schedule, {_d(interval)}",
                advice="the lease stays held for lock_at_least after each start, so the next "
                f"slot finds it held and is skipped: make it shorter than {_d(interval)} "
                "(`fleetcron run` refuses this definition)",
            )
        ]
    return [
        Finding(
            level="ok",
            check=check,
            message=f"{_d(least)}, shorter than the shortest interval {_d(interval)}",
        )
    ]


def _job_jitter(job: JobFacts) -> list[Finding]:
    jitter, interval = job.jitter_us, job.min_interval_us
    if jitter == 0 or interval is None:
        return []
    check = _check(job, "jitter")
    if jitter >= interval:
        return [
            Finding(
                level="fail",
                check=check,
                message=f"{_d(jitter)} is not shorter than the shortest interval {_d(interval)}",
                advice="a slot could start after the next one is due: make it shorter than "
                f"{_d(interval)} (`fleetcron run` refuses this definition)",
            )
        ]
    return [
        Finding(
            level="ok",
            check=check,
            message=f"{_d(jitter)}, shorter than the shortest interval {_d(interval)}",
        )
    ]


def _job_lock_at_most(job: JobFacts) -> list[Finding]:
    durations = job.durations_us
    if durations is None:
        return []
    most = job.lock_at_most_us
    check = _check(job, "lock_at_most")
    if not durations:
        return [
            Finding(
                level="ok",
                check=check,
                message=f"{_d(most)}; no successful run in the ledger to compare it with",
            )
        ]
    longest = max(durations)
    ratio = longest / most
    seen = (
        f"the longest of the last {len(durations)} successful run(s) took {_d(longest)}, "
        f"{ratio:.0%} of lock_at_most {_d(most)}"
    )
    if job.keepalive:
        # The lease is renewed every lock_at_most/3 while the run lasts: lock_at_most bounds
        # only how long a crashed holder keeps the job, not how long a run may take.
        renewed = " (renewed while it runs: keepalive)" if ratio > 1 else ""
        return [Finding(level="ok", check=check, message=seen + renewed)]
    if ratio >= 1:
        return [
            Finding(
                level="fail",
                check=check,
                message=f"{seen}, with keepalive = false",
                advice=f"a run is killed when lock_at_most elapses: raise lock_at_most above "
                f"{_d(longest)} with room to spare, or set keepalive = true",
            )
        ]
    if ratio > LOCK_AT_MOST_WARN_RATIO:
        return [
            Finding(
                level="warn",
                check=check,
                message=f"{seen}, with keepalive = false",
                advice="a slower run is killed when lock_at_most elapses (the lease is not "
                "renewed): raise lock_at_most, or set keepalive = true",
            )
        ]
    return [Finding(level="ok", check=check, message=seen)]


def _job_timeout(job: JobFacts) -> list[Finding]:
    timeout, most = job.timeout_us, job.lock_at_most_us
    if timeout is None or job.keepalive:
        return []
    check = _check(job, "timeout")
    if timeout >= most:
        return [
            Finding(
                level="fail",
                check=check,
                message=f"{_d(timeout)} is not shorter than lock_at_most {_d(most)} with "
                "keepalive = false",
                advice="the run is killed as its lease ends, before the timeout could cancel "
                "it (recorded lost, not timed out): make the timeout shorter than "
                "lock_at_most, or set keepalive = true",
            )
        ]
    return [
        Finding(
            level="ok",
            check=check,
            message=f"{_d(timeout)}, shorter than lock_at_most {_d(most)} (keepalive = false)",
        )
    ]


def _job_grace(job: JobFacts) -> list[Finding]:
    grace, jitter = job.grace_us, job.jitter_us
    if grace is None or jitter == 0:
        return []
    check = _check(job, "grace")
    if grace <= jitter:
        return [
            Finding(
                level="warn",
                check=check,
                message=f"{_d(grace)} is not longer than jitter {_d(jitter)}",
                advice="a slot may start up to jitter after its time, so the job is reported "
                "overdue (status --check, alerts) while it runs on time: make grace longer "
                "than jitter plus the run's usual length",
            )
        ]
    return [
        Finding(level="ok", check=check, message=f"{_d(grace)}, longer than jitter {_d(jitter)}")
    ]


def _job_definition(job: JobFacts) -> list[Finding]:
    stored, mine = job.stored_fingerprint, job.fingerprint
    if stored is None or mine is None or stored in ("", mine):
        return []
    return [
        Finding(
            level="warn",
            check=_check(job, "definition"),
            message=f"the store holds another definition ({stored[:8]}) than this jobs "
            f"file's ({mine[:8]})",
            advice="the definition of the replica that started last governs; replicas "
            "with another one do not run the job: deploy one definition everywhere",
        )
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTerms:
    """A job's definition, from a jobs file or from the store."""

    name: str
    schedule: Schedule
    lock_at_most_us: int
    lock_at_least_us: int
    timeout_us: int | None
    keepalive: bool
    jitter_us: int
    grace_us: int | None
    fingerprint: str | None


def spec_terms(spec: JobSpec, fingerprint: bool = True) -> JobTerms:
    return JobTerms(
        name=spec.name,
        schedule=spec.schedule,
        lock_at_most_us=spec.lock_at_most_us,
        lock_at_least_us=spec.lock_at_least_us,
        timeout_us=spec.timeout_us,
        keepalive=spec.keepalive,
        jitter_us=spec.jitter_us,
        grace_us=spec.grace_us,
        fingerprint=spec.fingerprint() if fingerprint else None,
    )


def _int(value: object, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def stored_terms(record: JobRecord) -> JobTerms | None:
    """The definition a replica registered, or ``None`` when there is none readable."""
    try:
        definition = json.loads(record.definition or "{}")
        schedule = schedule_from_definition(definition["schedule"])
        most = definition["lock_at_most_us"]
    except (ValueError, KeyError, TypeError, ConfigurationError):
        return None
    if not isinstance(most, int):
        return None
    return JobTerms(
        name=record.job,
        schedule=schedule,
        lock_at_most_us=most,
        lock_at_least_us=_int(definition.get("lock_at_least_us"), 0) or 0,
        timeout_us=_int(definition.get("timeout_us")),
        keepalive=definition.get("keepalive") is not False,
        jitter_us=_int(definition.get("jitter_us"), 0) or 0,
        grace_us=_int(definition.get("grace_us")),
        fingerprint=None,
    )


def _offset_changes(schedule: CronSchedule, start_us: int, end_us: int) -> list[int]:
    """Moments a day before each change of the zone's UTC offset in ``[start, end)``."""
    zone = schedule.zone
    found = []
    moment = start_us
    offset = to_datetime(moment).astimezone(zone).utcoffset()
    while moment < end_us:
        following = to_datetime(moment + _DAY_US).astimezone(zone).utcoffset()
        if following != offset:
            found.append(moment)
        moment, offset = moment + _DAY_US, following
    return found


def dst_effects(schedule: Schedule, from_us: int) -> tuple[DstEffect, ...]:
    """The slots of the coming year that daylight saving moves, merges or repeats, with
    :func:`~fleetcron.schedules.preview`'s notes.

    A cron expression whose hour field is ``*`` walks the real timeline the same way in
    every hour (cronsim): a gap or a repeated hour changes no interval, so it has none.
    """
    if not isinstance(schedule, CronSchedule) or schedule.expression.split()[1] == "*":
        return ()
    effects: list[DstEffect] = []
    for change in _offset_changes(schedule, from_us, from_us + _YEAR_US):
        start, end = change - _DAY_US, change + 3 * _DAY_US
        for entry in preview(schedule.expression, schedule.timezone, _DST_WINDOW_SLOTS, start):
            if entry.slot_us > end:
                break
            if entry.dst is not None and entry.slot_us > from_us:
                effects.append(DstEffect(slot_us=entry.slot_us, kind=entry.dst, note=entry.note))
    return tuple(effects)


def job_facts(
    terms: JobTerms,
    now_us: int,
    durations: tuple[int, ...] | None,
    stored_fingerprint: str | None,
) -> JobFacts:
    schedule = terms.schedule
    cron = schedule if isinstance(schedule, CronSchedule) else None
    return JobFacts(
        name=terms.name,
        schedule=schedule.describe(),
        expression=cron.expression if cron is not None else None,
        timezone=cron.timezone if cron is not None else "UTC",
        one_off=isinstance(schedule, AtSchedule),
        next_slot_us=schedule.next_after(now_us),
        min_interval_us=schedule.min_interval_us(from_us=now_us),
        lock_at_most_us=terms.lock_at_most_us,
        lock_at_least_us=terms.lock_at_least_us,
        timeout_us=terms.timeout_us,
        keepalive=terms.keepalive,
        jitter_us=terms.jitter_us,
        grace_us=terms.grace_us,
        dst_effects=dst_effects(schedule, now_us),
        durations_us=durations,
        fingerprint=terms.fingerprint,
        stored_fingerprint=stored_fingerprint,
    )
