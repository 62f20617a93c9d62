"""The reaper: a watchdog process that stops a run's process group at its lease's
deadline even when the process supervising the run is frozen or dead.

The supervisor of a command (the replica's executor, ``fleetcron exec``) stops the
command's process group itself — SIGTERM a grace before the lease's local deadline, SIGKILL
at it (:func:`fleetcron.keepalive.stop_points`). That is the first line, and it needs the
supervisor to be alive and scheduled. A replica paused by SIGSTOP past its lease, or
SIGKILLed, would leave the command running after the store could hand its lease to
another replica. The reaper is the backstop: one small process per supervisor (one per
replica, one per ``fleetcron exec`` invocation), in a session of its own, that is told
each run's process group, its stop points and every move of them, and:

- sends SIGTERM and SIGKILL at the stop points when the supervisor did not (frozen);
- when the supervisor is gone (its pipe reaches EOF, or its pidfd says it exited), sends
  SIGTERM to every group it watches at once and SIGKILL a grace later — or at the group's
  deadline, if that is sooner — and exits when nothing is left;
- never signals a group whose leader is not the process the run started (pid and start
  time), so a recycled pgid is never hit.

The process itself is :mod:`fleetcron.reaper_process` (a few standard modules only, started with
``python -I -S``, no site-packages: ~20 ms of CPU to start, ~10 MB RSS of which ~4 MB its
own; idle, it sleeps in ``poll`` until a message or a stop point).

:class:`Reaper` is the supervisor's side: :meth:`Reaper.expect` a run just before starting
its process, :meth:`Watch.attach` the process right after, :meth:`Watch.update` its stop
points whenever they change, :meth:`Watch.done` when it has ended, and
:meth:`Reaper.close` with the supervisor.

The reaper works on Linux (it needs ``/proc`` to tell a process by its start time);
elsewhere :meth:`Reaper.supported` is false and the supervisor's own stop sequence is the
only one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from fleetcron._log import JsonFormatter, log
from fleetcron.reaper_process import proc_stat

__all__ = ["Reaper", "Watch", "reaper_argv"]

_SCRIPT = Path(__file__).with_name("reaper_process.py")
# A reaper that died is started again, but not more often than this (one that dies at once
# must not cost a fork on every message).
_RESTART_AFTER_S = 5.0
_LABEL_LIMIT = 200  # characters of a run's name in a message (a message stays < PIPE_BUF)


class Watch:
    """One run as the reaper knows it: expected (:meth:`Reaper.expect`, before its process
    is started), then watched (:meth:`attach`), until :meth:`done`. Thread-safe."""

    def __init__(self, reaper: Reaper, run_id: str, grace_us: int, label: str) -> None:
        self.run_id = run_id
        self.grace_us = grace_us
        self.label = " ".join(label[:_LABEL_LIMIT].split())  # one line
        self.pgid: int | None = None
        self.start: int | None = None
        self._reaper = reaper
        self._state: tuple[int | None, int | None, bool] = (None, None, False)
        self._done = False

    def attach(self, pid: int) -> bool:
        """The run's process has started as ``pid``, a child of this process in a session
        of its own (``start_new_session=True``), not waited on yet. Whether it is watched
        (not when it has already ended)."""
        stat = proc_stat(pid)
        # Read before this process reaps the child, so the pid still names it: its parent
        # is us and it leads its own session.
        if stat is None or stat.ppid != os.getpid() or stat.pgrp != pid or stat.session != pid:
            return False
        with self._reaper._lock:
            if self._done:
                return False
            self.pgid, self.start = pid, stat.start
            self._reaper._send(self._watch_line())
        return True

    def update(self, term_at_us: int | None, kill_at_us: int | None, term_sent: bool) -> None:
        """Tell the reaper the run's stop points (monotonic µs; ``None``: none) and whether
        this process has sent the SIGTERM itself. Only a change is sent."""
        state = (term_at_us, kill_at_us, term_sent)
        with self._reaper._lock:
            if self._done or state == self._state:
                return
            self._state = state
            self._reaper._send(self._state_line())

    def done(self) -> None:
        """The run has ended (its group killed, if it had one): the reaper forgets it."""
        with self._reaper._lock:
            if self._done:
                return
            self._done = True
            if self._reaper._watches.get(self.run_id) is self:
                del self._reaper._watches[self.run_id]
            self._reaper._send(_line("done", self.run_id))

    def _expect_line(self) -> bytes:
        term, kill, _sent = self._state
        return _line("expect", self.run_id, self.grace_us, _point(term), _point(kill), self.label)

    def _watch_line(self) -> bytes:
        if self.pgid is None:
            return b""
        return _line("watch", self.run_id, self.pgid, self.start)

    def _state_line(self) -> bytes:
        term, kill, sent = self._state
        return _line("state", self.run_id, _point(term), _point(kill), int(sent))

    def _lines(self) -> bytes:
        """Everything the reaper must know of the run (for a new reaper)."""
        return self._expect_line() + self._watch_line() + self._state_line()


def _line(*fields: object) -> bytes:
    """One message of :mod:`fleetcron.reaper_process`'s protocol."""
    return " ".join(map(str, fields)).encode("utf-8", "replace") + b"\n"


