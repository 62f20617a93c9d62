"""Pings from the real command: ``fleetcron run`` with a jobs file's ``ping_url``, and
``fleetcron exec --ping-url``, against a local HTTP server that records what it gets.

Each run's pings are matched with its ledger row by the run id (``rid``); a silent
endpoint is shown not to hold up the schedule through the ledger (consecutive slots ran),
never through timings.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from e2e.helpers import Cli, Spawned, assert_clean_error, wait_for
from fleetcron.cli.exitcodes import EXIT_STORE_REFUSED
from fleetcron.models import RunRecord
from fleetcron.stores import open_store, parse_store_url
from unit.ping_server import PingServer, Received, SilentServer

pytestmark = pytest.mark.slow

SECRET = "6a0c2e55-93d1-4a8e-b7f4-5ec2e7ab1e99"
FINISHED = ("succeeded", "failed")


@pytest.fixture
def server() -> Iterator[PingServer]:
    running = PingServer()
    yield running
    running.close()


def ledger(cli: Cli, job: str) -> list[RunRecord]:
    """The job's ledger rows through the Python API (``runs --json`` shows no run id)."""
    store = open_store(parse_store_url(cli.backend))
    try:
        rows: list[RunRecord] = store.run(store.ops.run_list(cli.namespace, job, 1000))
        return rows
    finally:
        store.close()


def runs_json(cli: Cli, job: str) -> list[dict[str, object]]:
    result = cli.run("runs", job, "--json", "--limit", "1000")
    if result.returncode == EXIT_STORE_REFUSED and "no fleetcron store" in result.stderr:
        return []  # the replica has not created its store yet: `runs` never does
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def write_jobs(tmp_path: Path, jobs: dict[str, tuple[list[str], str]]) -> Path:
    """``[jobs.NAME]`` every second running ``command``, pinging ``url``."""
    path = tmp_path / "jobs.toml"
    path.write_text(
        "".join(
            f'[jobs.{name}]\nevery = "1s"\ncommand = {json.dumps(command)}\n'
            f"ping_url = {json.dumps(url)}\n"
            for name, (command, url) in jobs.items()
        )
    )
    return path


def stop(replica: Spawned) -> str:
    replica.proc.send_signal(signal.SIGTERM)
    result = replica.wait(timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def pings_of(received: list[Received], rid: str) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in received if r.rid == rid]


def test_run_pings_each_runs_start_then_its_outcome_with_the_ledgers_run_id(
    sqlite_cli: Cli, server: PingServer, tmp_path: Path
) -> None:
    check = f"/ping/{SECRET}"
    jobs = write_jobs(
        tmp_path,
        {
            "ok": (["true"], f"{server.base}{check}/ok"),
            "bad": (["sh", "-c", "echo something broke; exit 3"], f"{server.base}{check}/bad"),
        },
    )
    replica = sqlite_cli.spawn("run", str(jobs), "-v")  # -v: the DEBUG lines too

    def finishes(got: list[Received]) -> bool:
        ok = [r for r in got if r.path == f"{check}/ok"]
        bad = [r for r in got if r.path == f"{check}/bad/3"]
        return len(ok) >= 2 and len(bad) >= 2

    server.wait_for(finishes, timeout=30, what="two finished runs of each job")
    stderr = stop(replica)

    received = server.received
    for job, finish in (("ok", ("GET", f"{check}/ok")), ("bad", ("POST", f"{check}/bad/3"))):
        rows = ledger(sqlite_cli, job)
        assert rows
        assert {row.state for row in rows} == {"succeeded" if job == "ok" else "failed"}, rows
        for row in rows:  # each run: its start, then its outcome, once each
            assert pings_of(received, row.run_id) == [("GET", f"{check}/{job}/start"), finish]
    # Nothing was pinged for a run the ledger does not have.
    known = {row.run_id for job in ("ok", "bad") for row in ledger(sqlite_cli, job)}
    assert {r.rid for r in received} == known
    failure = next(r for r in received if r.path == f"{check}/bad/3")
    assert failure.body == b"something broke\nexit status 3\n"
    assert SECRET not in stderr
    assert f"ping start sent to {server.base}/***" in stderr


def _consecutive(slots: list[int]) -> int:
    """The longest run of consecutive seconds in ``slots``."""
    best = run = 0
    previous = None
    for slot in sorted(slots):
        run = run + 1 if previous is not None and slot == previous + 1 else 1
        best = max(best, run)
        previous = slot
    return best


