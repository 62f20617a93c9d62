"""The reaper process: the backstop that stops a run's process group on time when the
process supervising it cannot — because it is frozen (SIGSTOP, a debugger, a stalled VM)
or dead (SIGKILL, the OOM killer).

It runs as ``python -I -S -B -c "…import reaper_process; reaper_process.run_main()"
PARENT_PID FORMAT`` (:func:`fleetcron.reaper.reaper_argv`): a few modules of the standard
library only (this file imports nothing of fleetcron, nothing from site-packages, and not
even ``json``, ``re``, ``enum`` or ``typing``: it starts in ~20 ms and ~8 MB), in a session
of its own, so that a signal sent to its supervisor's process group (Ctrl-Z or Ctrl-C in a
terminal, ``kill -STOP -PGID``) does not reach it. It starts nothing, so it never has a
child to reap.

The supervisor (:class:`fleetcron.reaper.Reaper`) writes one line per message to its
stdin, fields separated by one space, each line shorter than ``PIPE_BUF`` (so each write is
atomic). A run is named by its run id, which its process has in its environment
(``FLEETCRON_RUN_ID``); a stop point is an absolute ``CLOCK_MONOTONIC`` instant in µs
(system-wide on Linux: the supervisor's clock is this one), ``-`` for none:

- ``expect RUN GRACE TERM KILL LABEL`` — sent *before* the run's process is started: its
  stop points, ``GRACE`` µs between SIGTERM and SIGKILL, and its name for the log (the rest
  of the line).
- ``watch RUN PGID START`` — right after: the process group it leads, and the leader's
  start time (field 22 of ``/proc/PGID/stat``, clock ticks after boot: with the pid, it
  names one process for good).
- ``state RUN TERM KILL SENT`` — the stop points again, whenever a renewal or a stop
  request moves them; ``SENT`` is 1 once the supervisor has sent the SIGTERM itself.
- ``done RUN`` — the run has ended; forget it.

What it does:

- **At the stop points**, the supervisor alive: SIGKILL at ``K``, as the supervisor would.
  SIGTERM at ``T`` plus a short lag (:data:`_TERM_LAG_US`, at most a quarter of the grace)
  unless the supervisor said it sent it: at ``T`` the supervisor decides too, and a renewal
  that landed just before ``T`` reaches the reaper in that lag instead of costing the run a
  spurious SIGTERM. A frozen or starved supervisor says nothing, and the lease's deadline is
  met without it.
- **When the supervisor is gone** (its pipe reaches EOF, or — for a pipe that a process
  forked from the supervisor still holds open — its pidfd reports its exit): every watched
  group gets SIGTERM at once and SIGKILL a grace later, or at its deadline if that comes
  first (the rule for a stop asked for any reason). The reaper exits as soon as nothing is
  left to watch.
- **It never signals what is not the run's.** A group is signalled (``killpg``) only while
  its leader is the very process the run started — same pid, same start time, running or a
  zombie not yet reaped — so a recycled pgid is never hit. The group's members, with their
  start times, are noted whenever it is signalled; once its leader has gone (died and been
  reaped, e.g. by init after the supervisor's death), only the noted members that are still
  the same processes are signalled, one by one. A run expected but never said to be
  watched (the supervisor froze or died while starting it) is looked for in ``/proc``: the
  leader of its own session whose environment holds its run id — a random UUID that
  nothing outside the run has.

SIGTERM, SIGINT and SIGHUP are ignored: the reaper's life is its supervisor's (systemd's
``KillMode=control-group`` sends SIGTERM to every process of the unit at once, and the
reaper must still be there for the runs while the replica drains). SIGKILL ends it.
"""

from __future__ import annotations

import os
import select
import sys
import time

__all__ = ["ProcStat", "main", "proc_stat", "run_main"]

# The signal module's C core: ``signal`` itself imports ``enum`` (~10 ms of start-up).
_signals = __import__("_signal")
SIGTERM: int = _signals.SIGTERM
SIGKILL: int = _signals.SIGKILL

