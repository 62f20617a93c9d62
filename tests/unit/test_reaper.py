"""The reaper process (:mod:`fleetcron.reaper_process`), driven through its pipe as a supervisor
drives it, and its supervisor's side (:class:`fleetcron.reaper.Reaper`).

The runs are real processes in sessions of their own that write a heartbeat (their
``CLOCK_MONOTONIC``, µs — the clock the stop points are on) every 10 ms, so "gone by its
deadline" is read from their last heartbeat, not from a timing guess. Every wait is for a
condition, with a generous bound; none is a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleetcron import reaper_process
from fleetcron.job_options import job_spec
from fleetcron.reaper import Reaper, reaper_argv
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore

pytestmark = pytest.mark.skipif(not Reaper.supported(), reason="the reaper needs Linux's /proc")

MS = 1_000
# The reaper, like the supervisor, acts at a stop point plus its scheduling latency; the
# lease's safety margin (a tenth of it, up to 2 s) is what absorbs that in production.
LATENCY_US = 250 * MS

# A run: beats its monotonic clock into argv[1] every 10 ms; with argv[2] == "stubborn"
# it notes a SIGTERM and carries on; with argv[3], it first starts a stubborn member of
# its own group that beats into argv[3] (and writes its pid into argv[3].pid).
BEATER = r"""
import os, signal, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
def note(line):
    with open(out, "a") as f:
        f.write(line + "\n")
if mode == "stubborn":
    signal.signal(signal.SIGTERM, lambda *_: note("term %d" % (time.monotonic_ns() // 1000)))
if len(sys.argv) > 3:
    member = subprocess.Popen([sys.executable, "-c", sys.argv[4], sys.argv[3], "stubborn"])
    with open(sys.argv[3] + ".pid", "w") as f:
        f.write(str(member.pid))
while True:
    note(str(time.monotonic_ns() // 1000))
    time.sleep(0.01)
"""


def now_us() -> int:
    return time.monotonic_ns() // 1_000


def wait_for(condition: object, *, timeout: float = 30.0, what: str = "") -> None:
    assert callable(condition)
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is gone: nothing of it runs any more)."""
    stat = reaper_process.proc_stat(pid)
    return stat is not None and stat.state != "Z"


def beats(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split("\n")[:-1] if line.isdigit()]


def terms(path: Path) -> list[int]:
    return [
        int(line.split()[1]) for line in path.read_text().split("\n") if line.startswith("term")
    ]


class Run:
    """One run's process, the leader of its own session."""

    def __init__(
        self, tmp: Path, name: str, *, stubborn: bool = False, member: bool = False
    ) -> None:
        self.id = str(uuid.uuid4())
        self.beats = tmp / f"{name}.beats"
        self.member_beats = tmp / f"{name}.member"
        argv = [sys.executable, "-c", BEATER, str(self.beats), "stubborn" if stubborn else "-"]
        if member:
            argv += [str(self.member_beats), BEATER]
        self.proc = subprocess.Popen(
            argv,
            start_new_session=True,
            env={**os.environ, "FLEETCRON_RUN_ID": self.id},
        )
        self.pid = self.proc.pid
        wait_for(lambda: beats(self.beats), what=f"{name} to start")
        if member:
            wait_for(lambda: beats(self.member_beats), what=f"{name}'s member to start")
        stat = reaper_process.proc_stat(self.pid)
        assert stat is not None
        self.start = stat.start

    @property
    def member_pid(self) -> int:
        return int(Path(f"{self.member_beats}.pid").read_text())

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        for pid in (self.pid, *([self.member_pid] if self.member_beats.exists() else [])):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()


class Pipe:
    """A reaper process, and this test as its supervisor."""

    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "reaper.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                reaper_argv(os.getpid(), "json"),
                stdin=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )

    def send(self, *fields: object) -> None:
        assert self.proc.stdin is not None
        line = " ".join("-" if field is None else str(field) for field in fields)
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, run_id: str, *, term: int | None, kill: int | None, grace: int = 0) -> None:
        self.send("expect", run_id, grace, term, kill, "a job")

    def watch(self, run: Run, *, term: int | None, kill: int | None, grace: int = 0) -> None:
        self.expect(run.id, term=term, kill=kill, grace=grace)
        self.send("watch", run.id, run.pid, run.start)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def actions(self) -> list[str]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line)["action"] for line in lines]


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipe]:
    reaper = Pipe(tmp_path)
    yield reaper
    if reaper.proc.poll() is None:
        reaper.proc.kill()
    reaper.proc.wait()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()


