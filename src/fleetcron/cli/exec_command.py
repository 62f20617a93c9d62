"""The command of ``fleetcron exec``: run under its lease, stopped by the executor's stop
sequence, its ending turned into exec's exit status.

The stop sequence is the one every run of a replica gets (:func:`fleetcron.executor.supervise`):
SIGTERM to the command's process group a grace before the lease's local deadline, or at
once when the lease is lost or ``--timeout`` elapses; SIGKILL a grace later, and at the
deadline at the latest; the reaper (:mod:`fleetcron.reaper`) told of the group before it
starts and of every move of its stop points. It runs on an event loop of its own, for the
command's life. The lease stays a sync lease (the fleet's, or the claimed slot's) whose
keepalive runs on its portal, another loop, so the two meet only through what crosses
threads safely: the deadline, read; a loss, handed over with ``call_soon_threadsafe``; a
renewal, noticed by reading the deadline every 0.2 s. A renewal comes a third of the lease
after the one before, long before the stop point it moves, so the reaper has the new
point before the old one comes.

What ``exec`` adds to a replica's run is what a transparent wrapper owes the crontab line
that calls it, each a small piece of its own here:

- the command's standard streams are exec's own, passed through, never read;
- SIGTERM, SIGINT and SIGHUP sent to exec are forwarded to the command's process group
  (:class:`_Forwarding`) — a replica takes its SIGTERM as "drain" instead;
- once the command has ended nothing more is sent to its group: what it left running
  there is its own;
- the exit status is the command's own (128+N when killed by signal N), or exec's: 76
  lease lost, 124 timed out, 126 cannot execute, 127 not found (:func:`run_outcome` says it
  for the ledger and the pings).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from fleetcron._log import log
from fleetcron.cli.exec_options import ExecOptions
from fleetcron.cli.exitcodes import (
    EXIT_CANNOT_EXECUTE,
    EXIT_LEASE_LOST,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
)
from fleetcron.clock import SystemClock
from fleetcron.environment import child_environment
from fleetcron.errors import FleetcronError
from fleetcron.executor import Cancellation, StopPolicy, expect, supervise
from fleetcron.lease import Lease
from fleetcron.local_holder import PENDING_GROUP
from fleetcron.models import RunOutcome
from fleetcron.reaper import Reaper

__all__ = ["ceiling_error", "run_command", "run_outcome"]

# Why the command was asked to stop (the first reason wins).
_LEASE_LOST = "lease_lost"
_TIMEOUT = "timeout"

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# How often the lease's deadline is looked at for a renewal's move (see the docstring).
_FOLLOW_S = 0.2

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def run_command(
    lease: Lease,
    options: ExecOptions,
    backend_url: str | None,
    *,
    run_id: str,
    extra_env: Mapping[str, str] | None = None,
    name_group: Callable[[int], object] | None = None,
) -> int:
    """Run ``options.command`` while ``lease`` is held and return exec's exit status for
    it (the lease is the caller's to release). ``extra_env``: more of the command's
    environment (``--schedule``'s slot and attempt). ``name_group``: how to tell the store
    the command's process group (SQLite's same-host takeover waits for it): called with
    :data:`~fleetcron.local_holder.PENDING_GROUP` before the command starts — a store
    error there is raised, the command not started — and with its group right after.
    Call it from the main thread: the signals sent to exec are forwarded from there."""
    env = child_environment(
        os.environ,
        backend_url,
        {
            "FLEETCRON_JOB": options.name,
            "FLEETCRON_FENCE": str(lease.fence),
            "FLEETCRON_RUN_ID": run_id,
            "FLEETCRON_NAMESPACE": lease.namespace,
            **(extra_env or {}),
        },
    )
    with asyncio.Runner() as runner, _Forwarding(runner.get_loop()) as forwarding:
        # The reaper's stop points are CLOCK_MONOTONIC instants: only with the system clock.
        reaper = Reaper() if Reaper.supported() and isinstance(lease.clock, SystemClock) else None
        try:
            supervised = _supervised(lease, options, env, run_id, reaper, forwarding, name_group)
            return runner.run(supervised)
        finally:
            if reaper is not None:
                reaper.close()  # it exits at once: nothing is left to watch


async def _supervised(
    lease: Lease,
    options: ExecOptions,
    env: dict[str, str],
    run_id: str,
    reaper: Reaper | None,
    forwarding: _Forwarding,
    name_group: Callable[[int], object] | None,
) -> int:
    loop = asyncio.get_running_loop()
    if name_group is not None:
        name_group(PENDING_GROUP)
    cancellation = Cancellation(lease.clock)
    moved = asyncio.Event()
    stop = StopPolicy(
        deadline=lambda: lease.deadline_us,
        deadline_reason=_LEASE_LOST,
        grace_us=options.kill_grace_us,
        clock=lease.clock,
        reaper=reaper,
        moved=moved,
    )
    # Announced before the command starts, so it is watched from its first instant.
    watch = expect(stop, cancellation, run_id=run_id, label=options.name)
    try:
        try:
            process = await asyncio.create_subprocess_exec(
                *options.command, env=env, start_new_session=True
            )
        except FileNotFoundError:
            log.error(
                "command not found: %s",
                options.command[0],
                extra={"action": "run_failed", "lock": options.name},
            )
            return EXIT_NOT_FOUND
        except OSError as exc:  # EACCES, ENOEXEC, ENOTDIR, …: as a shell would, 126
            log.error(
                "command cannot be executed: %s: %s",
                options.command[0],
                exc.strerror or exc,
                extra={"action": "run_failed", "lock": options.name},
            )
            return EXIT_CANNOT_EXECUTE
        if watch is not None:
            watch.attach(process.pid)  # unless it has ended already (nothing to stop then)
        if name_group is not None:
            _name_group(name_group, process.pid, options.name)
        log.info(
            "running %s under %s (fence %d, run %s)",
            options.command[0],
            options.name,
            lease.fence,
            run_id,
            extra={"action": "run_started", "lock": options.name, "fence": lease.fence},
        )
        lease.on_lost(lambda _: _hand_over(loop, cancellation))
        forwarding.attach(process.pid)
        timer = None
        if options.timeout_us is not None:
            timer = loop.call_later(options.timeout_us / 1e6, cancellation.request, _TIMEOUT)
        # Without a reaper nobody needs a move before the old stop point (supervise looks
        # at the deadline again there), and without keepalive the deadline never moves.
        follow = (
            loop.create_task(_follow(lease, moved))
            if watch is not None and lease.terms.keepalive
            else None
        )
        try:
            await supervise(process, cancellation, stop, watch)
        finally:
            if timer is not None:
                timer.cancel()
            if follow is not None:
                follow.cancel()
    finally:
        if watch is not None:
            watch.done()
    assert process.returncode is not None  # supervise returns once it has ended
    return _exit_status(lease, options, cancellation.reason, process.returncode)


def _name_group(name_group: Callable[[int], object], pgid: int, name: str) -> None:
    """Tell the store the command's process group. Should that fail, the lease still says
    a group is being started: if this process dies it is not taken over before it
    expires, as on every other store."""
    try:
        name_group(pgid)
    except FleetcronError as error:
        log.warning(
            "could not record the process group of %s's command: %s (should this process "
            "die, the lease is taken over only when it expires)",
            name,
            error,
            extra={"action": "lease_group_failed", "lock": name},
        )


def _hand_over(loop: asyncio.AbstractEventLoop, cancellation: Cancellation) -> None:
    """The lease was lost (said in the keepalive's thread, or here when it already was):
    the command is stopped on the supervising loop. Once that loop is closed the command
    has ended, and there is nothing left to stop."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(cancellation.request, _LEASE_LOST)


async def _follow(lease: Lease, moved: asyncio.Event) -> None:
    """Set ``moved`` whenever a renewal has moved the lease's deadline."""
    seen = lease.deadline_us
    while True:
        await asyncio.sleep(_FOLLOW_S)
        if lease.deadline_us != seen:
            seen = lease.deadline_us
            moved.set()


def _exit_status(lease: Lease, options: ExecOptions, reason: str | None, returncode: int) -> int:
    """Exec's exit status for a command that ended with ``returncode`` after being asked
    to stop for ``reason`` (``None``: it was not), said in the log."""
    status = 128 - returncode if returncode < 0 else returncode
    # The local deadline passed while the command ran (this process was paused past it, and
    # the keepalive had no chance to say so yet): the lease is not trusted any more.
    if reason == _LEASE_LOST or lease.is_lost or lease.remaining_us() <= 0:
        # Without keepalive nothing renews the lease, by request: its end is the run's
        # ceiling, reached, not a loss.
        said = (
            f"lease on {options.name} lost; command stopped"
            if options.keepalive
            else f"{options.name}: {ceiling_error(options.lock_at_most)}"
        )
        log.error(
            "%s (exit %d)",
            said,
            status,
            extra={"action": "run_lost", "lock": options.name, "fence": lease.fence},
        )
        return EXIT_LEASE_LOST
    if reason == _TIMEOUT:
        log.error(
            "%s timed out; command stopped",
            options.name,
            extra={"action": "run_timeout", "lock": options.name},
        )
        return EXIT_TIMEOUT
    log.info(
        "%s finished with status %d",
        options.name,
        status,
        extra={
            "action": "run_succeeded" if status == 0 else "run_failed",
            "lock": options.name,
            "exit_code": status,
        },
    )
    return status


def ceiling_error(lock_at_most: str) -> str:
    """What ends a run without keepalive at its lease's end: not a loss, its ceiling."""
    return f"stopped: the run reached --lock-at-most ({lock_at_most}) without keepalive"


def run_outcome(
    status: int | None,
    cancel_requested: bool,
    options: ExecOptions,
    reason: str = "cancel requested",
) -> RunOutcome:
    """The outcome exec's exit ``status`` amounts to, for the ledger and the pings
    (``None``: exec failed before the command ended); ``options`` say whether the lease
    was kept alive (without keepalive its end is the run's ceiling, not a loss);
    ``reason``: why a cancelled run was asked to stop."""
    if status is None:
        return RunOutcome(state="failed", error="fleetcron exec failed before the command ended")
    if cancel_requested:
        return RunOutcome(state="cancelled", exit_code=status, error=reason)
    if status == EXIT_LEASE_LOST:
        error = "lease lost; command stopped"
        if not options.keepalive:
            error = ceiling_error(options.lock_at_most)
        return RunOutcome(state="lost", exit_code=status, error=error)
    if status == EXIT_TIMEOUT:
        return RunOutcome(state="failed", exit_code=status, error="timed out")
    if status == 0:
        return RunOutcome(state="succeeded", exit_code=0)
    return RunOutcome(state="failed", exit_code=status, error=f"exit status {status}")


class _Forwarding:
    """SIGTERM, SIGINT and SIGHUP sent to ``fleetcron exec`` go to its command's process
    group, as if sent to the command (exec is a transparent wrapper; a replica's runs get
    no such thing, its SIGTERM means "drain").

    The handlers are the loop's (``add_signal_handler``: a signal that reaches any thread
    of this process wakes the loop), in place from before the command starts, so a signal
    that comes meanwhile is held and forwarded once it has started instead of killing exec
    and orphaning the command; on exit the handlers found on entry are put back.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pgid: int | None = None
        self._pending: list[int] = []
        self._previous: dict[signal.Signals, _Handler] = {}

    def __enter__(self) -> _Forwarding:
        try:
            for sig in _FORWARDED:
                previous = signal.getsignal(sig)
                self._loop.add_signal_handler(sig, self._received, sig)
                self._previous[sig] = previous
        except BaseException:
            self.__exit__()  # those put in so far
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            self._loop.remove_signal_handler(sig)
            if previous is not None:  # None: not set from Python; left at the default
                signal.signal(sig, previous)

    def attach(self, pgid: int) -> None:
        """The command has started as the leader of process group ``pgid``: forward what
        was held, and from now on what comes."""
        self._pgid = pgid
        for signum in self._pending:
            self._send(signum)
        self._pending.clear()

    def _received(self, signum: int) -> None:
        if self._pgid is None:
            self._pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, signum)