# How long after a SIGTERM point the reaper waits for the supervisor to say it sent it (or
# that a renewal moved the point) before sending it itself.
_TERM_LAG_US = 50_000
# With the supervisor gone, how often to look whether the groups still exist.
_ORPHAN_POLL_US = 20_000
# Without a pidfd for the parent, how often to compare getppid() with it.
_PARENT_POLL_US = 1_000_000
# A run due to be stopped but not found in /proc (its process may be between fork and
# exec) is looked for again: often at first, then seldom (a scan reads all of /proc).
_SCAN_SOON_US = 20_000
_SCAN_LATER_US = 1_000_000
_SCAN_OFTEN_FOR_US = 1_000_000
# With the supervisor gone, a run never found is given up this long after its kill point.
_ORPHAN_SCAN_FOR_US = 2_000_000


class ProcStat:
    """What ``/proc/PID/stat`` says of a process that the reaper needs."""

    __slots__ = ("pgrp", "ppid", "session", "start", "state")

    def __init__(self, state: str, ppid: int, pgrp: int, session: int, start: int) -> None:
        self.state = state
        self.ppid = ppid
        self.pgrp = pgrp
        self.session = session
        self.start = start  # clock ticks after boot: with the pid, names one process for good


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s entry in ``/proc``; ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return ProcStat(
            state=fields[0].decode("ascii", "replace"),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            start=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def _processes() -> list[tuple[int, ProcStat]]:
    """Every process in ``/proc`` with its stat."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None:
                found.append((int(entry), stat))
    return found


def _has_run_id(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read()
    except OSError:  # gone, or not ours to read
        return False
    return marker in b"\0" + environ + b"\0"


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1_000


class _Log:
    """Lines on stderr (the supervisor's), in the supervisor's log format."""

    def __init__(self, fmt: str) -> None:
        self.json = fmt == "json"

    def __call__(self, level: str, action: str, message: str, **fields: object) -> None:
        now = time.time()
        millis = int(now % 1 * 1000)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"
        if self.json:
            entry: dict[str, object] = {
                "time": stamp,
                "level": level,
                "logger": "fleetcron.reaper",
                "message": message,
                "action": action,
                **fields,
            }
            line = "{" + ", ".join(f"{_json(k)}: {_json(v)}" for k, v in entry.items()) + "}"
        else:
            line = f"{stamp} fleetcron: reaper: {message}"
        try:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def _json(value: object) -> str:
    """``value`` (a string or an integer) as JSON, without the ``json`` module."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in text) + '"'


class _Run:
    """A run's process group, as expected or watched."""

    __slots__ = (
        "grace",
        "kill_at",
        "label",
        "members",
        "next_scan",
        "pgid",
        "run",
        "start",
        "term_at",
        "term_sent",
    )

    def __init__(self, run: str, grace: int, label: str) -> None:
        self.run = run
        self.grace = grace
        self.label = label
        self.pgid: int | None = None  # None: not watched yet (expected)
        self.start = 0
        self.term_at: int | None = None
        self.kill_at: int | None = None
        self.term_sent = False
        self.members: list[tuple[int, int]] = []
        self.next_scan: int | None = None

    def describe(self) -> str:
        return f"process group {self.pgid} of {self.label} (run {self.run})"


class _Reaper:
    def __init__(self, parent: int, log: _Log) -> None:
        self.parent = parent
        self.log = log
        self.runs: dict[str, _Run] = {}
        self.orphaned = False
        self.orphaned_at = 0
        self.pending = b""

    # -- who is the run's -------------------------------------------------------------------
    def _locate(self, run: _Run, now: int) -> bool:
        """Whether the run's group is known; look for an expected one in ``/proc``."""
        if run.pgid is not None:
            return True
        if run.next_scan is not None and now < run.next_scan:
            return False
        marker = b"\0FLEETCRON_RUN_ID=" + run.run.encode() + b"\0"
        for pid, stat in _processes():
            if stat.session == pid and stat.pgrp == pid and _has_run_id(pid, marker):
                run.pgid, run.start, run.next_scan = pid, stat.start, None
                self.log(
                    "warning",
                    "reaper_found",
                    f"found {run.describe()}, which its supervisor started but did not "
                    "report (it froze or died while starting it)",
                    pgid=pid,
                    job=run.label,
                    run_id=run.run,
                )
                return True
        # Not there yet (between fork and exec the environment is still the supervisor's):
        # look again soon, then seldom.
        due = min(t for t in (run.term_at, run.kill_at, now) if t is not None)
        soon = now - due < _SCAN_OFTEN_FOR_US
        run.next_scan = now + (_SCAN_SOON_US if soon else _SCAN_LATER_US)
        return False

    @staticmethod
    def _leader_is_runs(run: _Run) -> bool:
        assert run.pgid is not None
        leader = proc_stat(run.pgid)
        return leader is not None and leader.start == run.start

    def _signal(self, run: _Run, sig: int) -> bool:
        """Send ``sig`` to what is still the run's; whether a live process got it."""
        assert run.pgid is not None
        if self._leader_is_runs(run):
            # The leader is the run's (running, or a zombie nobody reaped yet): so is the
            # group, and every process in it came from the run.
            members = [(pid, stat) for pid, stat in _processes() if stat.pgrp == run.pgid]
            run.members = [(pid, stat.start) for pid, stat in members] or run.members
            try:
                os.killpg(run.pgid, sig)
            except (ProcessLookupError, PermissionError):
                return False
            return any(stat.state != "Z" for _pid, stat in members)
        live = False
        for pid, start in run.members:
            member = proc_stat(pid)
            if member is not None and member.start == start and member.pgrp == run.pgid:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    continue
                live = live or member.state != "Z"
        return live

    def _note_members(self, run: _Run) -> None:
        if run.pgid is not None and self._leader_is_runs(run):
            run.members = [
                (pid, stat.start) for pid, stat in _processes() if stat.pgrp == run.pgid
            ] or run.members

    @staticmethod
    def _exists(run: _Run) -> bool:
        if run.pgid is None:
            return True
        try:
            os.killpg(run.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    # -- the clock --------------------------------------------------------------------------
    def _term_due(self, run: _Run) -> int | None:
        if run.term_sent or run.term_at is None:
            return None
        lag = 0 if self.orphaned else min(_TERM_LAG_US, run.grace // 4)
        return run.term_at + lag

    def act(self, now: int) -> None:
        """Send what is due at ``now``; forget the runs that are done with."""
        for run in list(self.runs.values()):
            if run.kill_at is not None and now >= run.kill_at:
                if not self._locate(run, now):
                    give_up = run.kill_at + _ORPHAN_SCAN_FOR_US
                    if self.orphaned and now >= give_up:
                        del self.runs[run.run]
                    continue
                if self._signal(run, SIGKILL):
                    cause = "is gone" if self.orphaned else "did not act"
                    self.log(
                        "error",
                        "reaper_kill",
                        f"SIGKILL to {run.describe()}: its deadline passed and its "
                        f"supervisor {cause}",
                        pgid=run.pgid,
                        job=run.label,
                        run_id=run.run,
                    )
                del self.runs[run.run]
                continue
            due = self._term_due(run)
            if due is not None and now >= due and self._locate(run, now):
                run.term_sent = True
                if self._signal(run, SIGTERM):
                    cause = (
                        "its supervisor is gone"
                        if self.orphaned
                        else "a grace before its deadline, and its supervisor did not act"
                    )
                    self.log(
                        "warning",
                        "reaper_term",
                        f"SIGTERM to {run.describe()}: {cause}",
                        pgid=run.pgid,
                        job=run.label,
                        run_id=run.run,
                    )
            if self.orphaned and run.term_sent and not self._exists(run):
                del self.runs[run.run]

    def next_wake_us(self, now: int) -> int | None:
        """Microseconds until the reaper must look again (``None``: only when told)."""
        points = []
        for run in self.runs.values():
            due = [t for t in (self._term_due(run), run.kill_at) if t is not None]
            if run.pgid is None and run.next_scan is not None:
                # Due but not found: the points that passed wait for the next look.
                due = [t for t in due if t > now] + [run.next_scan]
            points += due
        wake = [max(0, min(points) - now)] if points else []
        if self.orphaned and self.runs:
            wake.append(_ORPHAN_POLL_US)
        return min(wake) if wake else None

    # -- the supervisor ---------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                self._message(line)

    def _message(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        try:
            op, key, *fields = text.split(" ", 5 if text.startswith("expect ") else -1)
            if op == "expect":
                grace, term, kill, label = fields
                run = _Run(key, int(grace), label)
                run.term_at, run.kill_at = _point(term), _point(kill)
                self.runs[key] = run
            elif op == "done":
                self.runs.pop(key, None)
                return
            elif op in ("watch", "state"):
                found = self.runs.get(key)
                if found is None:  # done with already (killed at its deadline)
                    return
                run = found
                if op == "watch":
                    pgid, start = fields
                    run.pgid, run.start = int(pgid), int(start)
                else:
                    term, kill, sent = fields
                    run.term_at, run.kill_at = _point(term), _point(kill)
                    run.term_sent = run.term_sent or sent == "1"
            else:
                raise ValueError(f"unknown op {op!r}")
            if self.orphaned:  # read after the pidfd said the supervisor had gone
                self._stop_now(run)
        except ValueError as exc:
            self.log("error", "reaper_bad_message", f"ignored {text!r}: {exc}")

    def supervisor_gone(self, now: int) -> None:
        """Stop every run: SIGTERM now, SIGKILL a grace later (or at its deadline, if
        that is sooner)."""
        if self.orphaned:
            return
        self.orphaned = True
        self.orphaned_at = now
        if self.runs:
            self.log(
                "error",
                "reaper_orphaned",
                f"the supervisor (pid {self.parent}) is gone: stopping "
                f"{len(self.runs)} run(s) it left behind",
                supervisor_pid=self.parent,
            )
        for run in self.runs.values():
            self._stop_now(run)

    def _stop_now(self, run: _Run) -> None:
        if run.term_sent:  # by the supervisor: note who to kill should the leader go
            self._note_members(run)
        at = self.orphaned_at
        run.term_at = at if run.term_at is None else min(run.term_at, at)
        soonest = at + run.grace
        run.kill_at = soonest if run.kill_at is None else min(run.kill_at, soonest)


def _point(field: str) -> int | None:
    return None if field == "-" else int(field)


def _parent_fd(parent: int) -> int | None:
    """A pidfd that becomes readable when ``parent`` exits (``None``: not available)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(parent)
    except OSError:
        return None
    return fd


def _read_input(reaper: _Reaper) -> bool:
    """Read what the supervisor wrote and is still unread; whether its pipe is still open
    (``False`` at EOF)."""
    while True:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        reaper.feed(data)


def run(parent: int, fmt: str) -> int:
    """Serve the supervisor ``parent`` on stdin until it is gone and nothing is left."""
    for sig in (_signals.SIGTERM, _signals.SIGINT, _signals.SIGHUP):
        _signals.signal(sig, _signals.SIG_IGN)
    reaper = _Reaper(parent, _Log(fmt))
    os.set_blocking(0, False)
    poller = select.poll()
    poller.register(0, select.POLLIN)
    parent_fd = _parent_fd(parent)
    if parent_fd is not None:
        poller.register(parent_fd, select.POLLIN)
    input_open = True

    def gone() -> None:
        # What it wrote before it died comes first: the runs it announced.
        nonlocal input_open
        if input_open and not _read_input(reaper):
            input_open = False
            poller.unregister(0)
        reaper.supervisor_gone(_monotonic_us())

    if os.getppid() != parent:  # it died before the pidfd was opened
        gone()
    while True:
        now = _monotonic_us()
        reaper.act(now)
        if reaper.orphaned and not reaper.runs:
            return 0
        wake = reaper.next_wake_us(now)
        if parent_fd is None and not reaper.orphaned:
            wake = _PARENT_POLL_US if wake is None else min(wake, _PARENT_POLL_US)
        # Rounded up: waking before a stop point would only mean waiting again.
        timeout_ms = None if wake is None else -(-wake // 1000)
        for fd, _events in poller.poll(timeout_ms):
            if fd == 0 and input_open:
                if not _read_input(reaper):
                    input_open = False
                    poller.unregister(0)
                    gone()
            elif fd == parent_fd:
                poller.unregister(parent_fd)
                gone()
        if parent_fd is None and not reaper.orphaned and os.getppid() != parent:
            gone()


def main(argv: list[str] | None = None) -> int:
    """``reaper_process.py PARENT_PID [text|json]``."""
    args = sys.argv[1:] if argv is None else argv
    parent = int(args[0])
    fmt = args[1] if len(args) > 1 else "text"
    return run(parent, fmt)


def run_main() -> None:
    """Run :func:`main` and exit with its status (what the reaper's command line calls)."""
    sys.exit(main())


if __name__ == "__main__":
    run_main()
