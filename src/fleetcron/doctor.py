"""``fleetcron doctor``: the checks of a deployment, as rules over gathered facts.

:func:`gather` reads what the checks need from a connected store — each fact once — and
works out what follows from the jobs' definitions (shortest interval, next slot, daylight
saving effects); :func:`diagnose` turns those :class:`Facts` into findings
without any I/O, so every rule can be exercised with hand-made facts.

A finding is ``ok``, ``warn`` (works, but something deserves attention) or ``fail``
(something will go wrong: a slot skipped, a run killed, a store this fleetcron refuses).
Rules that do not apply (no ``timeout``, no ``grace``, not Redis) give no finding.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import format_duration
from fleetcron.errors import ConfigurationError, StoreError, StoreMissing, StoreUnavailable
from fleetcron.jobspec import JobSpec
from fleetcron.models import JobRecord, ReplicaRecord, display_holder
from fleetcron.schedules import (
    AtSchedule,
    CronSchedule,
    DstNote,
    Schedule,
    iso_utc,
    preview,
    schedule_from_definition,
    to_datetime,
)
from fleetcron.stores.base import SyncStore
from fleetcron.stores.sql.runner import SqlSyncStore

__all__ = [
    "CLOCK_FAIL_US",
    "CLOCK_WARN_US",
    "LEVELS",
    "LOCK_AT_MOST_WARN_RATIO",
    "ROUND_TRIP_WARN_US",
    "ClockReading",
    "DstEffect",
    "Facts",
    "Finding",
    "JobFacts",
    "Level",
    "PoolingFacts",
    "PoolingMode",
    "RedisFacts",
    "definition_failures",
    "diagnose",
    "dst_effects",
    "gather",
    "missing_store",
    "pooling_mode",
]

Level = Literal["ok", "warn", "fail"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "fail")

CLOCK_WARN_US = 1_000_000
CLOCK_FAIL_US = 10_000_000
"""``fleetcron exec --schedule`` waits at most this long (its early-trigger tolerance) for
the store's clock to reach a slot a cron on this host fired for."""
ROUND_TRIP_WARN_US = 100_000
LOCK_AT_MOST_WARN_RATIO = 0.8
SAMPLES = 5  # store_now round trips
HISTORY = 50  # ledger rows read per job

_DAY_US = 86_400_000_000
_YEAR_US = 366 * _DAY_US
_DST_WINDOW_SLOTS = 5_000  # slots looked at around one transition, at most


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One result: its ``level``, what was checked, what was found, and what to do."""

    level: Level
    check: str
    message: str
    advice: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockReading:
    """One ``store_now`` round trip: how long it took, and the store's clock minus this
    host's wall clock at its middle (positive: this host is behind)."""

    round_trip_us: int
    offset_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisFacts:
    """A Redis server's role and settings. A setting is ``None`` when ``CONFIG GET`` was
    refused (renamed or disabled, as on managed Redis; ``config_error`` says how)."""

    role: str
    replicas: int
    appendonly: str | None
    appendfsync: str | None
    save: str | None
    maxmemory_policy: str | None
    config_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolingFacts:
    """What PostgreSQL said of the server process behind each statement, as ``(announced
    pid, pg_backend_pid())`` pairs: ``first`` on the store's connection, ``second`` on a
    second connection, the statements of the two interleaved, each its own transaction.
    ``prepares``: the store's connection prepares statements it runs often (psycopg's
    ``prepare_threshold``)."""

    first: tuple[tuple[int, int], ...]
    second: tuple[tuple[int, int], ...]
    prepares: bool = False


PoolingMode = Literal["none", "transaction", "unknown"]


