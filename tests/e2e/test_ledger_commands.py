"""``runs``, ``pause``, ``resume``, ``trigger`` and ``backfill`` against a running replica."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from e2e.helpers import Cli, assert_clean_error, wait_for
from fleetcron.cli.exitcodes import EXIT_STORE_REFUSED

JOBS = """
[fleetcron]
namespace = "{namespace}"

[jobs.beat]
every = "1s"
command = ["sh", "-c", "echo \\"$FLEETCRON_SLOT\\" >> {out}"]
"""


def done(cli: Cli, trigger: str) -> int:
    """How many runs of ``beat`` started by ``trigger`` succeeded."""
    return sum(r["trigger"] == trigger and r["state"] == "succeeded" for r in runs(cli))


def runs(cli: Cli) -> list[dict[str, Any]]:
    result = cli.run("runs", "beat", "--json", "--limit", "500")
    if result.returncode == EXIT_STORE_REFUSED and "no fleetcron store" in result.stderr:
        return []  # the replica has not created its store yet: `runs` never does
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_pause_trigger_resume_and_backfill_steer_every_replica(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "beats.txt"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOBS.format(namespace=sqlite_cli.namespace, out=out))
    started = datetime.now(UTC).replace(microsecond=0)
    replica = sqlite_cli.spawn("run", str(jobs))

    assert wait_for(lambda: any(r["state"] == "succeeded" for r in runs(sqlite_cli)), timeout=15)
    assert sqlite_cli.run("pause", "beat").stdout.strip() == "beat: paused"
    assert wait_for(
        lambda: sum(r["error"] == "job paused" for r in runs(sqlite_cli)) >= 2, timeout=15
    ), "slots due while paused are recorded as skipped"

    trigger = sqlite_cli.run("trigger", "beat")
    assert trigger.returncode == 0, trigger.stderr
    assert wait_for(
        lambda: any(
            r["trigger"] == "manual" and r["state"] == "succeeded" for r in runs(sqlite_cli)
        ),
        timeout=15,
    ), "a trigger runs even while paused"

    assert sqlite_cli.run("resume", "beat").returncode == 0
    resumed = len(
        [r for r in runs(sqlite_cli) if r["trigger"] == "schedule" and r["state"] == "succeeded"]
    )
    assert wait_for(
        lambda: (
            len(
                [
                    r
                    for r in runs(sqlite_cli)
                    if r["state"] == "succeeded" and r["trigger"] == "schedule"
                ]
            )
            > resumed
        ),
        timeout=15,
    )

    start = (started - timedelta(seconds=8)).isoformat()
    end = (started - timedelta(seconds=4)).isoformat()
    backfill = sqlite_cli.run("backfill", "beat", "--from", start, "--to", end)
    assert backfill.returncode == 0, backfill.stderr
    assert "queued 5 of 5 slot(s)" in backfill.stdout
    assert wait_for(
        lambda: (
            len(
                [
                    r
                    for r in runs(sqlite_cli)
                    if r["trigger"] == "backfill" and r["state"] == "succeeded"
                ]
            )
            == 5
        ),
        timeout=20,
    )

    replica.proc.send_signal(signal.SIGTERM)
    assert replica.wait(timeout=40).returncode == 0
    slots = out.read_text().splitlines()
    assert len(slots) == len(set(slots))  # every slot, whatever started it, ran once


LATER = """
[jobs.later]
every = "1s"
command = ["sh", "-c", "echo \\"$FLEETCRON_SLOT\\" >> {out}"]
"""


def test_a_job_paused_ahead_of_its_deploy_starts_paused(sqlite_cli: Cli, tmp_path: Path) -> None:
    ns = sqlite_cli.namespace
    assert sqlite_cli.run("migrate").returncode == 0
    paused = sqlite_cli.run("pause", "later")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.splitlines() == [
        "later: paused",
        f"note: no job named later is defined yet in namespace {ns!r}; it will start paused "
        "when a replica registers it",
    ]
    listed = json.loads(sqlite_cli.run("status", "--json", "later").stdout)["jobs"]
    assert [(j["job"], j["state"], j["paused"]) for j in listed] == [("later", "paused", True)]
    assert listed[0]["reasons"][0].startswith("paused ahead of its registration")
    assert sqlite_cli.run("status", "--check").returncode == 0, "paused ahead is not unhealthy"

    out = tmp_path / "later.txt"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(LATER.format(out=out))
    replica = sqlite_cli.spawn("run", str(jobs))  # the deploy registers the job

    def rows() -> list[dict[str, Any]]:
        result = sqlite_cli.run("runs", "later", "--json")
        listed: list[dict[str, Any]] = json.loads(result.stdout or "[]")
        return listed

    assert wait_for(lambda: sum(r["error"] == "job paused" for r in rows()) >= 2, timeout=20)
    assert not out.exists(), "no slot ran while paused"
    assert all(r["state"] == "skipped" for r in rows())

    resumed = sqlite_cli.run("resume", "later")
    assert resumed.stdout.strip() == "later: resumed", resumed.stderr
    assert wait_for(lambda: any(r["state"] == "succeeded" for r in rows()), timeout=20)
    replica.proc.send_signal(signal.SIGTERM)
    assert replica.wait(timeout=40).returncode == 0


def test_resuming_a_pause_recorded_ahead_takes_it_back(sqlite_cli: Cli) -> None:
    ns = sqlite_cli.namespace
    assert sqlite_cli.run("migrate").returncode == 0
    assert sqlite_cli.run("pause", "typo").returncode == 0

    resumed = sqlite_cli.run("resume", "typo")

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == [
        "typo: resumed",
        f"note: no job named typo is defined in namespace {ns!r}; the pause recorded ahead of "
        "it is removed",
    ]
    assert_clean_error(sqlite_cli.run("status", "typo"), 2, "no job named typo")
    assert_clean_error(sqlite_cli.run("resume", "typo"), 2, "no job 'typo'")


def test_commands_on_unknown_jobs_and_bad_ranges_are_clear_errors(sqlite_cli: Cli) -> None:
    assert sqlite_cli.run("migrate").returncode == 0
    expected = (
        f"no runs in namespace {sqlite_cli.namespace!r} (no namespace of this store has jobs "
        "yet: replicas register theirs when they start)"
    )
    assert sqlite_cli.run("runs").stdout.strip() == expected
    for argv, message in [
        (("resume", "ghost"), "no job 'ghost'"),
        (("trigger", "ghost"), "no job 'ghost'"),
        (("backfill", "ghost", "--from", "2026-01-01", "--to", "2026-01-02"), "no registered job"),
        (("backfill", "ghost", "--from", "yesterday", "--to", "2026-01-02"), "--from"),
        (("backfill", "ghost", "--from", "2026-01-02", "--to", "2026-01-01"), "before --from"),
        (("runs", "--limit", "0"), "--limit"),
        # No job can have a name longer than its lease name allows: said as such.
        (("trigger", "j" * 187), "job name is 187 characters long; the maximum is 186"),
        (("pause", "j" * 187), "the maximum is 186"),
        (("status", "j" * 187), "the maximum is 186"),
    ]:
        assert_clean_error(sqlite_cli.run(*argv), 2, message)


def test_runs_in_an_empty_namespace_names_the_namespaces_holding_jobs_with_their_counts(
    sqlite_cli: Cli,
) -> None:
    for job in ("beat", "sweep"):
        registered = sqlite_cli.run("exec", job, "--schedule", "0 3 * * *", "--", "true")
        assert registered.returncode == 0, registered.stderr

    # No --namespace, as after the README's example whose jobs file sets one.
    result = sqlite_cli.run("--backend", sqlite_cli.backend, "runs", flags=False)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"no runs in namespace 'default' (namespaces with jobs: {sqlite_cli.namespace!r} "
        "(2 jobs); --namespace or $FLEETCRON_NAMESPACE chooses one)"
    )
    # A namespace chosen by hand that is one character off: the close one is named.
    typo = sqlite_cli.run(
        "--backend",
        sqlite_cli.backend,
        "--namespace",
        sqlite_cli.namespace[:-1],
        "runs",
        flags=False,
    )
    assert f"did you mean {sqlite_cli.namespace!r}?" in typo.stdout


def test_a_replica_of_many_jobs_says_how_its_start_goes_then_that_it_runs(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.toml"
    many = 1_001  # a few jobs start with one line; more say each step
    jobs.write_text(
        f'[fleetcron]\nnamespace = "{sqlite_cli.namespace}"\n'
        + "".join(
            f'[jobs.j{i:04d}]\nschedule = "0 0 1 1 *"\ncommand = ["true"]\n' for i in range(many)
        )
    )
    replica = sqlite_cli.spawn("run", str(jobs))
    assert wait_for(lambda: "replica " in replica.stderr_so_far(), timeout=60)
    replica.proc.send_signal(signal.SIGTERM)
    finished = replica.wait(timeout=40)
    assert finished.returncode == 0, finished.stderr
    read, registered, started = finished.stderr.splitlines()[:3]
    assert f"read 1,001 job(s) of {jobs} in " in read
    assert read.endswith(" s; registering them")
    assert "registered 1,001 job(s) in " in registered
    assert registered.endswith(" s: 1,001 new, 0 changed, 0 unchanged")
    assert f"1001 job(s) and 0 queue(s) of {jobs} in namespace" in started


def test_a_replica_says_at_start_what_it_runs_where_and_as_whom(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOBS.format(namespace=sqlite_cli.namespace, out=tmp_path / "beats.txt"))
    replica = sqlite_cli.spawn("run", str(jobs))
    assert wait_for(lambda: any(r["state"] == "succeeded" for r in runs(sqlite_cli)), timeout=15)
    replica.proc.send_signal(signal.SIGTERM)
    finished = replica.wait(timeout=40)

    assert finished.returncode == 0, finished.stderr
    first = finished.stderr.splitlines()[0]
    assert f"1 job(s) and 0 queue(s) of {jobs} in namespace {sqlite_cli.namespace!r}" in first
    assert f"on {sqlite_cli.backend}, claim mode, replica " in first
    holders = {r["holder"] for r in runs(sqlite_cli)}  # host:pid, as runs shows it
    assert any(first.endswith(f"replica {holder}") for holder in holders), (first, holders)
