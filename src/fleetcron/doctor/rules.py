"""The doctor's rules over :class:`~fleetcron.doctor.facts.Facts`: no I/O, so each one
is exercised with hand-made facts. :func:`diagnose` gives every finding in the order of
the checks: store, schema, clock, namespace, the backend's own, jobs, replicas."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.doctor.facts import Facts
from fleetcron.doctor.findings import CLOCK_FAIL_US, CLOCK_WARN_US, ROUND_TRIP_WARN_US, Finding
from fleetcron.doctor.findings import duration_text as _d
from fleetcron.doctor.jobs import job_facts, job_findings, spec_terms
from fleetcron.errors import StoreMissing
from fleetcron.jobspec import JobSpec
from fleetcron.models import display_holder

__all__ = ["diagnose", "missing_store"]


def diagnose(facts: Facts) -> list[Finding]:
    """The findings, in the order of the checks: store, schema, clock, namespace, backend
    specifics, jobs, replicas."""
    findings = [
        _store(facts),
        *_schema(facts),
        _clock(facts),
        _namespace(facts),
        *(finding for backend in facts.backend for finding in backend.findings()),
    ]
    for job in facts.jobs:
        findings += job_findings(job)
    findings += [
        Finding(
            level="ok",
            check=f"job {name}",
            message="no definition in the store (no replica has registered it yet, as a "
            "job paused ahead of its deploy; or run by an older `fleetcron exec --schedule`, "
            "or registered by another version): its schedule and terms are not checked",
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
    jobs = [job_facts(spec_terms(spec, False), now, None, None) for spec in specs]
    return [store, *(finding for job in jobs for finding in job_findings(job))]


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
