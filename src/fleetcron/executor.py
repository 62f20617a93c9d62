"""Running one attempt of a job: a command, a Python callable, or a callable in a child
process (``isolate = "process"``).

The executor knows nothing of stores. It is given the run's :class:`Cancellation` and the
:class:`StopPolicy` of its lease, and turns the target's ending into an
:class:`Execution`. The stop sequence is the one of :mod:`fleetcron.keepalive`: a process
group gets SIGTERM a grace before the lease's local deadline (or when the run is asked to
stop) and SIGKILL at the deadline at the latest, so nothing of it is alive once the store
could grant the lease to another replica. A thread cannot be killed: a sync function that
has not returned by the deadline is *abandoned* and reported, so the caller can refuse
to start the job again while it still runs.

That stop sequence runs in this process, so it needs this process alive and scheduled.
With a :class:`~fleetcron.reaper.Reaper` in the :class:`StopPolicy`, every process group
of a run is also watched by the reaper process, told its stop points whenever they move:
it stops the group on time when this process is frozen, and at once when it has died.

:func:`expect` and :func:`supervise` are that sequence for a process its caller starts
itself (``fleetcron exec``: its command keeps exec's standard streams).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import inspect
import os
import queue
import signal
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from fleetcron._log import log
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.context import RunContext
from fleetcron.environment import child_environment
from fleetcron.isolated import PAYLOAD_ENV, child_command, child_payload
from fleetcron.jobspec import CallTarget, CommandTarget, JobSpec
from fleetcron.keepalive import stop_points
from fleetcron.models import RunOutcome, micros_to_datetime
from fleetcron.reaper import Reaper, Watch
from fleetcron.scrub import Scrubber, ScrubbingStream, scrubber_for
from fleetcron.stores.ledger import OUTPUT_LIMIT

__all__ = ["Cancellation", "Execution", "StopPolicy", "execute", "expect", "supervise"]

_READ_SIZE = 65_536  # bytes of a command's output read at a time
_RESULT_LIMIT = 4096


class Cancellation:
    """Why, and since when, a run is being stopped; the first reason wins."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None
        self.asked_at_us: int | None = None
        self._clock = clock

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.asked_at_us = self._clock.monotonic_us()
        self.event.set()


@dataclass(frozen=True, slots=True, kw_only=True)
class StopPolicy:
    """The lease a run works under, as the executor needs it.

    ``deadline`` returns the lease's current local deadline (monotonic µs; it moves when a
    renewal succeeds; ``None``: no deadline); ``deadline_reason`` is the reason recorded
    when the deadline stops the run; ``grace_us`` the time between SIGTERM and SIGKILL.
    ``reaper``: the watchdog process that stops a run's process group on time should this
    process freeze or die (``None``: none; it needs ``clock`` to be the system's
    monotonic clock). ``moved``: set when a renewal moved the deadline, so the reaper
    learns the new one at once, not at the old stop point.
    """

    deadline: Callable[[], int | None]
    deadline_reason: str
    grace_us: int
    clock: Clock = SYSTEM_CLOCK
    reaper: Reaper | None = None
    moved: asyncio.Event | None = None


NO_DEADLINE = StopPolicy(deadline=lambda: None, deadline_reason="", grace_us=5_000_000)


@dataclass(frozen=True, slots=True)
class Execution:
    """How an attempt ended. ``abandoned``: the job's function still runs in a thread that
    could not be stopped (set only when the outcome is a cancellation)."""

    outcome: RunOutcome
    abandoned: asyncio.Future[Any] | None = None


def _outcome_for_cancel(reason: str, exit_code: int | None, output: str | None) -> RunOutcome:
    if reason == "timeout":
        return RunOutcome(state="failed", exit_code=exit_code, error="timed out", output=output)
    return RunOutcome(state="cancelled", exit_code=exit_code, error=reason, output=output)


async def execute(
    spec: JobSpec,
    ctx: RunContext,
    cancellation: Cancellation,
    stop: StopPolicy = NO_DEADLINE,
    *,
    backend_url: str | None,
    echo: bool = True,
) -> Execution:
    """Run ``spec``'s target once and report how it ended. The store's password is
    masked in everything the run printed or raised (:mod:`fleetcron.scrub`)."""
    target = spec.target
    scrubber = scrubber_for(backend_url)
    if isinstance(target, CommandTarget):
        outcome = await _run_process(
            list(target.argv), ctx, cancellation, stop, backend_url, echo, scrubber, isolated=None
        )
        return _scrubbed(Execution(outcome), scrubber)
    if spec.isolate == "process":
        outcome = await _run_process(
            child_command(), ctx, cancellation, stop, backend_url, echo, scrubber, isolated=target
        )
        return _scrubbed(Execution(outcome), scrubber)
    return _scrubbed(await _run_call(target, ctx, cancellation, stop), scrubber)