def test_a_run_its_supervisor_does_not_stop_gets_sigterm_then_sigkill_at_its_deadline(
    pipe: Pipe, runs: list[Run], tmp_path: Path
) -> None:
    run = Run(tmp_path, "a", stubborn=True)
    runs.append(run)
    term, kill = now_us() + 200 * MS, now_us() + 600 * MS
    pipe.watch(run, term=term, kill=kill, grace=400 * MS)

    wait_for(run.ended, what="the run to be killed")

    assert run.proc.returncode == -signal.SIGKILL
    (termed,) = terms(run.beats)
    assert term <= termed < kill  # SIGTERM after its point (the lag), before the SIGKILL
    assert beats(run.beats)[-1] < kill + LATENCY_US
    # The reaper logs the kill after sending it: the run can be seen dead first.
    wait_for(lambda: "reaper_kill" in pipe.actions(), what="the kill to be logged")
    assert pipe.actions() == ["reaper_term", "reaper_kill"]


def test_a_moved_deadline_saves_the_run_and_a_sigterm_said_sent_is_not_sent_again(
    pipe: Pipe, runs: list[Run], tmp_path: Path
) -> None:
    fixed, moved = Run(tmp_path, "fixed", stubborn=True), Run(tmp_path, "moved", stubborn=True)
    runs += [fixed, moved]
    kill = now_us() + 500 * MS
    pipe.watch(fixed, term=kill - 100 * MS, kill=kill, grace=100 * MS)
    pipe.watch(moved, term=kill - 100 * MS, kill=kill, grace=100 * MS)
    # A renewal moved it; and its supervisor says it has sent the SIGTERM of the new point.
    far = now_us() + 60_000 * MS
    pipe.send("state", moved.id, now_us(), far, 1)

    wait_for(fixed.ended, what="the run whose deadline stayed to be killed")

    assert running(moved.pid)
    assert terms(moved.beats) == []  # said sent: the reaper did not send it again
    pipe.send("done", moved.id)


def test_when_the_supervisor_is_gone_every_run_is_stopped_at_once_and_the_reaper_exits(
    pipe: Pipe, runs: list[Run], tmp_path: Path
) -> None:
    meek, stubborn = Run(tmp_path, "meek"), Run(tmp_path, "stubborn", stubborn=True)
    runs += [meek, stubborn]
    far = now_us() + 60_000 * MS
    grace = 300 * MS
    for run in (meek, stubborn):
        pipe.watch(run, term=far - grace, kill=far, grace=grace)

    gone = now_us()
    pipe.close()  # EOF: the supervisor is gone
    wait_for(lambda: meek.ended() and stubborn.ended(), what="both runs to be stopped")
    wait_for(lambda: pipe.proc.poll() is not None, what="the reaper to exit")

    assert meek.proc.returncode == -signal.SIGTERM
    assert stubborn.proc.returncode == -signal.SIGKILL
    assert beats(stubborn.beats)[-1] < gone + grace + LATENCY_US  # a grace, not the deadline
    assert pipe.proc.returncode == 0
    assert pipe.actions()[0] == "reaper_orphaned"


def test_a_recycled_pgid_or_a_stranger_with_another_run_id_is_never_signalled(
    pipe: Pipe, runs: list[Run], tmp_path: Path
) -> None:
    # `recycled`: its pid is a watched pgid, but it is not the process that was started
    # (another start time); `stranger`: a session leader with another run's id.
    recycled, stranger, control = (Run(tmp_path, name) for name in ("r", "s", "c"))
    runs += [recycled, stranger, control]
    due = now_us()
    pipe.expect("gone-run", term=due, kill=due)
    pipe.send("watch", "gone-run", recycled.pid, recycled.start - 1)
    pipe.expect(str(uuid.uuid4()), term=due, kill=due)
    # The control is expected, never said watched: found by its run id, and killed.
    pipe.expect(control.id, term=due, kill=due)

    wait_for(control.ended, what="the control run to be found and killed")

    assert running(recycled.pid)
    assert running(stranger.pid)
    assert "reaper_found" in pipe.actions()


def test_once_the_leader_is_reaped_its_members_still_die_at_the_deadline(
    pipe: Pipe, runs: list[Run], tmp_path: Path
) -> None:
    run = Run(tmp_path, "leader", member=True)
    runs.append(run)
    member = run.member_pid
    kill = now_us() + 800 * MS
    pipe.watch(run, term=now_us(), kill=kill, grace=800 * MS)
    wait_for(run.ended, what="the leader to end on SIGTERM")  # and this reaps it

    assert reaper_process.proc_stat(run.pid) is None  # the pgid names no process any more
    wait_for(lambda: not running(member), what="the member to be killed")
    assert beats(run.member_beats)[-1] < kill + LATENCY_US
    assert terms(run.member_beats)  # it had its SIGTERM with the group


