"""A lease holder as this host knows it, and whether it is gone: SQLite's same-host
takeover (docs/design/leases.md).

Every process that shares a SQLite store runs on one host, so a contender can ask the
kernel what the store's clock cannot tell it: whether the holder of a lease is still
there. A holder records who it is with its lease (:class:`LocalHolder`); a contender that
finds the lease held treats its holder as *gone* — and releases the lease on its behalf —
only when all of this is true:

- the record was written on this boot of this kernel, in the contender's pid and time
  namespaces (:func:`host_scope`: the boot id and the two namespaces, for a pid and a start
  time mean one process only there). Another boot id is another host sharing the file, or
  this one before a reboot: the two cannot be told apart, so neither is taken over;
- the holder process has ended: no process has its pid, or the one that has it started at
  another time (the pid was reused), or it is a zombie whose every thread has exited. A
  process that exists and cannot be inspected (another user's, ``/proc`` mounted with
  ``hidepid``) is alive; so is a stopped one (SIGSTOP): it may resume and write;
- the process group named with it has no member left but zombies: the holder's own
  group for a lease taken through the lock API (a child it started and did not move out of
  its group outlives it there), the command's group for ``fleetcron exec``;
  :data:`PENDING_GROUP` while a command is being started, whose group is not known yet —
  never gone.

Off Linux (no ``/proc``, no boot id) nothing is recorded and nothing is taken over:
:func:`host_locality` is then :class:`NoLocality`, never a guess.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleetcron.reaper_process import proc_stat

__all__ = [
    "BOOT_ID",
    "PENDING_GROUP",
    "LocalHolder",
    "Locality",
    "NoLocality",
    "ProcLocality",
    "group_gone",
    "host_locality",
    "host_scope",
    "process_ended",
]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PENDING_GROUP = 0
"""The group of a holder that is starting a process whose group it will name next: until
it has, the holder is never taken for gone (its command may be running already)."""

_ENDED = frozenset({"Z", "X"})  # zombie, dead


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalHolder:
    """Who holds a lease, as this host knows it.

    ``scope``: where ``pid`` and ``start`` name one process (:func:`host_scope`);
    ``start``: the process's start time, clock ticks after boot (field 22 of
    ``/proc/PID/stat``), which with the pid names it for good; ``group``: the process group
    whose members must be gone too (``None``: none; :data:`PENDING_GROUP`: one being
    started)."""

    scope: str
    pid: int
    start: int
    group: int | None


class Locality(Protocol):
    """What a store on one host knows of its processes."""

    def holder(self) -> LocalHolder | None:
        """This process as a lease holder, its own process group with it; ``None`` when
        this host cannot say (the feature is off)."""
        ...

    def gone(self, holder: LocalHolder) -> bool:
        """Whether ``holder`` is gone for good (see the module); ``False`` whenever that
        cannot be known."""
        ...


class NoLocality:
    """A host whose processes cannot be told apart: nothing recorded, nothing taken over."""

    def holder(self) -> LocalHolder | None:
        return None

    def gone(self, holder: LocalHolder) -> bool:
        return False


def host_scope(boot_id: Path = BOOT_ID) -> str | None:
    """This boot and the namespaces a pid and a start time are read in —
    ``"<boot id> pid:[…] time:[…]"`` — or ``None`` off Linux, or when ``/proc`` is not
    this process's (mounted for another pid namespace) or does not say."""
    if sys.platform != "linux":
        return None
    try:
        boot = boot_id.read_text().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
        # /proc names this process by the pid it has here only if it is this pid
        # namespace's /proc.
        ours = os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return None
    if not boot or not ours:
        return None
    time_ns = ""
    with contextlib.suppress(OSError):  # no time namespaces before Linux 5.6
        time_ns = os.readlink("/proc/self/ns/time")
    return " ".join(part for part in (boot, pid_ns, time_ns) if part)


def process_ended(pid: int, start: int) -> bool:
    """Whether the process ``pid`` that started at ``start`` has ended: no process has the
    pid, another one has it (started at another time), or it is a zombie with no thread
    left. A process that exists and cannot be read is not ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, another user's
    stat = proc_stat(pid)
    if stat is None:
        return False  # hidden (hidepid), or it ended this instant: the next try will say
    if stat.start != start:
        return True
    return stat.state in _ENDED and _threads_ended(pid)


def _threads_ended(pid: int) -> bool:
    """Whether every thread of ``pid`` has exited: a leader that exits before its other
    threads shows as a zombie while they run on."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # reaped meanwhile
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as file:
                data = file.read()
        except OSError:
            continue  # exited meanwhile
        if data[data.rfind(b")") + 2 :][:1].decode("ascii", "replace") not in _ENDED:
            return False
    return True


def group_gone(pgid: int) -> bool:
    """Whether process group ``pgid`` has no member left but zombies. A group whose
    members exist and cannot be read is not gone."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # members exist, another user's
    states = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat.pgrp == pgid:
                states.append(stat.state)
    # None seen although the kernel said some exist: hidden from us, so not gone.
    return bool(states) and all(state in _ENDED for state in states)


class ProcLocality:
    """Linux's answer, from ``/proc`` and ``kill(pid, 0)``. ``scope``: this host's
    (:func:`host_scope`), read once."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self._start: tuple[int, int] | None = None  # (pid, start): a fork has another

    def holder(self) -> LocalHolder | None:
        pid = os.getpid()
        if self._start is None or self._start[0] != pid:
            stat = proc_stat(pid)
            if stat is None:
                return None
            self._start = (pid, stat.start)
        return LocalHolder(scope=self.scope, pid=pid, start=self._start[1], group=os.getpgrp())

    def gone(self, holder: LocalHolder) -> bool:
        if holder.scope != self.scope or holder.group == PENDING_GROUP:
            return False
        if not process_ended(holder.pid, holder.start):
            return False
        return holder.group is None or group_gone(holder.group)


def host_locality(boot_id: Path = BOOT_ID) -> Locality:
    """This host's :class:`Locality`: :class:`ProcLocality` on Linux, else
    :class:`NoLocality`."""
    scope = host_scope(boot_id)
    return NoLocality() if scope is None else ProcLocality(scope)