def _scrubbed(execution: Execution, scrubber: Scrubber) -> Execution:
    """``execution`` with the store's secrets masked in its error and output, then its
    error bounded (in that order: a cut must not leave part of a secret behind)."""
    outcome = scrubber.outcome(execution.outcome)
    if outcome.error is not None and len(outcome.error) > OUTPUT_LIMIT:
        outcome = replace(outcome, error=outcome.error[:OUTPUT_LIMIT])
    return replace(execution, outcome=outcome)


def _environment(ctx: RunContext, backend_url: str | None) -> dict[str, str]:
    return dict(
        child_environment(
            os.environ,
            backend_url,
            {
                "FLEETCRON_JOB": ctx.job,
                "FLEETCRON_NAMESPACE": ctx.namespace,
                "FLEETCRON_FENCE": str(ctx.fence),
                "FLEETCRON_RUN_ID": ctx.run_id,
                "FLEETCRON_SLOT": micros_to_datetime(ctx.slot_us)
                .isoformat()
                .replace("+00:00", "Z"),
                "FLEETCRON_ATTEMPT": str(ctx.attempt),
            },
        )
    )


async def _run_process(
    argv: list[str],
    ctx: RunContext,
    cancellation: Cancellation,
    stop: StopPolicy,
    backend_url: str | None,
    echo: bool,
    scrubber: Scrubber,
    *,
    isolated: CallTarget | None,
) -> RunOutcome:
    env = _environment(ctx, backend_url)
    watch = expect(stop, cancellation, run_id=ctx.run_id, label=ctx.job)
    result_read = result_write = -1
    pass_fds: tuple[int, ...] = ()
    if isolated is not None:
        result_read, result_write = os.pipe()
        os.set_blocking(result_read, False)
        pass_fds = (result_write,)
        env[PAYLOAD_ENV] = child_payload(isolated, ctx, result_write)
    process: asyncio.subprocess.Process | None = None
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except FileNotFoundError:
        _close(result_read)  # result_write: closed below
        return RunOutcome(state="failed", exit_code=127, error=f"not found: {argv[0]}")
    except OSError as exc:
        _close(result_read)  # result_write: closed below
        return RunOutcome(state="failed", exit_code=126, error=f"cannot execute: {exc}")
    finally:
        if result_write >= 0:
            os.close(result_write)
        if watch is not None and process is None:
            watch.done()
    if watch is not None:
        watch.attach(process.pid)  # unless it has ended already (nothing to stop then)
    tail = _OutputTail(ctx.job, echo, scrubber)
    reader = asyncio.create_task(tail.pump(process))
    try:
        await supervise(process, cancellation, stop, watch)
    finally:
        _killpg(process.pid, signal.SIGKILL)  # whatever the run left behind in its group
        if watch is not None:
            watch.done()  # after the SIGKILL: nothing of the group is left to watch
        with contextlib.suppress(ProcessLookupError):
            await process.wait()
    try:
        await asyncio.wait_for(reader, 2)  # cancels the reader when it times out
    except TimeoutError:
        log.warning(
            "%s: the command's output was still open 2 s after it ended; not read further",
            ctx.job,
            extra={"action": "output_truncated", "job": ctx.job},
        )
    summary = _read_summary(result_read, scrubber) if isolated is not None else None
    returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
    status = 128 - returncode if returncode < 0 else returncode
    output = tail.text()
    if cancellation.reason is not None:
        return _outcome_for_cancel(cancellation.reason, status, output)
    if status == 0:
        return RunOutcome(state="succeeded", exit_code=0, output=output)
    return RunOutcome(
        state="failed", exit_code=status, error=summary or f"exit status {status}", output=output
    )


def expect(
    stop: StopPolicy, cancellation: Cancellation, *, run_id: str, label: str
) -> Watch | None:
    """Announce a run to the policy's reaper with its stop points, before its process is
    started with ``FLEETCRON_RUN_ID=run_id`` (``None``: no reaper). The caller attaches
    the process to the watch once it has started (:meth:`~fleetcron.reaper.Watch.attach`),
    hands the watch to :func:`supervise`, and ends it (:meth:`~fleetcron.reaper.Watch.done`)
    once the process has ended."""
    if stop.reaper is None:
        return None
    points = stop_points(
        deadline_us=stop.deadline(), grace_us=stop.grace_us, asked_at_us=cancellation.asked_at_us
    )
    return stop.reaper.expect(
        run_id,
        grace_us=stop.grace_us,
        label=label,
        term_at_us=points.term_at,
        kill_at_us=points.kill_at,
    )


