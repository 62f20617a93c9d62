"""``fleetcron run`` on real replicas: every slot runs once, whatever happens to them.

Each job appends ``<slot> <fence> <replica pid> <job pgid> <job's clock>`` to a shared file
when it starts, so the file says which slots really ran, where and with which fence; the
ledger (``fleetcron runs --json``, cross-checked against ``run_list``) says how each slot
ended. Every expectation is derived from those two, never from timing guesses; the fixed
durations only decide how long the fleet runs.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, Spawned, wait_for
from fleetcron.stores import open_store, parse_store_url

pytestmark = pytest.mark.slow

JOB = "tick"
SECOND = 1_000_000
LEASE = "2s"
# Report at the start of the run (one write(2) of a short line to an O_APPEND file, so
# concurrent runs never interleave), then work for $2 seconds.
REPORT_THEN_WORK = (
    'echo "$FLEETCRON_SLOT $FLEETCRON_FENCE $PPID $$ $(date +%s)" >> "$1"; exec sleep "$2"'
)
WITH_FENCE = {"running", "succeeded", "failed", "cancelled", "lost"}  # claimed at some point
LEADER_SCRIPT = Path(__file__).with_name("leaderreplica.py")


# -- what ran: the shared file ----------------------------------------------------------
@dataclass(frozen=True)
class Report:
    """One line of the shared file: a run as its command saw it."""

    slot_s: int
    fence: int
    pid: int  # the replica that ran it ($PPID of the command)
    pgid: int  # the command leads its own process group
    clock_s: int  # `date +%s` inside the command: the replica's (possibly faked) clock


def _epoch_s(iso: str) -> int:
    return round(datetime.fromisoformat(iso).timestamp())


def reports(path: Path) -> list[Report]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    result = []
    for line in text.split("\n")[:-1]:  # complete lines only
        slot, fence, pid, pgid, clock = line.split()
        result.append(Report(_epoch_s(slot), int(fence), int(pid), int(pgid), int(clock)))
    return result


def next_report(path: Path, pids: Iterable[int], *, timeout: float = 15.0) -> Report:
    """The first run started from now on by one of ``pids``."""
    wanted = set(pids)
    seen = len(reports(path))

    def found() -> Report | None:
        return next((r for r in reports(path)[seen:] if r.pid in wanted), None)

    return wait_for(found, timeout=timeout, what=f"a run by one of {sorted(wanted)}")


# -- how it ended: the ledger -----------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """A ledger row, as ``fleetcron runs --json`` shows it plus the exact start time."""

    slot_s: int
    state: str
    attempt: int
    fence: int
    pid: int | None
    started_us: int | None


def _store_call(cli: Cli, call: Callable[[Any], Any]) -> Any:
    store = open_store(parse_store_url(cli.backend))
    try:
        return store.run(call(store.ops))
    finally:
        store.close()


def store_now(cli: Cli) -> int:
    """The store's clock (µs), read by this (unfaked) process."""
    return int(_store_call(cli, lambda ops: ops.store_now()))


def records(cli: Cli) -> list[Row]:
    """The ledger through the Python API (cheap enough to poll)."""
    runs = _store_call(cli, lambda ops: ops.run_list(cli.namespace, JOB, 1000))
    return [
        Row(
            slot_s=run.slot_us // SECOND,
            state=run.state,
            attempt=run.attempt,
            fence=run.fence,
            pid=int(run.holder.split(":")[-2]) if run.holder else None,
            started_us=run.started_us,
        )
        for run in runs
    ]


def ledger(cli: Cli) -> list[Row]:
    """``fleetcron runs --json --limit 1000``, checked against (and timed by) the API."""
    result = cli.run("runs", JOB, "--json", "--limit", "1000")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    exact = {row.slot_s: row for row in records(cli)}
    rows = []
    for item in shown:
        holder = item["holder"]
        row = Row(
            slot_s=_epoch_s(item["slot"]),
            state=item["state"],
            attempt=item["attempt"],
            fence=item["fence"],
            pid=int(holder.rpartition(":")[2]) if holder else None,
            started_us=None,
        )
        assert row.slot_s in exact, (item, "is not in run_list")
        assert exact[row.slot_s].started_us is not None or row.state not in WITH_FENCE
        row = Row(**{**row.__dict__, "started_us": exact[row.slot_s].started_us})
        assert row == exact[row.slot_s], "fleetcron runs --json disagrees with run_list"
        rows.append(row)
    assert len(rows) == len(exact)
    return rows


def row_at(cli: Cli, slot_s: int) -> Row | None:
    return next((row for row in records(cli) if row.slot_s == slot_s), None)


