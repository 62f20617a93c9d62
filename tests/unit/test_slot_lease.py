"""A claimed slot held like a lease: its outcome is recorded even through a brief store
failure, for as long as its fence can still be current."""

from __future__ import annotations

from typing import Any

import pytest

from fleetcron.errors import StoreUnavailable
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