async def supervise(
    process: asyncio.subprocess.Process,
    cancellation: Cancellation,
    stop: StopPolicy,
    watch: Watch | None = None,
) -> None:
    """Wait for ``process`` to end, stopping its group on time: SIGTERM when the run is
    asked to stop or a grace before the lease's deadline, SIGKILL at the deadline (or a
    grace after the SIGTERM) — whichever comes first. Reaching the SIGTERM point asks
    ``cancellation`` to stop with the policy's ``deadline_reason`` (the first reason
    wins). ``watch`` (the reaper's) is told the stop points each time they are computed
    (it sends only a change). Returns when the process has ended; what it left running in
    its group is the caller's to stop, or not."""
    waiter = asyncio.ensure_future(process.wait())
    asked = asyncio.ensure_future(cancellation.event.wait())
    moved = asyncio.ensure_future(stop.moved.wait()) if stop.moved is not None else None
    term_sent = False
    try:
        while not waiter.done():
            if moved is not None and moved.done():
                assert stop.moved is not None
                stop.moved.clear()
                moved = asyncio.ensure_future(stop.moved.wait())
            now = stop.clock.monotonic_us()
            deadline = stop.deadline()
            if deadline is not None and now >= deadline - stop.grace_us:
                cancellation.request(stop.deadline_reason)
            points = stop_points(
                deadline_us=deadline, grace_us=stop.grace_us, asked_at_us=cancellation.asked_at_us
            )
            if points.kill_at is not None and now >= points.kill_at:
                _killpg(process.pid, signal.SIGKILL)
                await waiter
                return
            if points.term_at is not None and now >= points.term_at and not term_sent:
                _killpg(process.pid, signal.SIGTERM)
                term_sent = True
            if watch is not None:
                watch.update(points.term_at, points.kill_at, term_sent)
            upcoming = [
                t
                for t in (points.term_at, points.kill_at)
                if t is not None and t > now and not (t == points.term_at and term_sent)
            ]
            timeout = (min(upcoming) - now) / 1e6 if upcoming else None
            waits: set[asyncio.Future[Any]] = {waiter}
            if not asked.done():
                waits.add(asked)
            if moved is not None:
                waits.add(moved)
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
        if moved is not None:
            moved.cancel()