def pooling_mode(facts: PoolingFacts) -> PoolingMode:
    """``none`` when each statement ran in the process the server announced at connect
    (no pooler); ``transaction`` when server processes were shared between the two client
    connections, or one client connection moved between them (a pooler in transaction
    or statement mode); ``unknown`` for a pooler not seen to do either (session pooling,
    or a pool busy enough to hand out other server connections)."""
    pairs = facts.first + facts.second
    if all(announced == reported for announced, reported in pairs):
        return "none"
    first = {reported for _, reported in facts.first}
    second = {reported for _, reported in facts.second}
    if first & second or len(first) > 1 or len(second) > 1:
        return "transaction"
    return "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class DstEffect:
    """A slot daylight saving moves, merges or repeats (see :func:`preview`)."""

    slot_us: int
    kind: DstNote
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFacts:
    """A job's definition and what follows from it, at the store's clock.

    ``next_slot_us`` is ``None`` when the schedule never fires again; ``durations_us``
    are the successful runs' lengths in the ledger (newest first), ``None`` when the
    ledger was not read. ``fingerprint`` is the checked definition's (a jobs file's;
    ``None`` for one read from the store), ``stored_fingerprint`` the one registered in
    the store (``None``: no job row)."""

    name: str
    schedule: str
    expression: str | None = None
    timezone: str = "UTC"
    one_off: bool = False
    next_slot_us: int | None
    min_interval_us: int | None
    lock_at_most_us: int
    lock_at_least_us: int = 0
    timeout_us: int | None = None
    keepalive: bool = True
    jitter_us: int = 0
    grace_us: int | None = None
    dst_effects: tuple[DstEffect, ...] = ()
    durations_us: tuple[int, ...] | None = None
    fingerprint: str | None = None
    stored_fingerprint: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """Everything the checks look at.

    ``schema_version``/``latest_version`` are ``None`` for a store that keeps no schema;
    ``stored_jobs`` (job rows with a definition, registered by replicas) and ``replicas``
    are ``None`` when they were not read (the schema is not current). ``replicas`` holds
    the live rows and those gone within the last minutes. ``undefined_jobs``: job rows
    without a readable definition (an older ``fleetcron exec --schedule``, or a newer
    fleetcron).
    """

    kind: str
    url: str
    namespace: str
    readings: tuple[ClockReading, ...]
    now_us: int
    schema_version: int | None = None
    latest_version: int | None = None
    jobs_file: str | None = None
    jobs: tuple[JobFacts, ...] = ()
    undefined_jobs: tuple[str, ...] = ()
    stored_jobs: int | None = None
    replicas: tuple[ReplicaRecord, ...] | None = None
    redis: RedisFacts | None = None
    pooling: PoolingFacts | None = None
    pooling_error: str | None = None


# -- the rules ---------------------------------------------------------------------------


def diagnose(facts: Facts) -> list[Finding]:
    """The findings, in the order of the checks: store, schema, clock, namespace, backend
    specifics, jobs, replicas."""
    findings = [
        _store(facts),
        *_schema(facts),
        _clock(facts),
        _namespace(facts),
        *_redis(facts.redis),
        *_pooling(facts),
    ]
    for job in facts.jobs:
        findings += _job(job)
    findings += [
        Finding(
            level="ok",
            check=f"job {name}",
            message="no definition in the store (run by an older `fleetcron exec "
            "--schedule`, or registered by another version): its schedule and terms are "
            "not checked",
        )
        for name in facts.undefined_jobs
    ]
    findings += _replicas(facts)
    return findings