def test_the_reaper_lives_in_a_session_of_its_own_and_ignores_sigterm(pipe: Pipe) -> None:
    assert os.getsid(pipe.proc.pid) == pipe.proc.pid  # a group stop of ours misses it
    wait_for(lambda: reaper_process.proc_stat(pipe.proc.pid) is not None, what="the reaper")
    wait_for(
        lambda: Path(f"/proc/{pipe.proc.pid}/cmdline").read_bytes().count(b"reaper_process") > 0,
        what="the reaper to run its script",
    )
    wait_for(
        lambda: (int(_sigignored(pipe.proc.pid), 16) >> (signal.SIGTERM - 1)) & 1,
        what="the reaper to ignore SIGTERM",
    )
    os.kill(pipe.proc.pid, signal.SIGTERM)
    pipe.close()  # but its supervisor's end ends it
    wait_for(lambda: pipe.proc.poll() is not None, what="the reaper to exit")
    assert pipe.proc.returncode == 0


def _sigignored(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn"))


def test_the_supervisor_side_watches_a_child_and_leaves_no_process_behind(
    tmp_path: Path,
) -> None:
    reaper = Reaper()
    run_id = str(uuid.uuid4())
    kill = now_us() + 400 * MS
    watch = reaper.expect(run_id, grace_us=0, label="job", term_at_us=kill, kill_at_us=kill)
    assert watch is not None
    pid = reaper.pid
    assert pid is not None
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert watch.attach(child.pid)
        wait_for(lambda: child.poll() is not None, what="the child to be killed")
        assert child.returncode == -signal.SIGKILL
    finally:
        watch.done()
        reaper.close()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert reaper_process.proc_stat(pid) is None  # exited and reaped: not even a zombie


def test_a_child_that_is_not_ours_or_not_a_session_leader_is_not_attached() -> None:
    reaper = Reaper()
    watch = reaper.expect("x", grace_us=0, label="job", term_at_us=None, kill_at_us=None)
    assert watch is not None
    same_session = subprocess.Popen(["sleep", "60"])
    try:
        assert not watch.attach(same_session.pid)  # in our group: killpg would hit us
        assert not watch.attach(os.getppid())  # not our child
    finally:
        same_session.kill()
        same_session.wait()
        watch.done()
        reaper.close()


# -- the replica's side: a frozen event loop -------------------------------------------------
async def test_an_isolated_run_is_killed_at_its_deadline_while_its_replica_is_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica's loop is blocked (as by SIGSTOP: nothing in it runs) from the moment its
    isolated run has started until that run is gone: only the reaper can have stopped it,
    and it must have done so before the run's lease expired in the store."""
    from unit import isolated_jobs  # the child process imports it by the same name

    monkeypatch.setenv("FLEETCRON_TEST_BEATS", str(tmp_path / "beats"))
    store = MemoryStore()
    job = job_spec(
        "stubborn", where="test", call=isolated_jobs.stubborn, isolate="process", every="1h"
    )
    job = replace(job, lock_at_most_us=2_000_000)
    now = store.clock.wall_us()
    store.run(store.ops.run_record("reap", "stubborn", now - 1, "queued", None, "manual"))
    scheduler = AsyncScheduler(
        AsyncMemoryStore(store),
        [job],
        SchedulerOptions(namespace="reap", kill_grace_s=0.5, shutdown_grace_s=0.5),
    )
    task = asyncio.create_task(scheduler.run())
    try:
        async with asyncio.timeout(30):
            while not list(tmp_path.glob("beats.*")):
                await asyncio.sleep(0.01)
        reaper = scheduler.supervisor.reaper
        assert reaper is not None
        assert reaper.pid is not None
        (child,) = [
            pid
            for pid, stat in reaper_process._processes()
            if stat.ppid == os.getpid() and stat.session == pid and pid != reaper.pid
        ]
        # Frozen: this blocks the loop the replica runs on until the run is gone.
        give_up = time.monotonic() + 30
        while running(child) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert not running(child), "the reaper did not stop the run of a frozen replica"
        (row,) = store.run(store.ops.run_list("reap", "stubborn", 10))
        assert row.expires_us is not None
        (beat_file,) = tmp_path.glob("beats.*")
        assert beats(beat_file)[-1] < row.expires_us
    finally:
        scheduler.stop()
        await task
