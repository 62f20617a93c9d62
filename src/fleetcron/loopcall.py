"""Calling the scheduler's event loop from a job's thread: what ``ctx.checkpoint`` and
``ctx.queue`` do for a plain ``def`` job, which runs in a worker thread while the store
lives on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from fleetcron.errors import ConfigurationError

__all__ = ["call_on_loop"]

T = TypeVar("T")


def call_on_loop(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T], *, instead: str
) -> T:
    """Run ``coroutine`` on ``loop`` and wait for it here. Called on the loop itself (from
    an ``async def`` job) it would wait forever: refused, saying what to use ``instead``."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise ConfigurationError(f"this call blocks: in an async job use {instead}")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()