def check_each_slot_once(rows: list[Row], ran: list[Report]) -> dict[int, Row]:
    """The exactly-once rules that hold whatever happened to the replicas."""
    assert rows, "the ledger is empty"
    twice = [slot for slot, n in Counter(row.slot_s for row in rows).items() if n > 1]
    assert not twice, f"slots with more than one ledger row: {twice}"
    by_slot = {row.slot_s: row for row in rows}
    first, last = min(by_slot), max(by_slot)
    gaps = [slot for slot in range(first, last + 1) if slot not in by_slot]
    assert not gaps, f"slots between {first} and {last} with no ledger row at all: {gaps}"
    # Replicas are stopped or their dead runs recovered before this is called.
    states = Counter(row.state for row in rows)
    assert set(states) <= {"succeeded", "lost", "skipped", "missed"}, states

    claimed = sorted((row for row in rows if row.state in WITH_FENCE), key=lambda r: r.slot_s)
    fences = [(row.slot_s, row.fence) for row in claimed]
    backwards = [(a, b) for a, b in pairwise(fences) if b[1] <= a[1]]
    assert not backwards, f"fences do not increase with the slot: {backwards}"

    ran_twice = [slot for slot, n in Counter(r.slot_s for r in ran).items() if n > 1]
    assert not ran_twice, f"slots that ran more than once: {ran_twice}\n{ran}"
    for report in ran:
        row = by_slot.get(report.slot_s)
        assert row is not None, f"{report} ran with no ledger row"
        assert row.state in WITH_FENCE, (report, row)
        assert (row.fence, row.pid) == (report.fence, report.pid), (report, row)
    reported = {r.slot_s for r in ran}
    silent = [row for row in claimed if row.state == "succeeded" and row.slot_s not in reported]
    assert not silent, f"succeeded in the ledger but never started: {silent}"
    return by_slot


# -- processes ---------------------------------------------------------------------------
def write_jobs(tmp_path: Path, out: Path, *, work_s: float, overlap: str = "skip") -> Path:
    command = ["sh", "-c", REPORT_THEN_WORK, "sh", str(out), str(work_s)]
    path = tmp_path / "jobs.toml"
    path.write_text(
        f"[jobs.{JOB}]\n"
        'every = "1s"\n'
        f"command = {json.dumps(command)}\n"
        f'lock_at_most = "{LEASE}"\n'
        f'overlap = "{overlap}"\n'
    )
    return path