def test_a_silent_ping_endpoint_delays_no_run_and_is_logged(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    silent = SilentServer()
    try:
        jobs = write_jobs(tmp_path, {"tick": (["true"], f"{silent.base}/ping/{SECRET}")})
        replica = sqlite_cli.spawn("run", str(jobs))

        def succeeded_slots() -> list[int]:
            return [
                round(datetime.fromisoformat(str(row["slot"])).timestamp())
                for row in runs_json(sqlite_cli, "tick")
                if row["state"] == "succeeded"
            ]

        # Pings that never get an answer hold up nothing: the slots keep running on time.
        wait_for(
            lambda: _consecutive(succeeded_slots()) >= 5,
            timeout=30,
            what="five consecutive slots to succeed",
        )
        # The pings still pending at the shutdown are dropped after a bounded wait, said
        # once. (Giving a ping up after its tries is tests/unit/test_pings.py's: the
        # default policy would hold this test for 3 tries of 10 s.)
        stderr = stop(replica)
    finally:
        silent.close()
    assert f"to {silent.base}/*** dropped: not sent within 5s of the shutdown" in stderr
    assert SECRET not in stderr
    states = {str(row["state"]) for row in runs_json(sqlite_cli, "tick")}
    assert states <= {"succeeded", "skipped"}, states


def test_exec_pings_start_then_success_with_its_run_id(
    sqlite_cli: Cli, server: PingServer, tmp_path: Path
) -> None:
    seen = tmp_path / "run_id"
    url = f"{server.base}/ping/{SECRET}"
    result = sqlite_cli.run(
        "exec", "report", "--ping-url", url, "--", "sh", "-c", f'echo "$FLEETCRON_RUN_ID" > {seen}'
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rid = seen.read_text().strip()
    # exec waits (a bounded time) for its pings before it exits.
    assert pings_of(server.received, rid) == [
        ("GET", f"/ping/{SECRET}/start"),
        ("GET", f"/ping/{SECRET}"),
    ]
    assert len(server.received) == 2


def test_exec_schedule_pings_the_exit_status_with_the_ledgers_run_id(
    sqlite_cli: Cli, server: PingServer
) -> None:
    url = f"{server.base}/ping/{SECRET}"
    argv = ("exec", "report", "--schedule", "* * * * *", "--ping-url", url)
    result = sqlite_cli.run(*argv, "--", "sh", "-c", "exit 3")
    assert result.returncode == 3, result.stderr
    (row,) = ledger(sqlite_cli, "report")
    assert (row.state, row.exit_code) == ("failed", 3)
    assert pings_of(server.received, row.run_id) == [
        ("GET", f"/ping/{SECRET}/start"),
        ("POST", f"/ping/{SECRET}/3"),
    ]
    assert server.received[-1].body == b"exit status 3\n"
    # A skipped duplicate trigger of the slot pings nothing: the run that won did.
    again = sqlite_cli.run(*argv, "--skipped-exit-code", "9", "--", "true")
    if again.returncode == 9:  # still the same minute
        assert len(server.received) == 2


def test_exec_with_a_silent_ping_endpoint_still_exits_with_the_commands_status(
    sqlite_cli: Cli,
) -> None:
    silent = SilentServer()
    try:
        url = f"{silent.base}/ping/{SECRET}"
        result = sqlite_cli.run("exec", "report", "--ping-url", url, "--", "sh", "-c", "exit 4")
    finally:
        silent.close()
    assert result.returncode == 4
    assert f"report: 2 ping(s) to {silent.base}/*** dropped: not sent within 5s" in result.stderr
    assert SECRET not in result.stderr


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"ftp://hc-ping.com/{SECRET}", "is not an http(s) URL"),
        (f"https:///{SECRET}", "has no host"),
        (f"https://hc-ping.com/{SECRET} x", "whitespace"),
    ],
)
def test_exec_refuses_a_bad_ping_url_before_the_store_is_touched(
    sqlite_cli: Cli, url: str, problem: str
) -> None:
    db = Path(sqlite_cli.backend.removeprefix("sqlite:///"))
    result = sqlite_cli.run("exec", "job", "--ping-url", url, "--", "true")
    assert_clean_error(result, 2, "--ping-url: ", problem)
    assert SECRET not in result.stderr
    assert not db.exists()


def test_run_refuses_a_bad_ping_url_in_the_jobs_file(sqlite_cli: Cli, tmp_path: Path) -> None:
    db = Path(sqlite_cli.backend.removeprefix("sqlite:///"))
    jobs = write_jobs(tmp_path, {"tick": (["true"], f"https://hc-ping.com/{SECRET} ")})
    result = sqlite_cli.run("run", str(jobs))
    assert_clean_error(result, 2, "job 'tick': key 'ping_url'", "whitespace")
    assert SECRET not in result.stderr
    assert not db.exists()