def _point(at_us: int | None) -> str:
    return "-" if at_us is None else str(at_us)


def _token(run_id: str) -> str:
    """The run id as one field of a message; one that cannot be (never, from fleetcron)
    becomes a random one, which the reaper then never finds in a process's environment."""
    if run_id and len(run_id) <= 100 and run_id.isprintable() and " " not in run_id:
        return run_id
    return uuid.uuid4().hex


class Reaper:
    """The supervisor's side of one reaper process (started by :meth:`start`, or by the
    first :meth:`expect`). Thread-safe: a lease's thread may update a run while the
    supervisor's thread starts the next one.

    Messages go through a non-blocking pipe, one atomic write each, so the supervisor never
    blocks on its watchdog: a reaper that stopped reading (frozen, its pipe full) is
    replaced by a new one, told every run afresh; one that died is replaced likewise.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self._watches: dict[str, Watch] = {}
        self._started_at: float | None = None
        self._said_unavailable = False

    @staticmethod
    def supported() -> bool:
        """Whether a reaper can run here: Linux's ``/proc``, and an interpreter to run."""
        return sys.platform == "linux" and bool(sys.executable) and Path("/proc/self/stat").exists()

    @property
    def pid(self) -> int | None:
        """The reaper process's pid (``None``: not running)."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the reaper process if it is not running (idempotent)."""
        with self._lock:
            if self._proc is None:
                self._spawn()

    def expect(
        self,
        run_id: str,
        *,
        grace_us: int,
        label: str,
        term_at_us: int | None,
        kill_at_us: int | None,
    ) -> Watch | None:
        """Announce a run whose process is about to start, with its stop points, before it
        is started: should this process freeze or die before :meth:`Watch.attach`, the
        reaper finds the process by ``run_id`` (its ``FLEETCRON_RUN_ID``). ``None``: no
        reaper could be started."""
        with self._lock:
            if self._proc is None:
                self._spawn()
            if self._proc is None:
                return None
            watch = Watch(self, _token(run_id), grace_us, label)
            watch._state = (term_at_us, kill_at_us, False)
            self._watches[watch.run_id] = watch
            self._send(watch._expect_line())
            return watch

    def close(self, wait_s: float = 2.0) -> None:
        """The supervisor is done: close the pipe (the reaper then stops whatever is still
        watched and exits) and wait up to ``wait_s`` for it to exit."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._watches.clear()
            self._close_pipe(proc)
            self._started_at = None  # a later run starts a new one at once
        if proc is not None and not _wait_exit(proc, wait_s):
            # It is stopping runs still watched; once this process exits, init reaps it,
            # and meanwhile subprocess's own clean-up does if it ends.
            log.debug("the reaper (pid %d) is still stopping runs", proc.pid)

    # -- the process ------------------------------------------------------------------------
    def _spawn(self) -> None:
        now = time.monotonic()
        if self._started_at is not None and now - self._started_at < _RESTART_AFTER_S:
            return
        self._started_at = now
        argv = reaper_argv(os.getpid(), _log_format())
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                # stderr: ours, so its log lines are with the supervisor's.
                start_new_session=True,  # out of reach of signals sent to our group
                close_fds=True,
            )
        except OSError as exc:
            if not self._said_unavailable:
                self._said_unavailable = True
                log.error(
                    "cannot start the reaper (%s): a run's command is stopped on time only "
                    "while this process is alive and scheduled",
                    exc,
                    extra={"action": "reaper_unavailable"},
                )
            return
        assert proc.stdin is not None
        self._proc = proc
        self._fd = proc.stdin.fileno()
        os.set_blocking(self._fd, False)
        log.debug("reaper started (pid %d)", proc.pid, extra={"action": "reaper_started"})
        for watch in list(self._watches.values()):  # a replaced reaper's runs
            self._write(watch._lines())

    def _send(self, data: bytes) -> None:
        """Write one message (under the lock); replace a reaper that cannot take it."""
        if self._proc is None:
            if self._watches:  # runs to watch, and no reaper (it failed to start, or died)
                self._spawn()  # once its pause is over; it is told every run as it starts
            return
        if not self._write(data):
            self._replace()

    def _write(self, data: bytes) -> bool:
        if self._proc is None:
            return False
        try:
            # At most PIPE_BUF bytes: written whole or not at all, never interleaved.
            os.write(self._fd, data)
        except BlockingIOError:
            log.error(
                "the reaper (pid %d) does not read its messages; replacing it",
                self._proc.pid,
                extra={"action": "reaper_stalled"},
            )
            return False
        except OSError:  # EPIPE: it died
            log.error(
                "the reaper (pid %d) ended (status %s); starting another",
                self._proc.pid,
                self._proc.poll(),
                extra={"action": "reaper_lost"},
            )
            return False
        return True

    def _replace(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)  # our own child, not yet reaped
            self._close_pipe(proc)
            _wait_exit(proc, 1.0)
        self._spawn()  # unless the last one was started moments ago

    def _close_pipe(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._fd = -1
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def reaper_argv(parent: int, log_format: str) -> list[str]:
    """The command line of a reaper serving ``parent``.

    ``-I -S``: isolated from the user's environment, without site-packages (its start costs
    what an interpreter's bare start costs). ``reaper_process`` is imported, not run as a
    script, so its compiled form is used when there is one (``-B``: none is written where the
    installation did not put one); its directory goes at the *end* of ``sys.path``, so no
    module of fleetcron can shadow the standard library's.
    """
    where = str(_SCRIPT.parent)
    module = "reaper_process"
    code = f"import sys; sys.path.append({where!r}); import {module}; {module}.run_main()"
    return [sys.executable, "-I", "-S", "-B", "-c", code, str(parent), log_format]


def _log_format() -> str:
    """The reaper logs as the supervisor does: JSON when its log is JSON."""
    for handler in logging.getLogger("fleetcron").handlers:
        if isinstance(handler.formatter, JsonFormatter):
            return "json"
    return "text"


def _wait_exit(proc: subprocess.Popen[bytes], wait_s: float) -> bool:
    """Wait up to ``wait_s`` for ``proc`` to exit and reap it; whether it did.

    Not ``Popen.wait(timeout)``: that sleeps with ``clock_nanosleep(TIMER_ABSTIME)``,
    which libfaketime 0.9.10 breaks (EINVAL) even when told to leave the monotonic clock
    alone (wolfcw/libfaketime#426). A pidfd, or else short ``select`` naps, do not.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or it has been reaped already
        fd = -1
    try:
        give_up = time.monotonic() + wait_s
        while proc.poll() is None:
            left = give_up - time.monotonic()
            if left <= 0:
                return False
            if fd >= 0:
                select.select([fd], [], [], left)
            else:
                select.select([], [], [], min(left, 0.01))
        return True
    finally:
        if fd >= 0:
            os.close(fd)