def kill_group(cli: Cli, pgid: int) -> None:
    cli.track_group(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the command had already ended


def terminate(replica: Spawned) -> subprocess.CompletedProcess[str]:
    """SIGTERM, then the exit a drained replica owes: 0."""
    replica.proc.send_signal(signal.SIGTERM)
    result = replica.wait(timeout=30)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    """Start Python scripts in the background; SIGKILLed at teardown."""
    started: list[Spawned] = []

    def start(*args: str, env: dict[str, str]) -> Spawned:
        n = len(started) + 1
        out, err = tmp_path / f"script-{n}.out", tmp_path / f"script-{n}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, *args],
                env=env,
                cwd=tmp_path,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        started.append(Spawned(proc, out, err))
        return started[-1]

    yield start
    for spawned in started:
        if spawned.proc.poll() is None:
            spawned.proc.kill()
        spawned.proc.wait()


# -- 1. SIGKILL and SIGSTOP in a fleet of three ----------------------------------------
@CROSS_PROCESS_BACKENDS
def test_three_replicas_run_each_slot_once_through_sigkill_and_sigstop(
    cli: Cli, tmp_path: Path
) -> None:
    """Runs take 1.5 s with ``overlap = "allow"``, so every replica is usually running
    something; the victims are picked right after they *start* a run, so the run is in
    flight when the signal lands. ``retries = 0``: a run whose holder vanished is ``lost``,
    never run again."""
    out = tmp_path / "ran"
    jobs = write_jobs(tmp_path, out, work_s=1.5, overlap="allow")
    fleet = [cli.spawn("run", str(jobs), "--shutdown-grace", "10s") for _ in range(3)]
    by_pid = {replica.pid: replica for replica in fleet}
    wait_for(lambda: len(reports(out)) >= 3, timeout=30, what="the fleet to run three slots")

    # SIGKILL a replica that has just started a run, and that run's process group.
    killed_run = next_report(out, by_pid)
    killed = by_pid[killed_run.pid]
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    for report in reports(out):
        if report.pid == killed.pid and report.slot_s >= killed_run.slot_s - 2:
            kill_group(cli, report.pgid)
    survivors = [pid for pid in by_pid if pid != killed.pid]

    # SIGSTOP another one that has just started a run, for twice the lease.
    stopped_run = next_report(out, survivors)
    stopped = by_pid[stopped_run.pid]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    resumed_at = len(reports(out))

    # The two interrupted runs end `lost` once a replica finds their lease expired.
    def ended(slot_s: int) -> Row | None:
        row = row_at(cli, slot_s)
        return row if row is not None and row.state != "running" else None

    killed_row = wait_for(lambda: ended(killed_run.slot_s), timeout=15, what="the killed run")
    stopped_row = wait_for(lambda: ended(stopped_run.slot_s), timeout=15, what="the paused run")
    wait_for(
        lambda: (
            not [r for r in records(cli) if r.state == "running" and r.slot_s <= stopped_run.slot_s]
        ),
        timeout=15,
        what="every run the killed and the paused replica had in flight to be recovered",
    )
    # The resumed replica takes part again, and the fleet keeps going for a while.
    wait_for(
        lambda: [r for r in reports(out)[resumed_at:] if r.pid == stopped.pid],
        timeout=20,
        what="the resumed replica to run a slot again",
    )
    # …and goes on: both survivors run further slots after the disturbance.
    wait_for(
        lambda: all(
            len([r for r in reports(out)[resumed_at:] if r.pid == pid]) >= 1 for pid in survivors
        ),
        timeout=30,
        what="both survivors to run another slot each",
    )
    logs = {pid: terminate(by_pid[pid]).stderr for pid in survivors}

    rows = ledger(cli)
    ran = reports(out)
    by_slot = check_each_slot_once(rows, ran)
    assert killed_row.state == "lost", killed_row
    assert (killed_row.pid, killed_row.fence) == (killed.pid, killed_run.fence)
    assert stopped_row.state == "lost", stopped_row
    assert (stopped_row.pid, stopped_row.fence) == (stopped.pid, stopped_run.fence)
    assert by_slot[stopped_run.slot_s] == stopped_row  # nothing overwrote it afterwards
    # The paused replica tried to record its outcome when it woke up, and was refused.
    refused = f"refused: fence {stopped_run.fence} is no longer current"
    assert refused in logs[stopped.pid], logs[stopped.pid][-3000:]
    # Only the two disturbed replicas lost runs; the healthy one finished all of its own.
    losers = {row.pid for row in rows if row.state == "lost"}
    assert losers <= {killed.pid, stopped.pid}, [r for r in rows if r.state == "lost"]
    # Every replica ran something, and the fleet covered the whole time it ran.
    assert {r.pid for r in ran} == set(by_pid), Counter(r.pid for r in ran)
    assert len(rows) >= 8, rows


# -- 2. a clock minutes ahead ---------------------------------------------------------------
def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        message = "libfaketime is not installed (apt-get install faketime; scripts/test does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


# Not SQLite: there the store's clock is the clock of the process using the file, so a
# replica with a fast clock *is* a store with a fast clock (the documented limit of a
# file store); the guarantee is about stores with a clock of their own.
@pytest.mark.parametrize("backend_url", ["postgres", "redis"], indirect=True)
def test_a_replica_whose_clock_runs_ahead_runs_nothing_early(cli: Cli, tmp_path: Path) -> None:
    fake = {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": "+5m",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    # libfaketime really moves the clock of a Python started like the replica.
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**cli.env, **fake},
        capture_output=True,
        text=True,
        check=True,
    )
    ahead = float(probe.stdout) - time.time()
    assert 290 < ahead < 310, f"libfaketime did not move time.time(): {ahead:+.1f}s"

    out = tmp_path / "ran"
    jobs = write_jobs(tmp_path, out, work_s=0)
    before_us = store_now(cli)
    replica = cli.spawn("run", str(jobs), "--shutdown-grace", "10s", env=fake)
    began = time.monotonic()
    wait_for(lambda: len(reports(out)) >= 2, timeout=30, what="the fast replica to run")
    time.sleep(max(0.0, 5.0 - (time.monotonic() - began)))
    terminate(replica)
    after_us = store_now(cli)

    rows = ledger(cli)
    ran = reports(out)
    check_each_slot_once(rows, ran)
    # The replica's own processes lived five minutes ahead ...
    for report in ran:
        assert 290 <= report.clock_s - report.slot_s <= 310, report
    # ... yet it claimed no slot before the store's clock reached it.
    early = [row for row in rows if row.slot_s * SECOND > after_us]
    assert not early, f"slots later than the store's clock at the end ({after_us}): {early}"
    for row in rows:
        assert row.slot_s * SECOND >= before_us - SECOND, (row, before_us)
        if row.state in WITH_FENCE:
            assert row.started_us is not None, row
            assert row.started_us >= row.slot_s * SECOND, row


@pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)
def test_a_replica_whose_clock_races_ahead_marks_no_future_slot(cli: Cli, tmp_path: Path) -> None:
    """A clock that runs ahead *after* the replica measured its offset to the store (here:
    ten times too fast, a deterministic stand-in for an NTP step or a VM resume) must not
    cost the fleet any slot: the healthy replica beside it runs every slot, and no row
    exists for a slot the store's clock has not reached."""
    fast = {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": "+0 x10",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    # (A busy wait: libfaketime also scales sleeps, and refuses Python's time.sleep.)
    measure = (
        "import time\n"
        "m, a = time.monotonic(), time.time()\n"
        "while time.monotonic() - m < 0.5: pass\n"
        "print(time.time() - a)"
    )
    probe = subprocess.run(
        [sys.executable, "-c", measure],
        env={**cli.env, **fast},
        capture_output=True,
        text=True,
        check=True,
    )
    assert 3.0 < float(probe.stdout) < 8.0, f"libfaketime did not speed time.time() up: {probe}"

    out = tmp_path / "ran"
    jobs = write_jobs(tmp_path, out, work_s=0)
    before_us = store_now(cli)
    racing = cli.spawn("run", str(jobs), "--shutdown-grace", "10s", env=fast)
    healthy = cli.spawn("run", str(jobs), "--shutdown-grace", "10s")
    time.sleep(7.0)
    terminate(racing)
    terminate(healthy)
    after_us = store_now(cli)

    rows = ledger(cli)
    future = [row for row in rows if row.slot_s * SECOND > after_us]
    assert not future, (
        f"{len(future)} rows for slots the store's clock had not reached "
        f"({Counter(row.state for row in future)}), up to "
        f"{(max(row.slot_s for row in future) * SECOND - after_us) / 1e6:.0f}s ahead"
    )
    check_each_slot_once(rows, reports(out))
    # Every slot of the last few seconds (when both replicas were surely up) ran.
    recent = [row for row in rows if before_us + 3 * SECOND <= row.slot_s * SECOND < after_us]
    assert recent
    assert all(row.state == "succeeded" for row in recent), Counter(row.state for row in recent)


# -- 3. leader fail-over --------------------------------------------------------------------
@pytest.mark.parametrize("backend_url", ["postgres", "mysql"], indirect=True)
def test_leader_mode_fails_over_within_the_leader_lease(
    cli: Cli, tmp_path: Path, scripts: Callable[..., Spawned]
) -> None:
    """``fleetcron run --mode leader`` cannot shorten the leader lease (15 s), so this
    runs two leader-mode replicas through the Python API with a 2 s lease.

    ``overlap = "allow"``: with an exclusive job, a run the leader was killed in would keep
    the *job's* lease (``lock_at_most``) after the leader lease expired, and the standby
    would record the slots in between ``skipped`` — right, but not what is measured here."""
    ttl_s = 2.0
    out = tmp_path / "ran"
    jobs = write_jobs(tmp_path, out, work_s=0, overlap="allow")
    argv = (str(LEADER_SCRIPT), cli.backend, cli.namespace, str(jobs), str(ttl_s))
    pair = [scripts(*argv, env=cli.env) for _ in range(2)]
    by_pid = {replica.pid: replica for replica in pair}
    wait_for(lambda: len(reports(out)) >= 2, timeout=30, what="the leader to run")
    leader_pid = reports(out)[-1].pid
    last_old = next_report(out, [leader_pid])
    assert {r.pid for r in reports(out)} == {leader_pid}, "two replicas ran slots"

    os.kill(leader_pid, signal.SIGKILL)
    by_pid[leader_pid].wait()
    kill_group(cli, last_old.pgid)
    (standby,) = (pid for pid in by_pid if pid != leader_pid)
    wait_for(
        lambda: len([r for r in reports(out) if r.pid == standby]) >= 3,
        timeout=20,
        what="the standby to take over",
    )
    wait_for(  # a run the leader was killed in is recovered (lost) once its lease expires
        lambda: (
            not [r for r in records(cli) if r.state == "running" and r.slot_s <= last_old.slot_s]
        ),
        timeout=15,
        what="the killed leader's runs to be recovered",
    )
    terminate(by_pid[standby])

    rows = ledger(cli)
    ran = reports(out)
    check_each_slot_once(rows, ran)
    assert {row.pid for row in rows if row.pid is not None} == {leader_pid, standby}
    old = max(r.started_us or 0 for r in rows if r.pid == leader_pid)
    new = min(r.started_us or 0 for r in rows if r.pid == standby)
    assert old < new, (old, new)
    assert new - old <= ttl_s * SECOND + SECOND, (
        f"the standby's first run started {(new - old) / 1e6:.2f}s after the killed leader's "
        f"last one (leader lease {ttl_s}s)"
    )
    # Runs after the kill belong to the standby only: the dead leader ran nothing more.
    assert all(r.slot_s <= last_old.slot_s for r in ran if r.pid == leader_pid)
