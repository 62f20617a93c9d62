"""Waiting on a scheduler's passes instead of on the clock: a test looks again after every
scheduling pass of any replica it runs (``signals.ticked``), never after a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence

from fleetcron.scheduler import AsyncScheduler

__all__ = ["until_signalled"]


async def _ticked(scheduler: AsyncScheduler) -> None:
    async with scheduler.signals.ticked:
        await scheduler.signals.ticked.wait()


async def until_signalled(
    schedulers: Sequence[AsyncScheduler],
    done: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 30.0,
) -> None:
    """Return once ``done()`` (which may be a coroutine function) holds, looking after
    every pass of any of ``schedulers``; fail after ``timeout`` s (a bound for a loaded
    machine, not an expectation)."""

    async def holds() -> bool:
        answer = done()
        return bool(await answer) if inspect.isawaitable(answer) else bool(answer)

    async with asyncio.timeout(timeout):
        while not await holds():
            waits = [asyncio.ensure_future(_ticked(s)) for s in schedulers]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
