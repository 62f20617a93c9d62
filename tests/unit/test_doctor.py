"""``fleetcron doctor``'s rules, each judged from hand-made facts (no store), and the
gathering of those facts from the in-memory store with injected clocks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fleetcron.cli.doctor_cmd import load_jobs, render
from fleetcron.doctor import (
    ClockReading,
    DstEffect,
    Facts,
    Finding,
    JobFacts,
    definition_failures,
    diagnose,
    dst_effects,
    gather,
)
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec
from fleetcron.models import ReplicaInfo, ReplicaRecord, RunOutcome, SlotClaim
from fleetcron.schedules import AtSchedule, CronSchedule, EverySchedule, Schedule, iso_utc
from fleetcron.stores.redis.doctor import RedisFacts
from fleetcron.stores.sql.pooling import PoolingFacts, PoolingUnknown, pooling_mode
from fleetcron.testing import FakeClock, MemoryStore

S = 1_000_000
MINUTE = 60 * S
NOW = 1_790_000_000 * S  # 2026-09-21T14:13:20Z
FAST = ClockReading(round_trip_us=300, offset_us=0)


def facts(**changes: object) -> Facts:
    """A healthy PostgreSQL deployment, but for ``changes``."""
    base = Facts(
        kind="postgres",
        url="postgresql://app@db/app",
        namespace="prod",
        readings=(FAST,) * 5,
        now_us=NOW,
        schema_version=7,
        latest_version=7,
        stored_jobs=0,
        replicas=(),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def job(**changes: object) -> JobFacts:
    """A job every 5 minutes with the default terms, but for ``changes``."""
    base = JobFacts(
        name="report",
        schedule="every 5m",
        next_slot_us=NOW + MINUTE,
        min_interval_us=5 * MINUTE,
        lock_at_most_us=10 * MINUTE,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def replica(**changes: object) -> ReplicaRecord:
    base = ReplicaRecord(
        namespace="prod",
        replica_id="web-1:42:0a1b2c3d",
        host="web-1",
        pid=42,
        version="1.2.0",
        mode="claim",
        jobs_fingerprint="a" * 32,
        started_us=NOW - 60 * MINUTE,
        last_seen_us=NOW - 5 * S,
        expires_us=NOW + 25 * S,
        now_us=NOW,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def redis(**changes: object) -> RedisFacts:
    base = RedisFacts(
        role="master",
        replicas=0,
        appendonly="yes",
        appendfsync="everysec",
        save="3600 1",
        maxmemory_policy="noeviction",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def found(findings: list[Finding], check: str) -> list[Finding]:
    return [finding for finding in findings if finding.check == check]


def one(findings: list[Finding], check: str) -> Finding:
    (finding,) = found(findings, check)
    return finding


def job_findings(subject: JobFacts, aspect: str) -> list[Finding]:
    return found(diagnose(facts(jobs=(subject,))), f"job {subject.name} ({aspect})")


# -- store, schema, clock, namespace -------------------------------------------------------


def test_a_store_answering_fast_is_ok_with_its_kind_redacted_url_and_median_round_trip() -> None:
    readings = tuple(ClockReading(round_trip_us=us, offset_us=0) for us in (900, 300, 400))
    finding = one(diagnose(facts(readings=readings)), "store")
    assert finding.level == "ok"
    assert "postgres at postgresql://app@db/app" in finding.message
    assert "round trip 400us (median of 3" in finding.message


def test_a_store_slower_than_100ms_a_round_trip_is_a_warning() -> None:
    readings = (ClockReading(round_trip_us=250_000, offset_us=0),) * 3
    finding = one(diagnose(facts(readings=readings)), "store")
    assert finding.level == "warn"
    assert "round trip" in finding.advice


@pytest.mark.parametrize(
    ("version", "latest", "level", "text"),
    [
        (7, 7, "ok", "version 7, current"),
        (None, None, "ok", "keeps no schema"),
        (0, 7, "warn", "not created yet"),
        (5, 7, "warn", "version 5, older than 7"),
        (9, 7, "fail", "version 9 is newer than this fleetcron understands (7)"),
    ],
)
def test_the_schema_is_ok_when_current_a_warning_when_behind_and_a_failure_when_ahead(
    version: int | None, latest: int | None, level: str, text: str
) -> None:
    finding = one(diagnose(facts(schema_version=version, latest_version=latest)), "schema")
    assert finding.level == level
    assert text in finding.message


@pytest.mark.parametrize(
    ("offset_us", "level", "side"),
    [
        (200_000, "ok", "behind"),
        (-900_000, "ok", "ahead of"),
        (2 * S, "warn", "behind"),
        (-3 * S, "warn", "ahead of"),
        (-11 * S, "fail", "ahead of"),
        (-60 * S, "fail", "ahead of"),
        (60 * S, "warn", "behind"),  # a cron trigger from this host is late, never early
    ],
)
def test_the_clock_offset_warns_over_1s_and_fails_ahead_of_the_exec_tolerance(
    offset_us: int, level: str, side: str
) -> None:
    readings = (ClockReading(round_trip_us=2_000, offset_us=offset_us),)
    finding = one(diagnose(facts(readings=readings)), "clock")
    assert finding.level == level
    assert side in finding.message
    if level == "fail":
        assert "exec --schedule" in finding.advice
        assert "10s" in finding.advice
    if level != "ok":
        assert "never lets a slot run twice" in finding.advice


def test_the_clock_offset_is_read_from_the_shortest_round_trip_and_judged_net_of_its_error() -> (
    None
):
    readings = (
        ClockReading(round_trip_us=3 * S, offset_us=-5 * S),  # a slow reading: ±1.5s
        ClockReading(round_trip_us=2 * S, offset_us=-1_800_000),  # ±1s: 0.8s for certain
    )
    finding = one(diagnose(facts(readings=readings)), "clock")
    assert finding.level == "ok"
    assert "1.8s ahead of the store's (±1s)" in finding.message


def test_the_namespace_is_shown_with_the_jobs_registered_in_it() -> None:
    finding = one(diagnose(facts(stored_jobs=3, jobs_file="jobs.toml")), "namespace")
    assert finding.level == "ok"
    assert (
        finding.message
        == "'prod': 3 job(s) registered in the store; checking the jobs of jobs.toml"
    )


# -- Redis -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "level", "text"),
    [
        ({"appendfsync": "always"}, "ok", "keeps everything"),
        ({"appendfsync": "everysec"}, "ok", "all but the last second"),
        ({"appendfsync": "no"}, "warn", "the OS decides"),
        ({"appendonly": "no", "save": "3600 1"}, "warn", "RDB snapshots only"),
        ({"appendonly": "no", "save": ""}, "warn", "keeps nothing across a restart"),
        (
            {"appendonly": None, "save": None, "config_error": "unknown command"},
            "warn",
            "cannot tell",
        ),
    ],
)
def test_redis_persistence_is_ok_with_aof_and_a_warning_otherwise(
    settings: dict[str, object], level: str, text: str
) -> None:
    finding = one(
        diagnose(facts(kind="redis", backend=(redis(**settings),))), "redis (persistence)"
    )
    assert finding.level == level
    assert text in finding.message


@pytest.mark.parametrize(
    ("policy", "level"),
    [("noeviction", "ok"), ("volatile-lru", "ok"), ("allkeys-lru", "warn"), (None, "warn")],
)
def test_redis_eviction_warns_about_allkeys_policies_and_about_not_knowing(
    policy: str | None, level: str
) -> None:
    subject = redis(maxmemory_policy=policy, config_error="NOPERM" if policy is None else None)
    finding = one(
        diagnose(
            facts(
                kind="redis",
                backend=(subject,),
            )
        ),
        "redis (eviction)",
    )
    assert finding.level == level
    if policy is None:
        assert "cannot tell" in finding.message
        assert "NOPERM" in finding.message


@pytest.mark.parametrize(
    ("role", "replicas", "level"),
    [("master", 0, "ok"), ("master", 2, "warn"), ("slave", 0, "fail")],
)
def test_redis_replication_warns_about_asynchronous_replicas_and_fails_on_a_replica(
    role: str, replicas: int, level: str
) -> None:
    subject = redis(role=role, replicas=replicas)
    finding = one(
        diagnose(
            facts(
                kind="redis",
                backend=(subject,),
            )
        ),
        "redis (replication)",
    )
    assert finding.level == level


def test_other_backends_get_no_redis_findings() -> None:
    assert not [f for f in diagnose(facts()) if f.check.startswith("redis")]


# -- PostgreSQL behind a pooler ------------------------------------------------------------


DIRECT = PoolingFacts(first=((10, 10), (10, 10)), second=((11, 11), (11, 11)))
SHARED = PoolingFacts(first=((-5, 10), (-5, 10)), second=((7, 10), (7, 10)))
MOVING = PoolingFacts(first=((-5, 10), (-5, 12)), second=((7, 11), (7, 11)))
SESSION = PoolingFacts(first=((-5, 10), (-5, 10)), second=((7, 11), (7, 11)))


@pytest.mark.parametrize(
    ("probe", "mode"),
    [(DIRECT, "none"), (SHARED, "transaction"), (MOVING, "transaction"), (SESSION, "unknown")],
)
def test_pooling_mode_is_told_from_announced_and_reported_backend_pids(
    probe: PoolingFacts, mode: str
) -> None:
    assert pooling_mode(probe) == mode


@pytest.mark.parametrize(
    ("probe", "level", "text"),
    [
        (DIRECT, "ok", "none"),
        (SESSION, "ok", "not seen to pool per transaction"),
        (SHARED, "ok", "transaction pooling"),
        (dataclasses.replace(SHARED, prepares=True), "warn", "transaction pooling"),
    ],
)
def test_transaction_pooling_is_reported_and_warned_about_only_with_prepared_statements(
    probe: PoolingFacts, level: str, text: str
) -> None:
    finding = one(diagnose(facts(backend=(probe,))), "postgres (pooler)")
    assert finding.level == level
    assert text in finding.message
    if probe is not DIRECT:
        assert "fleetcron works behind it" in finding.advice
        assert "advisory locks" in finding.advice
    if level == "warn":
        assert "max_prepared_statements" in finding.advice
        assert "prepared_statements=off" in finding.advice


def test_a_pooling_probe_that_could_not_run_says_it_cannot_tell() -> None:
    finding = one(
        diagnose(facts(backend=(PoolingUnknown("too many clients"),))), "postgres (pooler)"
    )
    assert finding.level == "warn"
    assert "cannot tell: too many clients" in finding.message


# -- jobs ----------------------------------------------------------------------------------


def test_a_schedule_with_a_next_slot_is_ok() -> None:
    (finding,) = job_findings(job(), "schedule")
    assert finding.level == "ok"
    assert finding.message == "every 5m: next slot 2026-09-21T14:14:20Z"


def test_a_cron_schedule_that_never_fires_fails() -> None:
    never = job(schedule="cron '0 0 29 2 1' in UTC", next_slot_us=None, min_interval_us=None)
    (finding,) = job_findings(never, "schedule")
    assert finding.level == "fail"
    assert "never fires" in finding.message


def test_a_moment_in_the_past_warns_unless_the_ledger_shows_it_ran() -> None:
    past = job(schedule="once at 2026-01-01T00:00:00Z", one_off=True, next_slot_us=None)
    (unrun,) = job_findings(dataclasses.replace(past, durations_us=()), "schedule")
    (ran,) = job_findings(dataclasses.replace(past, durations_us=(S,)), "schedule")
    assert (unrun.level, ran.level) == ("warn", "ok")
    assert "in the past" in unrun.message


def test_slots_moved_by_daylight_saving_are_a_warning_naming_the_first_and_how_to_see_all() -> None:
    effects = (
        DstEffect(slot_us=NOW, kind="gap-shifted", note="DST gap 02:00–03:00: runs at 03:00"),
        DstEffect(slot_us=NOW + 1, kind="repeat-once", note="02:30 occurs twice; runs once"),
    )
    berlin = job(
        schedule="cron '30 2 * * *' in Europe/Berlin",
        expression="30 2 * * *",
        timezone="Europe/Berlin",
        dst_effects=effects,
    )
    (finding,) = job_findings(berlin, "daylight saving")
    assert finding.level == "warn"
    assert "runs at 03:00 (and 1 more slot(s)" in finding.message
    assert "fleetcron next '30 2 * * *' --timezone Europe/Berlin" in finding.advice
    assert not job_findings(job(), "daylight saving")


@pytest.mark.parametrize(
    ("least", "level", "text"),
    [
        (MINUTE, "ok", "1m, shorter than the shortest interval 5m"),
        (5 * MINUTE, "fail", "5m is not shorter than the shortest interval of the schedule, 5m"),
        (11 * MINUTE, "fail", "11m is longer than lock_at_most 10m"),
    ],
)
def test_lock_at_least_fails_when_it_would_block_the_next_slot(
    least: int, level: str, text: str
) -> None:
    (finding,) = job_findings(job(lock_at_least_us=least), "lock_at_least")
    assert finding.level == level
    assert finding.message == text
    if level == "fail":
        assert "`fleetcron run` refuses" in finding.advice


def test_no_lock_at_least_is_nothing_to_check() -> None:
    assert not job_findings(job(), "lock_at_least")


@pytest.mark.parametrize(("jitter", "level"), [(20 * S, "ok"), (5 * MINUTE, "fail")])
def test_jitter_fails_when_not_shorter_than_the_interval(jitter: int, level: str) -> None:
    (finding,) = job_findings(job(jitter_us=jitter), "jitter")
    assert finding.level == level


@pytest.mark.parametrize(
    ("longest", "keepalive", "level"),
    [
        (MINUTE, False, "ok"),
        (9 * MINUTE, False, "warn"),  # 90 % of lock_at_most
        (10 * MINUTE, False, "fail"),
        (12 * MINUTE, False, "fail"),
        (9 * MINUTE, True, "ok"),  # renewed every lock_at_most / 3 while it runs
        (25 * MINUTE, True, "ok"),
    ],
)
def test_lock_at_most_is_judged_against_the_longest_successful_run_in_the_ledger(
    longest: int, keepalive: bool, level: str
) -> None:
    subject = job(durations_us=(S, longest, 2 * S), keepalive=keepalive)
    (finding,) = job_findings(subject, "lock_at_most")
    assert finding.level == level
    assert f"the longest of the last 3 successful run(s) took {longest // MINUTE}m" in (
        finding.message
    )
    if keepalive and longest > 10 * MINUTE:
        assert "renewed while it runs" in finding.message


def test_lock_at_most_without_successful_runs_is_ok_and_without_a_ledger_unchecked() -> None:
    (finding,) = job_findings(job(durations_us=()), "lock_at_most")
    assert finding.level == "ok"
    assert "no successful run" in finding.message
    assert not job_findings(job(durations_us=None), "lock_at_most")


@pytest.mark.parametrize(("timeout", "level"), [(5 * MINUTE, "ok"), (10 * MINUTE, "fail")])
def test_a_timeout_not_shorter_than_lock_at_most_fails_without_keepalive(
    timeout: int, level: str
) -> None:
    (finding,) = job_findings(job(timeout_us=timeout, keepalive=False), "timeout")
    assert finding.level == level
    assert not job_findings(job(timeout_us=timeout, keepalive=True), "timeout")


@pytest.mark.parametrize(("grace", "level"), [(MINUTE, "ok"), (20 * S, "warn"), (10 * S, "warn")])
def test_a_grace_not_longer_than_the_jitter_warns_of_false_overdue_alerts(
    grace: int, level: str
) -> None:
    (finding,) = job_findings(job(grace_us=grace, jitter_us=20 * S), "grace")
    assert finding.level == level


def test_a_jobs_file_definition_other_than_the_registered_one_is_a_warning() -> None:
    (finding,) = job_findings(job(fingerprint="a" * 32, stored_fingerprint="b" * 32), "definition")
    assert finding.level == "warn"
    assert not job_findings(job(fingerprint="a" * 32, stored_fingerprint="a" * 32), "definition")
    assert not job_findings(job(fingerprint=None, stored_fingerprint="b" * 32), "definition")


def test_a_job_without_a_readable_definition_is_listed_as_not_checked() -> None:
    finding = one(diagnose(facts(undefined_jobs=("export",))), "job export")
    assert finding.level == "ok"
    assert "exec --schedule" in finding.message


# -- replicas ------------------------------------------------------------------------------


def test_no_replica_up_is_ok_for_an_empty_namespace_and_a_warning_when_it_has_jobs() -> None:
    assert one(diagnose(facts(stored_jobs=0)), "replicas").level == "ok"
    finding = one(diagnose(facts(stored_jobs=2)), "replicas")
    assert finding.level == "warn"
    assert "none is up" in finding.message


def test_replicas_of_one_version_running_the_same_jobs_are_ok() -> None:
    up = (replica(), replica(replica_id="web-2:7:00", host="web-2", pid=7))
    finding = one(diagnose(facts(replicas=up, stored_jobs=1)), "replicas")
    assert finding.level == "ok"
    assert "2 up (web-1:42, web-2:7); version 1.2.0; mode claim" in finding.message


def test_replicas_running_different_versions_or_jobs_are_warnings() -> None:
    up = (
        replica(),
        replica(replica_id="web-2:7:00", host="web-2", pid=7, version="1.3.0"),
        replica(replica_id="web-3:8:00", host="web-3", pid=8, jobs_fingerprint="b" * 32),
    )
    findings = diagnose(facts(replicas=up, stored_jobs=1))
    versions = one(findings, "replicas (versions)")
    jobs = one(findings, "replicas (jobs)")
    assert (versions.level, jobs.level) == ("warn", "warn")
    assert "1.2.0 on 2, 1.3.0 on 1" in versions.message
    assert "bbbbbbbb on web-3:8" in jobs.message
    assert not found(findings, "replicas")


def test_a_replica_that_stopped_beating_without_leaving_is_a_warning() -> None:
    gone = replica(last_seen_us=NOW - 3 * MINUTE, expires_us=NOW - 2 * MINUTE)
    finding = one(diagnose(facts(replicas=(replica(), gone), stored_jobs=1)), "replicas (gone)")
    assert finding.level == "warn"
    assert "web-1:42 (3m ago)" in finding.message


def test_replicas_are_not_judged_when_they_were_not_read() -> None:
    assert not [f for f in diagnose(facts(replicas=None)) if f.check.startswith("replicas")]


# -- derived facts ---------------------------------------------------------------------------


def test_dst_effects_of_a_fixed_time_schedule_are_the_spring_gap_and_the_autumn_repeat() -> None:
    effects = dst_effects(CronSchedule("30 2 * * *", "Europe/Berlin"), NOW)
    assert [effect.kind for effect in effects] == ["repeat-once", "gap-shifted"]
    assert iso_utc(effects[0].slot_us).startswith("2026-10-25")
    assert iso_utc(effects[1].slot_us).startswith("2027-03-28")


@pytest.mark.parametrize(
    "schedule",
    [
        CronSchedule("*/15 * * * *", "Europe/Berlin"),  # every hour alike: nothing moves
        CronSchedule("30 2 * * *", "UTC"),
        CronSchedule("30 12 * * *", "Europe/Berlin"),
        EverySchedule(MINUTE),
        AtSchedule(NOW + MINUTE),
    ],
)
def test_schedules_daylight_saving_leaves_alone_have_no_dst_effects(schedule: Schedule) -> None:
    assert dst_effects(schedule, NOW) == ()


def test_definition_failures_are_the_combinations_fleetcron_run_refuses() -> None:
    spec = job_spec("report", where="test", every="1m", command=["true"])
    blocked = dataclasses.replace(spec, lock_at_least_us=MINUTE)
    assert definition_failures(spec) == []
    (failure,) = definition_failures(blocked)
    assert failure.check == "job report (lock_at_least)"


def test_gather_reads_clock_offset_jobs_ledger_and_replicas_from_the_store() -> None:
    store_clock = FakeClock(wall_us=NOW)
    store = MemoryStore(clock=store_clock)
    spec = job_spec("report", where="test", every="1m", command=["true"])
    ops = store.ops
    store.run(ops.job_register("prod", [("report", _definition(spec), spec.fingerprint())]))
    slot = NOW - NOW % MINUTE
    claim = SlotClaim(job="report", slot_us=slot, run_id="r1")
    (answer,) = store.run(ops.run_claim("prod", [claim], "web-1:42:secret", 10 * MINUTE))
    assert answer.run is not None
    store_clock.advance(7)
    store.run(
        ops.run_finish("prod", "report", slot, answer.run.fence, RunOutcome(state="succeeded"))
    )
    info = ReplicaInfo(
        replica_id="web-1:42:0a",
        host="web-1",
        pid=42,
        version="1.2.0",
        mode="claim",
        jobs_fingerprint="a" * 32,
    )
    store.run(ops.replica_beat("prod", info, 30 * S))
    host_clock = FakeClock(wall_us=store_clock.wall_us() - 3 * S)  # 3 s behind the store

    gathered = gather(store, kind="memory", namespace="prod", clock=host_clock, samples=3)

    assert len(gathered.readings) == 3
    assert all(r.offset_us == 3 * S for r in gathered.readings)
    assert gathered.schema_version is None
    assert gathered.stored_jobs == 1
    (report,) = gathered.jobs
    assert (report.name, report.durations_us, report.min_interval_us) == (
        "report",
        (7 * S,),
        MINUTE,
    )
    assert report.next_slot_us == slot + MINUTE
    assert [r.host for r in gathered.replicas or ()] == ["web-1"]
    assert one(diagnose(gathered), "clock").level == "warn"


def test_gather_checks_the_jobs_given_and_compares_their_definition_with_the_store() -> None:
    store = MemoryStore(clock=FakeClock(wall_us=NOW))
    spec = job_spec("report", where="test", every="1m", command=["true"])
    other = job_spec("report", where="test", every="2m", command=["true"])
    store.run(store.ops.job_register("prod", [("report", _definition(other), other.fingerprint())]))

    gathered = gather(store, kind="memory", namespace="prod", specs=[spec], clock=FakeClock())

    (report,) = gathered.jobs
    assert report.min_interval_us == MINUTE
    assert report.durations_us == ()
    assert one(diagnose(gathered), "job report (definition)").level == "warn"


def _definition(spec: JobSpec) -> str:
    return json.dumps(spec.definition())


# -- the command's jobs file and output --------------------------------------------------------


def test_a_jobs_file_run_refuses_for_a_definition_failure_is_loaded_for_the_doctor(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(
        '[fleetcron]\nnamespace = "prod"\n\n'
        '[jobs.report]\nevery = "1m"\ncommand = ["true"]\nlock_at_least = "1m"\n'
    )
    checked = load_jobs(str(path))
    (spec,) = checked.specs
    assert (spec.lock_at_least_us, checked.namespace, checked.exact) == (MINUTE, "prod", False)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('every = "1m"\ncommand = ["true"]\nlock_at_least = "-1m"\n', "negative duration"),
        ('every = "1m"\ncommand = ["true"]\ncolour = "red"\n', "unknown key"),
        ('every = "1m"\ncommand = ["true"]\ntimezone = "Mars/Base"\n', "unknown time zone"),
        # The jobs are fine on their own: the refusal is the settings', not the doctor's.
        ('every = "1m"\ncommand = ["true"]\n\n[fleetcron]\nmode = "solo"\n', "key 'mode'"),
        (
            'every = "1m"\ncommand = ["true"]\nlock_at_least = "1m"\n\n'
            '[fleetcron]\nmode = "solo"\n',
            "key 'mode'",
        ),
    ],
)
def test_any_other_problem_of_a_jobs_file_is_run_s_configuration_error(
    tmp_path: Path, body: str, error: str
) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(f"[jobs.report]\n{body}")
    with pytest.raises(ConfigurationError, match=error):
        load_jobs(str(path))


def test_a_valid_jobs_file_is_loaded_exactly_as_run_loads_it(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text('[jobs.report]\nevery = "1m"\ncommand = ["true"]\n')
    assert load_jobs(str(path)).exact


def test_each_finding_is_one_line_with_its_advice_indented_below_and_a_tally_last() -> None:
    lines = render(
        [
            Finding(level="ok", check="store", message="fine"),
            Finding(level="fail", check="job x (jitter)", message="too long", advice="shorten"),
        ]
    )
    assert lines == [
        "ok    store: fine",
        "fail  job x (jitter): too long",
        "      shorten",
        "1 failed, 0 warning(s), 1 ok",
    ]
