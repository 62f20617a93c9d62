"""The store as a replica's loop sees it: down, back, and how long to wait in between.

An outage is logged once when it starts and once when it ends (with how long it lasted
and how many passes failed), never once per pass; while it lasts, passes are spaced by a
jittered back-off. Also the two small waits the loop is made of.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fleetcron._log import log
from fleetcron.errors import StoreError
from fleetcron.keepalive import backoff_s

__all__ = ["StoreOutage", "first_of", "wait_any"]


class StoreOutage:
    """The store as the loop sees it: an outage is logged once when it starts and once when
    it ends (with how long it lasted and how many passes failed), never once per pass; while
    it lasts, passes are spaced by a jittered back-off (100 ms doubling to 1 s: the store
    is found back within a second, well inside a lease, at the cost of one failed
    connection attempt a second per replica while it is down)."""

    FIRST_S = 0.1
    MOST_S = 1.0

    def __init__(self) -> None:
        self.active = False
        self.failures = 0  # failed passes of the current outage
        self.total_failures = 0  # failed passes since the replica started
        self._since = 0.0

    def failed(self, error: StoreError, now_s: float) -> None:
        self.failures += 1
        self.total_failures += 1
        if self.active:
            log.debug("store still unavailable: %s", error, extra={"action": "store_unavailable"})
            return
        self.active, self._since = True, now_s
        log.error(
            "store unavailable: %s; retrying with back-off (logged again when it is back)",
            error,
            extra={"action": "store_unavailable"},
        )

    def ended(self, now_s: float) -> None:
        if not self.active:
            return
        log.warning(
            "store available again after %.1f s (%d failed pass(es))",
            now_s - self._since,
            self.failures,
            extra={"action": "store_recovered", "failures": self.failures},
        )
        self.active, self.failures = False, 0

    def lasted_s(self, now_s: float) -> float:
        """How long the current outage has lasted (0 when the store is up)."""
        return now_s - self._since if self.active else 0.0

    def delay_s(self) -> float:
        """How long to wait before the next pass during the outage (jittered)."""
        return backoff_s(self.failures - 1, first_s=self.FIRST_S, most_s=self.MOST_S)


async def wait_any(events: Sequence[asyncio.Event], timeout_s: float) -> None:
    """Return when any of ``events`` is set, or after ``timeout_s``."""
    if any(event.is_set() for event in events):
        return
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def first_of(target: asyncio.Event, *events: asyncio.Event) -> None:
    """Set ``target`` as soon as any of ``events`` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        target.set()
