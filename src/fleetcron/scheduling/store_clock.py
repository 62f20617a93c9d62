"""The store's clock as one replica estimates it.

Every decision of a scheduling pass — what is due, late or missed — is made on the
*store's* clock, never on this host's (a replica whose clock ran ahead must not record
future slots as missed or skipped for the whole fleet). Reading it costs a round trip, so
it is read at most once a :data:`RESYNC_US` and estimated in between from the monotonic
clock and the last reading (half the round trip taken off). The store still enforces every
time rule itself; the estimate only decides what to ask for, and an answer that disagrees
with it forces a reading at the next pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetcron.clock import Clock
from fleetcron.metrics import Metrics
from fleetcron.models import ClaimResult, SlotClaim
from fleetcron.stores.base import AsyncStore

__all__ = ["RESYNC_US", "TOLERANCE_US", "StoreClock"]

RESYNC_US = 1_000_000
"""The store's clock is read again at most this often."""
TOLERANCE_US = 20_000
"""A store time further than this from the estimate (beyond the round trip) makes the
next pass read the clock again."""


class StoreClock:
    """The store's clock: read (:meth:`read`), estimated (:meth:`now`), and doubted
    (:meth:`doubt`) when an answer disagrees with the estimate."""

    def __init__(self, store: AsyncStore, clock: Clock, metrics: Metrics | None = None) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self.offset_us = 0
        """Store time minus this host's monotonic time, at the last reading."""
        self._synced_us: int | None = None  # monotonic µs of the last reading

    async def read(self) -> int:
        """Read the store's clock now; every decision of a pass is made on that reading."""
        sent = self._clock.monotonic_us()
        store_now = await self._store.run(self._store.ops.store_now())
        received = self._clock.monotonic_us()
        self.offset_us = store_now - (sent + received) // 2
        self._synced_us = received
        if self._metrics is not None:
            self._metrics.clock_offset.set((store_now - self._clock.wall_us()) / 1e6)
        return store_now

    async def for_pass(self) -> int:
        """The store's now for a pass: read at most once a :data:`RESYNC_US`, estimated
        from the last reading in between (or read at once when it is in doubt)."""
        synced = self._synced_us
        if synced is None or self._clock.monotonic_us() - synced >= RESYNC_US:
            return await self.read()
        return self.now()

    def now(self) -> int:
        """The store's clock estimated between readings, for timing sleeps only. It rides
        the monotonic clock, so a step of this host's wall clock cannot move it."""
        return self._clock.monotonic_us() + self.offset_us

    def doubt(self) -> None:
        """Read the clock again at the next pass (after a store outage, or an answer that
        disagreed with the estimate)."""
        self._synced_us = None

    def check(self, store_now_us: int, sent_us: int, received_us: int) -> None:
        """A store time seen during the round trip ``sent_us``..``received_us`` (monotonic):
        outside the estimate by more than :data:`TOLERANCE_US`, the next pass reads the
        clock (a stepped store clock, a suspended host)."""
        low = sent_us + self.offset_us - TOLERANCE_US
        high = received_us + self.offset_us + TOLERANCE_US
        if not low <= store_now_us <= high:
            self._synced_us = None

    def learn(
        self, answers: Sequence[tuple[SlotClaim, ClaimResult]], sent_us: int, received_us: int
    ) -> None:
        """What a batch of claims' answers tell of the store's clock: each run granted
        carries the store's time; a slot refused ``not_due``, or ``missed`` before the
        deadline the estimate had not reached, says the estimate runs ahead or behind."""
        estimate = received_us + self.offset_us
        for claim, answer in answers:
            if answer.run is not None:
                self.check(answer.run.now_us, sent_us, received_us)
            elif answer.status == "not_due" or (
                # Refused past a deadline the estimate had not reached: it runs behind.
                answer.status == "missed"
                and claim.deadline_us is not None
                and claim.deadline_us > estimate + TOLERANCE_US
            ):
                self.doubt()
