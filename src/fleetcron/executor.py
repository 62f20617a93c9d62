"""Running one attempt of a job: a command (process group) or a Python callable.

The executor knows nothing of stores. It is given a cancellation event and turns the
target's ending into a :class:`~fleetcron.models.RunOutcome`. Commands get SIGTERM to
their whole process group on cancellation, then SIGKILL after a grace.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import inspect
import os
import signal
from collections import deque
from collections.abc import Mapping
from typing import Any

from fleetcron._log import log
from fleetcron.context import RunContext
from fleetcron.environment import child_environment
from fleetcron.jobsfile import CallTarget, CommandTarget, JobSpec
from fleetcron.models import RunOutcome, micros_to_datetime
from fleetcron.stores.ledger import OUTPUT_LIMIT

__all__ = ["Cancellation", "execute"]

_READ_SIZE = 65_536  # bytes of a command's output read at a time


class Cancellation:
    """Why a run is being stopped; the first reason wins."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()


def _outcome_for_cancel(reason: str, exit_code: int | None, output: str | None) -> RunOutcome:
    if reason == "timeout":
        return RunOutcome(state="failed", exit_code=exit_code, error="timed out", output=output)
    return RunOutcome(state="cancelled", exit_code=exit_code, error=reason, output=output)


async def execute(
    spec: JobSpec,
    ctx: RunContext,
    cancellation: Cancellation,
    *,
    backend_url: str | None,
    kill_grace_s: float,
    echo: bool = True,
) -> RunOutcome:
    """Run ``spec``'s target once and report how it ended."""
    if isinstance(spec.target, CommandTarget):
        return await _run_command(spec.target, ctx, cancellation, backend_url, kill_grace_s, echo)
    return await _run_call(spec.target, ctx, cancellation, kill_grace_s)


def _environment(ctx: RunContext, backend_url: str | None) -> Mapping[str, str]:
    return child_environment(
        os.environ,
        backend_url,
        {
            "FLEETCRON_JOB": ctx.job,
            "FLEETCRON_NAMESPACE": ctx.namespace,
            "FLEETCRON_FENCE": str(ctx.fence),
            "FLEETCRON_RUN_ID": ctx.run_id,
            "FLEETCRON_SLOT": micros_to_datetime(ctx.slot_us).isoformat().replace("+00:00", "Z"),
            "FLEETCRON_ATTEMPT": str(ctx.attempt),
        },
    )


async def _run_command(
    target: CommandTarget,
    ctx: RunContext,
    cancellation: Cancellation,
    backend_url: str | None,
    kill_grace_s: float,
    echo: bool,
) -> RunOutcome:
    try:
        process = await asyncio.create_subprocess_exec(
            *target.argv,
            env=dict(_environment(ctx, backend_url)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except FileNotFoundError:
        return RunOutcome(state="failed", exit_code=127, error=f"not found: {target.argv[0]}")
    except OSError as exc:
        return RunOutcome(state="failed", exit_code=126, error=f"cannot execute: {exc}")
    tail: deque[str] = deque()
    size = 0

    async def pump() -> None:
        # Fixed-size reads, not lines: a line longer than the stream's buffer would stop a
        # line reader (and then the pipe, and the command with it).
        nonlocal size
        assert process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""  # the echo's unfinished line
        while True:
            raw = await process.stdout.read(_READ_SIZE)
            text = decoder.decode(raw, final=not raw)
            if echo:
                pending += text
                *lines, pending = pending.split("\n")
                if not raw and pending:
                    lines, pending = [*lines, pending], ""
                for line in lines:
                    print(f"[{ctx.job}] {line}", flush=True)  # noqa: T201
            if text:
                tail.append(text)
                size += len(text)
                while size - len(tail[0]) >= OUTPUT_LIMIT:
                    size -= len(tail.popleft())
            if not raw:
                return

    reader = asyncio.create_task(pump())
    waiter = asyncio.create_task(process.wait())
    stopper = asyncio.create_task(cancellation.event.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        _killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), kill_grace_s)
        except TimeoutError:
            _killpg(process.pid, signal.SIGKILL)
            await waiter
    stopper.cancel()
    _killpg(process.pid, signal.SIGKILL)  # whatever the command left running in its group
    try:
        await asyncio.wait_for(reader, 2)  # cancels the reader when it times out
    except TimeoutError:
        log.warning(
            "%s: the command's output was still open 2 s after it ended; not read further",
            ctx.job,
            extra={"action": "output_truncated", "job": ctx.job},
        )
    returncode = waiter.result()
    status = 128 - returncode if returncode < 0 else returncode
    output = "".join(tail)[-OUTPUT_LIMIT:] or None
    if cancellation.reason is not None:
        return _outcome_for_cancel(cancellation.reason, status, output)
    if status == 0:
        return RunOutcome(state="succeeded", exit_code=0, output=output)
    return RunOutcome(
        state="failed", exit_code=status, error=f"exit status {status}", output=output
    )


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _run_call(
    target: CallTarget, ctx: RunContext, cancellation: Cancellation, kill_grace_s: float
) -> RunOutcome:
    function = target.function
    if inspect.iscoroutinefunction(function):
        work: asyncio.Future[Any] = asyncio.ensure_future(function(ctx))
    else:
        work = asyncio.ensure_future(asyncio.to_thread(function, ctx))
    stopper: asyncio.Future[Any] = asyncio.ensure_future(cancellation.event.wait())
    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if not work.done():
        ctx.cancel()
        work.cancel()  # an async job is cancelled; a thread only sees ctx.cancelled
        done, _ = await asyncio.wait({work}, timeout=kill_grace_s)
        reason = cancellation.reason or "cancelled"
        if not done:
            return _outcome_for_cancel(reason, None, None)
    if cancellation.reason is not None and (work.cancelled() or ctx.cancelled):
        return _outcome_for_cancel(cancellation.reason, None, None)
    if work.cancelled():
        return RunOutcome(state="cancelled", error="cancelled")
    error = work.exception()
    if error is not None:
        return RunOutcome(state="failed", error=f"{type(error).__name__}: {error}"[:OUTPUT_LIMIT])
    return RunOutcome(state="succeeded")
