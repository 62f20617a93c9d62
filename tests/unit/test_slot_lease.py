"""A claimed slot held like a lease: its outcome is recorded even through a brief store
failure, for as long as its fence can still be current."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from fleetcron.errors import StoreUnavailable
from fleetcron.keepalive import FINISH_RETRY_MOST_S, finish_retry_pause_us, safety_margin_us
from fleetcron.lease import LeaseTerms
from fleetcron.models import RunOutcome, SlotClaim
from fleetcron.slot_lease import SlotLease
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import MemoryStore
from fleetcron.testing import FakeClock

NS = "slot"


class FailingFinish(MemoryStore):
    """Fails the next ``failures`` outcomes it is asked to record."""

    failures = 0

    def run(self, operation: Operation[Any]) -> Any:
        if getattr(operation, "__name__", "") == "run_finish" and self.failures > 0:
            self.failures -= 1
            operation.close()
            raise StoreUnavailable("disk full, as the test asked")
        return super().run(operation)


def _claimed(store: MemoryStore, ttl_us: int) -> SlotLease:
    now = store.clock.wall_us()
    claim = SlotClaim(job="report", slot_us=now - 1_000, run_id="r", trigger="exec")
    (answer,) = store.run(store.ops.run_claim(NS, [claim], "h:1:t", ttl_us))
    assert answer.run is not None
    terms = LeaseTerms(
        namespace=NS, name="report", lock_at_most_us=ttl_us, lock_at_least_us=0, keepalive=False
    )
    return SlotLease(
        store, terms, answer.run, sent_us=store.clock.monotonic_us(), clock=store.clock
    )


def test_an_outcome_is_recorded_after_the_store_failed_twice() -> None:
    store = FailingFinish()
    store.failures = 2
    lease = _claimed(store, 60_000_000)
    retried: list[str] = []

    assert lease.finish(RunOutcome(state="succeeded"), on_retry=lambda e: retried.append(str(e)))

    assert lease.accepted is True
    assert retried == ["disk full, as the test asked"]  # said once, not per try
    row = store.run(store.ops.run_get(NS, "report", lease.run.slot_us))
    assert row is not None
    assert row.state == "succeeded"


def test_an_outcome_the_store_never_takes_before_the_deadline_raises() -> None:
    clock = FakeClock()
    store = FailingFinish(clock=clock)
    store.failures = 10_000
    lease = _claimed(store, 300_000)
    clock.advance(1.0)  # past the local deadline: no further try can count

    with pytest.raises(StoreUnavailable):
        lease.finish(RunOutcome(state="succeeded"))
    assert lease.accepted is None


class DownUntil(MemoryStore):
    """Fails every outcome it is asked to record until the monotonic instant
    :attr:`back_us` (a store that is down, then answers again)."""

    back_us = 0
    tries = 0

    def run(self, operation: Operation[Any]) -> Any:
        if getattr(operation, "__name__", "") == "run_finish":
            self.tries += 1
            if self.clock.monotonic_us() < self.back_us:
                operation.close()
                raise StoreUnavailable("connection refused, as the test asked")
        return super().run(operation)


def test_an_outcome_is_recorded_by_a_store_back_just_before_the_lease_deadline() -> None:
    store = DownUntil()
    ttl_us = 1_500_000  # a local deadline 1.35 s after the claim was sent (margin 0.15 s)
    lease = _claimed(store, ttl_us)
    # Down for all but the last 0.15 s before the deadline: a back-off grown past that
    # stretch would sleep through it and give up at the deadline without a try.
    store.back_us = lease.slot.deadline_us - 150_000

    assert lease.finish(RunOutcome(state="succeeded"))

    assert store.tries > 2
    row = store.run(store.ops.run_get(NS, "report", lease.run.slot_us))
    assert row is not None
    assert row.state == "succeeded"


def _tries(deadline_us: int, ttl_us: int, first_failure_us: int) -> list[int]:
    """The instants of the tries after a first one failing at ``first_failure_us``."""
    now, attempt, tries = first_failure_us, 0, []
    while (
        pause := finish_retry_pause_us(attempt, now_us=now, deadline_us=deadline_us, ttl_us=ttl_us)
    ) is not None:
        now += pause
        tries.append(now)
        attempt += 1
    return tries


@pytest.mark.parametrize("ttl_us", [300_000, 1_500_000, 6_000_000, 600_000_000])
def test_outcome_tries_come_often_until_the_nominal_end_with_one_just_before_the_deadline(
    ttl_us: int,
) -> None:
    for _ in range(50):  # the waits are jittered
        margin = safety_margin_us(ttl_us)
        deadline = ttl_us - margin  # the claim was sent at 0
        tries = _tries(deadline, ttl_us, first_failure_us=10_000)

        gaps = [b - a for a, b in itertools.pairwise([10_000, *tries])]
        assert max(gaps) <= FINISH_RETRY_MOST_S * 1e6
        lead = min(100_000, margin // 2)
        assert any(deadline - lead <= t <= deadline for t in tries), (deadline, tries[-3:])
        assert tries[-1] < deadline + margin  # never past the lease's nominal end
        assert tries[-1] >= deadline + margin - FINISH_RETRY_MOST_S * 1e6  # tried until near it
