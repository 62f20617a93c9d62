"""Whether a lease's holder is gone from this host (fleetcron.local_holder), judged on real
processes: dead, reused, zombie, stopped, alive, another boot, a group left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleetcron.local_holder import (
    PENDING_GROUP,
    LocalHolder,
    NoLocality,
    ProcLocality,
    group_gone,
    host_locality,
    host_scope,
    process_ended,
)
from fleetcron.reaper_process import proc_stat

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def state(pid: int) -> str | None:
    stat = proc_stat(pid)
    return None if stat is None else stat.state


def wait_state(pid: int, wanted: str) -> None:
    """Wait until ``pid`` is in ``wanted`` state (``waitid`` with ``WNOWAIT`` for a child
    that exits or stops: it returns once it has, and reaps nothing)."""
    flags = (os.WEXITED if wanted == "Z" else os.WSTOPPED) | os.WNOWAIT
    os.waitid(os.P_PID, pid, flags)
    assert state(pid) == wanted


@pytest.fixture
def locality() -> ProcLocality:
    found = host_locality()
    assert isinstance(found, ProcLocality), "this Linux host should say who its holders are"
    return found


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def start(children: list[subprocess.Popen[bytes]], argv: list[str]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(argv, start_new_session=True)
    children.append(child)
    return child


def holder_of(locality: ProcLocality, pid: int, group: int | None) -> LocalHolder:
    stat = proc_stat(pid)
    assert stat is not None
    return LocalHolder(scope=locality.scope, pid=pid, start=stat.start, group=group)


def test_this_process_is_a_holder_of_this_boot_with_its_start_time_and_its_group(
    locality: ProcLocality,
) -> None:
    me = locality.holder()

    assert me is not None
    assert me.pid == os.getpid()
    assert me.group == os.getpgrp()
    assert me.start == holder_of(locality, os.getpid(), None).start
    assert me.scope.split()[0] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert os.readlink("/proc/self/ns/pid") in me.scope.split()
    assert not locality.gone(me)


def test_a_holder_whose_process_was_reaped_is_gone(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    child = start(children, SLEEP)
    holder = holder_of(locality, child.pid, child.pid)
    assert not locality.gone(holder)

    child.kill()
    child.wait()

    assert process_ended(child.pid, holder.start)
    assert locality.gone(holder)


def test_a_pid_taken_by_another_process_is_told_by_its_start_time(
    locality: ProcLocality,
) -> None:
    # This process has the pid; the holder recorded another start: it was another process.
    me = locality.holder()
    assert me is not None
    reused = replace(me, start=me.start - 1, group=None)

    assert process_ended(os.getpid(), me.start - 1)
    assert not process_ended(os.getpid(), me.start)
    assert locality.gone(reused)
    assert not locality.gone(replace(reused, start=me.start))


def test_a_zombie_holder_is_gone_before_its_parent_reaps_it(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    child = start(children, SLEEP)
    holder = holder_of(locality, child.pid, child.pid)

    os.kill(child.pid, signal.SIGKILL)
    wait_state(child.pid, "Z")

    assert locality.gone(holder)  # its group is its one zombie


def test_a_stopped_holder_is_alive(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    child = start(children, SLEEP)
    holder = holder_of(locality, child.pid, child.pid)

    os.kill(child.pid, signal.SIGSTOP)
    wait_state(child.pid, "T")

    assert not locality.gone(holder)  # it may resume, and write


def test_a_holder_of_another_boot_or_namespace_is_never_gone(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    child = start(children, SLEEP)
    holder = holder_of(locality, child.pid, None)
    child.kill()
    child.wait()
    assert locality.gone(holder)

    other_boot = "00000000-0000-0000-0000-000000000000 " + " ".join(holder.scope.split()[1:])
    assert not locality.gone(replace(holder, scope=other_boot))
    assert not locality.gone(replace(holder, scope=holder.scope.replace("pid:[", "pid:[9")))


def test_a_dead_holder_is_not_gone_while_its_group_has_a_live_member(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    # The holder is gone; the command it started leads a group of its own and runs on.
    dead = start(children, SLEEP)
    command = start(children, SLEEP)
    holder = holder_of(locality, dead.pid, command.pid)
    dead.kill()
    dead.wait()

    assert not group_gone(command.pid)
    assert not locality.gone(holder)

    command.kill()
    wait_state(command.pid, "Z")  # a zombie left in the group is no member that runs
    assert group_gone(command.pid)
    assert locality.gone(holder)
    command.wait()
    assert group_gone(command.pid)
    assert locality.gone(holder)


def test_a_holder_starting_its_command_is_never_gone(
    locality: ProcLocality, children: list[subprocess.Popen[bytes]]
) -> None:
    child = start(children, SLEEP)
    holder = holder_of(locality, child.pid, PENDING_GROUP)
    child.kill()
    child.wait()

    assert not locality.gone(holder)  # its command may have started: its group is unknown
    assert locality.gone(replace(holder, group=None))


def test_off_linux_or_without_a_boot_id_nothing_is_recorded_or_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "boot_id"
    off = host_locality(missing)

    assert host_scope(missing) is None
    assert isinstance(off, NoLocality)
    assert off.holder() is None
    me = LocalHolder(scope="x", pid=os.getpid(), start=0, group=None)
    assert not off.gone(me)

    monkeypatch.setattr(sys, "platform", "darwin")
    assert host_scope() is None
    assert isinstance(host_locality(), NoLocality)