class _OutputTail:
    """Reads a process's output in fixed-size chunks (a line longer than a stream buffer
    would stall a line reader, then the pipe, then the command), masks the store's
    secrets in it as it comes (before any cut: a secret split by the 4 KiB bound or by a
    read is masked whole), keeps its last 4 KiB and echoes it line by line with the job's
    name."""

    def __init__(self, job: str, echo: bool, scrubber: Scrubber) -> None:
        self.job = job
        self.echo = echo
        self.chunks: deque[str] = deque()
        self.size = 0
        self._scrubbing = ScrubbingStream(scrubber)

    async def pump(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""  # the echo's unfinished line
        try:
            while True:
                raw = await process.stdout.read(_READ_SIZE)
                text = self._scrubbing.feed(decoder.decode(raw, final=not raw))
                if not raw:
                    text += self._scrubbing.close()
                if self.echo:
                    pending += text
                    *lines, pending = pending.split("\n")
                    if not raw and pending:
                        lines, pending = [*lines, pending], ""
                    for line in lines:
                        print(f"[{self.job}] {line}", flush=True)  # noqa: T201
                self._keep(text)
                if not raw:
                    return
        finally:  # no longer read (or done: then nothing is held back)
            self._keep(self._scrubbing.close(cut=True))

    def _keep(self, text: str) -> None:
        if text:
            self.chunks.append(text)
            self.size += len(text)
            while self.size - len(self.chunks[0]) >= OUTPUT_LIMIT:
                self.size -= len(self.chunks.popleft())

    def text(self) -> str | None:
        return "".join(self.chunks)[-OUTPUT_LIMIT:] or None


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_summary(fd: int, scrubber: Scrubber) -> str | None:
    """The one-line summary an isolated child wrote before it exited, if any, with the
    store's secrets masked. The child cuts it at 4 KiB: a summary that long may end with
    the start of a password, masked too."""
    try:
        data = os.read(fd, _RESULT_LIMIT)
    except (BlockingIOError, OSError):
        data = b""
    finally:
        _close(fd)
    cut = len(data) >= _RESULT_LIMIT
    # Not final when cut: a character split by the cut is dropped, not replaced by U+FFFD
    # (which would hide a partial password from the scrubber).
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not cut)
    return scrubber.scrub(text, cut=cut).strip() or None


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _DaemonThreads:
    """The threads plain job functions run in. Daemon threads, so that one stuck in a
    function abandoned after its cancellation never keeps the process from exiting (the
    default executor's threads are joined at exit); idle ones are reused, since starting a
    thread per run costs more than the run of a short job."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        if start:
            threading.Thread(target=self._serve, name="fleetcron-job", daemon=True).start()
        self._queue.put(work)

    def _serve(self) -> None:
        while True:
            self._queue.get()()
            with self._lock:
                self._idle += 1


# One set per process, like asyncio's default executor: threads are a process's resource.
_THREADS = _DaemonThreads()


class _ThreadResult(asyncio.Future[object]):
    """The future of a function run in a daemon thread.

    ``abandoned`` is set once the run gave up on the thread: the exception it may still
    end with is then read as it is set, or asyncio logs "exception was never retrieved"
    when the future is collected (a done callback would not do: the loop may close
    between the exception and the callback, as it does at the end of ``asyncio.run``).
    """

    abandoned = False


def _in_daemon_thread(function: Callable[[RunContext], object], ctx: RunContext) -> Any:
    """Run ``function(ctx)`` in a daemon thread; a future of its result."""
    loop = asyncio.get_running_loop()
    future = _ThreadResult(loop=loop)

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
            if future.abandoned:
                future.exception()
        else:
            future.set_result(result)

    def body() -> None:
        try:
            result = function(ctx)
        except BaseException as exc:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, None)

    _THREADS.submit(body)
    return future


def _retrieve(work: asyncio.Future[Any]) -> None:
    """Read how ``work`` ended, so that an exception nobody awaits is not logged."""
    if not work.cancelled():
        work.exception()


async def _run_call(
    target: CallTarget, ctx: RunContext, cancellation: Cancellation, stop: StopPolicy
) -> Execution:
    function = target.function
    work: asyncio.Future[Any]
    in_thread = not inspect.iscoroutinefunction(function)
    if in_thread:
        work = _in_daemon_thread(function, ctx)
    else:
        work = asyncio.ensure_future(cast(Awaitable[Any], function(ctx)))
    asked = asyncio.ensure_future(cancellation.event.wait())
    try:
        while not work.done() and not asked.done():
            now = stop.clock.monotonic_us()
            deadline = stop.deadline()
            if deadline is not None and now >= deadline - stop.grace_us:
                cancellation.request(stop.deadline_reason)
                break
            timeout = None if deadline is None else (deadline - stop.grace_us - now) / 1e6
            await asyncio.wait({work, asked}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
    if not work.done():
        reason = cancellation.reason or "cancelled"
        ctx.cancel(reason)
        if not in_thread:
            work.cancel()  # a thread cannot be: it only sees ctx.cancelled
        points = stop_points(
            deadline_us=stop.deadline(),
            grace_us=stop.grace_us,
            asked_at_us=cancellation.asked_at_us,
        )
        left_s = max(0.0, ((points.kill_at or 0) - stop.clock.monotonic_us()) / 1e6)
        await asyncio.wait({work}, timeout=left_s)
        if not work.done():
            # Its end is the caller's to report (Execution.abandoned); the exception it
            # ends with is read here, or asyncio logs "exception was never retrieved".
            if isinstance(work, _ThreadResult):
                work.abandoned = True
            else:
                work.add_done_callback(_retrieve)
            return Execution(
                RunOutcome(
                    state="failed" if reason == "timeout" else "cancelled",
                    error=f"{'timed out' if reason == 'timeout' else reason}; the function did "
                    "not return and was abandoned (it cannot be killed in a thread)",
                ),
                abandoned=work,
            )
    if cancellation.reason is not None and (work.cancelled() or ctx.cancelled):
        if not work.cancelled():
            work.exception()  # its RunCancelled is the outcome below; read, or asyncio logs it
        return Execution(_outcome_for_cancel(cancellation.reason, None, None))
    if work.cancelled():
        return Execution(RunOutcome(state="cancelled", error="cancelled"))
    error = work.exception()
    if error is not None:  # bounded by execute(), once scrubbed
        return Execution(RunOutcome(state="failed", error=f"{type(error).__name__}: {error}"))
    return Execution(RunOutcome(state="succeeded"))
