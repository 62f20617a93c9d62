"""Job functions run by the isolation tests in a child process (importable by name)."""

from __future__ import annotations

import os
import time

from fleetcron.context import RunContext
from fleetcron.errors import RunCancelled


def stubborn(ctx: RunContext) -> None:
    """Beats (wall clock, µs) every 20 ms and ignores its cancellation."""
    path = os.environ["FLEETCRON_TEST_BEATS"] + f".{ctx.fence}"
    while True:
        try:
            with open(path, "a") as beats:
                beats.write(f"{time.time_ns() // 1000}\n")
            time.sleep(0.02)
        except RunCancelled:
            continue


def fine(ctx: RunContext) -> None:
    """Succeeds, leaving a mark with its pid (not the replica's)."""
    with open(os.environ["FLEETCRON_TEST_BEATS"] + ".fine", "a") as mark:
        mark.write(f"{os.getpid()} {ctx.fence} {ctx.attempt}\n")


def broken(ctx: RunContext) -> None:
    raise ValueError(f"boom at fence {ctx.fence}")