def missing_store(
    kind: str,
    url: str,
    error: StoreMissing,
    specs: Sequence[JobSpec] = (),
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> list[Finding]:
    """The findings when there is no store at ``url`` to examine (no SQLite file): a
    failure — the doctor reads a store and never creates one — then the checks of
    ``specs`` (a jobs file's) that need no store, judged on this host's clock."""
    store = Finding(
        level="fail",
        check="store",
        message=f"{kind} at {url}: {error.message}",
        advice="the schema, the clock, the ledger and the replicas were not checked; if "
        "the store should be there, check the backend URL (--backend, $FLEETCRON_BACKEND, "
        "the jobs file's backend)",
    )
    now = clock.wall_us()
    jobs = [_job_facts(_spec_terms(spec, False), now, None, None) for spec in specs]
    return [store, *(finding for job in jobs for finding in _job(job))]


def _d(micros: int) -> str:
    return format_duration(micros)


def _store(facts: Facts) -> Finding:
    trips = [reading.round_trip_us for reading in facts.readings]
    median = round(statistics.median(trips))
    what = (
        f"{facts.kind} at {facts.url}, round trip {_d(median)} "
        f"(median of {len(trips)} store_now calls)"
    )
    if median > ROUND_TRIP_WARN_US:
        return Finding(
            level="warn",
            check="store",
            message=f"{what}: slow",
            advice="every claim, renewal and outcome is a round trip; over "
            f"{_d(ROUND_TRIP_WARN_US)} each, a replica runs few slots per second and "
            "renewals eat into lock_at_most: run the replicas near their store",
        )
    return Finding(level="ok", check="store", message=what)


def _schema(facts: Facts) -> list[Finding]:
    version, latest = facts.schema_version, facts.latest_version
    if version is None or latest is None:
        kept = f"{facts.kind} keeps no schema: nothing to migrate"
        return [Finding(level="ok", check="schema", message=kept)]
    if version == latest:
        return [Finding(level="ok", check="schema", message=f"version {version}, current")]
    if version > latest:
        return [
            Finding(
                level="fail",
                check="schema",
                message=f"version {version} is newer than this fleetcron understands ({latest})",
                advice="every fleetcron command of this version refuses the store: upgrade "
                "fleetcron on this host to the fleet's version",
            )
        ]
    found = "not created yet" if version == 0 else f"version {version}, older than {latest}"
    return [
        Finding(
            level="warn",
            check="schema",
            message=f"{found}; the jobs, ledger and replicas were not read",
            advice="the first replica of this version (`fleetcron run`, `exec`, the library) "
            "creates or upgrades it, and the commands that only read (`status`, `runs`, "
            "`locks`, `web`) refuse the store until then; run `fleetcron migrate` to do it "
            "now, ahead of a deploy",
        )
    ]


def _clock(facts: Facts) -> Finding:
    best = min(facts.readings, key=lambda reading: reading.round_trip_us)
    offset, error = best.offset_us, best.round_trip_us // 2
    if abs(offset) < 1_000:
        where = "agrees with the store's"
    else:
        side = "behind" if offset > 0 else "ahead of"
        where = f"is {_d(abs(offset))} {side} the store's"
    message = f"this host's clock {where} (±{_d(max(error, 1))})"
    certain = abs(offset) - error  # the smallest offset the readings allow
    why = (
        "leases, slots and overdue checks use the store's clock only, so the offset never "
        "lets a slot run twice; it skews this host's log times against the store's"
    )
    if offset < 0 and certain > CLOCK_FAIL_US:
        return Finding(
            level="fail",
            check="clock",
            message=message,
            advice=f"{why}, and `fleetcron exec --schedule` waits at most "
            f"{_d(CLOCK_FAIL_US)} for the store's clock to reach the slot a cron on this host "
            "fired for: beyond that the trigger counts for the slot before, which already "
            "ran (skipped). Fix this host's time sync (chrony, systemd-timesyncd)",
        )
    if certain > CLOCK_WARN_US:
        return Finding(
            level="warn",
            check="clock",
            message=message,
            advice=f"{why}; `fleetcron exec --schedule` triggers fired by this host's cron "
            "arrive early or late by as much. Fix this host's time sync (chrony, "
            "systemd-timesyncd)",
        )
    return Finding(level="ok", check="clock", message=message)


def _namespace(facts: Facts) -> Finding:
    if facts.stored_jobs is None:
        counted = ""
    else:
        counted = f": {facts.stored_jobs} job(s) registered in the store"
        if facts.undefined_jobs:
            counted += f", {len(facts.undefined_jobs)} with no readable definition"
    source = f"; checking the jobs of {facts.jobs_file}" if facts.jobs_file else ""
    return Finding(
        level="ok",
        check="namespace",
        message=f"{facts.namespace!r}{counted}{source}",
        advice="" if facts.jobs_file or facts.stored_jobs else "--namespace chooses another",
    )


# -- backends ----------------------------------------------------------------------------


def _redis(redis: RedisFacts | None) -> list[Finding]:
    if redis is None:
        return []
    return [_redis_persistence(redis), _redis_eviction(redis), _redis_replication(redis)]


def _cannot_tell(redis: RedisFacts, check: str, setting: str) -> Finding:
    return Finding(
        level="warn",
        check=check,
        message=f"cannot tell: CONFIG GET {setting} was refused "
        f"({redis.config_error or 'no value'})",
        advice="CONFIG is disabled or not granted (managed Redis): check the setting in "
        "the provider's console (docs/backends.md lists what each one keeps)",
    )


def _redis_persistence(redis: RedisFacts) -> Finding:
    check = "redis (persistence)"
    aof, fsync, save = redis.appendonly, redis.appendfsync, redis.save
    if aof is None or save is None:
        return _cannot_tell(redis, check, "appendonly/save")
    lost = (
        "a restart loses the leases and the run ledger since then: slots that already ran "
        "can run again (fences stay monotonic)"
    )
    if aof == "yes":
        if fsync in ("always", "everysec"):
            kept = "everything" if fsync == "always" else "all but the last second before a crash"
            found = f"appendonly yes, appendfsync {fsync}: keeps {kept}"
            return Finding(level="ok", check=check, message=found)
        return Finding(
            level="warn",
            check=check,
            message=f"appendonly yes, appendfsync {fsync}: the OS decides when writes reach "
            "the disk (about every 30s)",
            advice=f"{lost}; set appendfsync everysec or always",
        )
    if save.strip():
        return Finding(
            level="warn",
            check=check,
            message=f'RDB snapshots only (appendonly no, save "{save}")',
            advice=f"{lost}; set appendonly yes",
        )
    return Finding(
        level="warn",
        check=check,
        message='keeps nothing across a restart (appendonly no, save "")',
        advice=f"{lost}; set appendonly yes (docs/backends.md)",
    )


def _redis_eviction(redis: RedisFacts) -> Finding:
    check = "redis (eviction)"
    policy = redis.maxmemory_policy
    if policy is None:
        return _cannot_tell(redis, check, "maxmemory-policy")
    if policy.startswith("allkeys-"):
        return Finding(
            level="warn",
            check=check,
            message=f"maxmemory-policy {policy}: lease hashes can be evicted under memory pressure",
            advice="a lease evicted early lets a second replica take a running job's slot "
            "(fences stay monotonic); use noeviction or a volatile-* policy, which leave "
            "fleetcron's keys (no TTL) alone",
        )
    return Finding(level="ok", check=check, message=f"maxmemory-policy {policy}")


def _redis_replication(redis: RedisFacts) -> Finding:
    check = "redis (replication)"
    if redis.role not in ("master", "primary"):
        return Finding(
            level="fail",
            check=check,
            message=f"the server is a {redis.role}, not a primary",
            advice="fleetcron refuses a replica: point the backend URL at the primary",
        )
    if redis.replicas:
        return Finding(
            level="warn",
            check=check,
            message=f"primary with {redis.replicas} connected replica(s): replication is "
            "asynchronous",
            advice="a failover to a replica loses the writes it had not received: a lease "
            "taken just before can be taken again, and a slot that just ran can run again. "
            "Fences still increase (they fold in the server's clock): data that checks "
            "ctx.fence / $FLEETCRON_FENCE refuses the stale holder",
        )
    return Finding(level="ok", check=check, message="primary, no replicas")


def _pooling(facts: Facts) -> list[Finding]:
    check = "postgres (pooler)"
    if facts.pooling_error is not None:
        return [
            Finding(
                level="warn",
                check=check,
                message=f"cannot tell: {facts.pooling_error}",
                advice="the check opens a second connection for a moment; allow one more "
                "connection to the database, or run it when the pool has room",
            )
        ]
    if facts.pooling is None:
        return []
    mode = pooling_mode(facts.pooling)
    works = (
        "fleetcron works behind it: every statement is its own transaction and nothing is "
        "kept in the session; tools built on session advisory locks, SET or LISTEN would not"
    )
    if mode == "none":
        return [
            Finding(
                level="ok",
                check=check,
                message="none: each statement ran in the server process PostgreSQL "
                "announced at connect",
            )
        ]
    if mode == "unknown":
        return [
            Finding(
                level="ok",
                check=check,
                message="a connection pooler (PgBouncer or alike) answers, not PostgreSQL "
                "itself; it was not seen to pool per transaction (session pooling, or a "
                "busy pool)",
                advice=works,
            )
        ]
    found = (
        "transaction pooling: a pooler (PgBouncer or alike) ran statements of two client "
        "connections on one server connection"
    )
    if facts.pooling.prepares:
        return [
            Finding(
                level="warn",
                check=check,
                message=found,
                advice=f"{works}. But its driver prepares a statement it runs often, which "
                'another server connection does not know (\'prepared statement "_pg3_0" '
                "does not exist' or 'already exists' under load): give PgBouncer 1.21 or "
                "later max_prepared_statements = 100, or add prepared_statements=off to the "
                "backend URL",
            )
        ]
    return [Finding(level="ok", check=check, message=found, advice=works)]


# -- jobs --------------------------------------------------------------------------------


def _job(job: JobFacts) -> list[Finding]:
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
    job = _job_facts(_spec_terms(spec), now, None, None)
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


# -- replicas ----------------------------------------------------------------------------


def _replicas(facts: Facts) -> list[Finding]:
    if facts.replicas is None:
        return []
    alive = [r for r in facts.replicas if r.alive]
    gone = [r for r in facts.replicas if r.gone]
    findings: list[Finding] = []
    if not alive:
        if facts.stored_jobs:
            findings.append(
                Finding(
                    level="warn",
                    check="replicas",
                    message=f"none is up, and the namespace has {facts.stored_jobs} job(s)",
                    advice="no replica runs the jobs: start `fleetcron run JOBS.toml` (or "
                    "check that the replicas reach this store, in this namespace)",
                )
            )
        else:
            findings.append(
                Finding(level="ok", check="replicas", message="none is up; no job is registered")
            )
    else:
        versions = sorted({r.version for r in alive})
        prints = sorted({r.jobs_fingerprint for r in alive})
        modes = sorted({r.mode for r in alive})
        listed = ", ".join(f"{r.host}:{r.pid}" for r in alive[:5])
        listed += ", …" if len(alive) > 5 else ""
        summary = f"{len(alive)} up ({listed}); version {', '.join(versions)}"
        summary += f"; mode {', '.join(modes)}"
        if len(versions) > 1:
            counts = ", ".join(f"{v} on {sum(r.version == v for r in alive)}" for v in versions)
            findings.append(
                Finding(
                    level="warn",
                    check="replicas (versions)",
                    message=f"the replicas run different fleetcron versions: {counts}",
                    advice="finish the rolling deploy; mixed versions are fine for a while, "
                    "but a newer schema may be refused by the older ones",
                )
            )
        if len(prints) > 1:
            groups = ", ".join(
                f"{fp[:8]} on "
                + ", ".join(f"{r.host}:{r.pid}" for r in alive if r.jobs_fingerprint == fp)
                for fp in prints
            )
            findings.append(
                Finding(
                    level="warn",
                    check="replicas (jobs)",
                    message=f"the replicas run different job definitions: {groups}",
                    advice="the definition registered last governs; replicas with another "
                    "one do not run that job: deploy one jobs file everywhere",
                )
            )
        if len(versions) == 1 and len(prints) == 1:
            findings.append(
                Finding(level="ok", check="replicas", message=f"{summary}; all run the same jobs")
            )
    if gone:
        names = ", ".join(
            f"{display_holder(r.replica_id)} ({_d(r.silent_us // 1_000_000 * 1_000_000)} ago)"
            for r in gone[:5]
        )
        findings.append(
            Finding(
                level="warn",
                check="replicas (gone)",
                message=f"{len(gone)} stopped beating without leaving: {names}",
                advice="a replica that crashed, hung or lost the store; its runs are taken "
                "over once their leases expire: look at its logs",
            )
        )
    return findings


# -- gathering ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Terms:
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


def _spec_terms(spec: JobSpec, fingerprint: bool = True) -> _Terms:
    return _Terms(
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


def _stored_terms(record: JobRecord) -> _Terms | None:
    """The definition a replica registered, or ``None`` when there is none readable."""
    try:
        definition = json.loads(record.definition or "{}")
        schedule = schedule_from_definition(definition["schedule"])
        most = definition["lock_at_most_us"]
    except (ValueError, KeyError, TypeError, ConfigurationError):
        return None
    if not isinstance(most, int):
        return None
    return _Terms(
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


def _job_facts(
    terms: _Terms,
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


def _reading(store: SyncStore, clock: Clock) -> tuple[ClockReading, int]:
    wall = clock.wall_us()
    sent = clock.monotonic_us()
    store_now = store.run(store.ops.store_now())
    trip = clock.monotonic_us() - sent
    return ClockReading(round_trip_us=trip, offset_us=store_now - (wall + trip // 2)), store_now


def _redis_facts(store: SyncStore) -> RedisFacts:
    from fleetcron.stores.redis.store import RedisStore

    assert isinstance(store, RedisStore)
    server = store.server_settings()
    return RedisFacts(
        role=server.role,
        replicas=server.replicas,
        appendonly=server.appendonly,
        appendfsync=server.appendfsync,
        save=server.save,
        maxmemory_policy=server.maxmemory_policy,
        config_error=server.config_error,
    )


def _pooling_facts(store: SyncStore) -> PoolingFacts:
    from fleetcron.stores.sql.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    probe = store.backend_pids()
    return PoolingFacts(
        first=tuple((pid.announced, pid.reported) for pid in probe.first),
        second=tuple((pid.announced, pid.reported) for pid in probe.second),
        prepares=probe.prepare_threshold is not None,
    )


def gather(
    store: SyncStore,
    *,
    kind: str,
    namespace: str,
    specs: Sequence[JobSpec] | None = None,
    jobs_file: str | None = None,
    compare_definitions: bool = True,
    clock: Clock = SYSTEM_CLOCK,
    samples: int = SAMPLES,
    history: int = HISTORY,
) -> Facts:
    """Read the facts of ``store`` (a backend of ``kind``: ``sqlite``, ``postgres`` …) for
    ``namespace``. The jobs checked are ``specs`` (a jobs file's) when given, else the
    definitions the replicas registered in the store; ``compare_definitions``: compare
    each spec's fingerprint with the registered one (only for specs loaded as a replica
    loads them). Reads only: the ledger's ``history`` newest rows per job, ``samples``
    clock readings, and on Redis and PostgreSQL the server's settings and pooling."""
    readings: list[ClockReading] = []
    now = 0
    for _ in range(max(1, samples)):
        reading, now = _reading(store, clock)
        readings.append(reading)
    version: int | None = None
    latest: int | None = None
    if isinstance(store, SqlSyncStore):
        version, latest = store.schema_version(), store.latest_version
    redis = _redis_facts(store) if kind == "redis" else None
    pooling, pooling_error = None, None
    if kind == "postgres":
        try:
            pooling = _pooling_facts(store)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            pooling_error = exc.message
    ops = store.ops
    current = version == latest
    records = store.run(ops.job_list(namespace)) if current else []
    by_name = {record.job: record for record in records}
    stored = {record.job: _stored_terms(record) for record in records}
    if specs is not None:
        checked = [_spec_terms(spec, compare_definitions) for spec in specs]
        undefined: list[str] = []
    else:
        checked = [terms for terms in stored.values() if terms is not None]
        undefined = [name for name, terms in stored.items() if terms is None]
    jobs = []
    for terms in checked:
        durations: tuple[int, ...] | None = None
        if current:
            runs = store.run(ops.run_list(namespace, terms.name, history))
            durations = tuple(
                run.finished_us - run.started_us
                for run in runs
                if run.state == "succeeded"
                and run.finished_us is not None
                and run.started_us is not None
            )
        record = by_name.get(terms.name)
        jobs.append(
            _job_facts(terms, now, durations, record.fingerprint if record is not None else None)
        )
    replicas = tuple(store.run(ops.replica_list(namespace))) if current else None
    return Facts(
        kind=kind,
        url=store.url,
        namespace=namespace,
        readings=tuple(readings),
        now_us=now,
        schema_version=version,
        latest_version=latest,
        jobs_file=jobs_file,
        jobs=tuple(jobs),
        undefined_jobs=tuple(undefined),
        stored_jobs=sum(terms is not None for terms in stored.values()) if current else None,
        replicas=replicas,
        redis=redis,
        pooling=pooling,
        pooling_error=pooling_error,
    )
