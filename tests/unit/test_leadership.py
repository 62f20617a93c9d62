"""The elector: one leader per namespace, terms that end by loss or resignation, and trust
measured from the send time. Tests wait on the elector's signals, never on sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.keepalive import local_deadline_us
from fleetcron.scheduling.leadership import Elector
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock

NS = "lead"
TTL_US = 600_000


def elector(
    store: AsyncMemoryStore, name: str, clock: Clock = SYSTEM_CLOCK, ttl_us: int = TTL_US
) -> Elector:
    return Elector(store, namespace=NS, holder=f"host:{name}", ttl_us=ttl_us, clock=clock)


class Refusing(AsyncMemoryStore):
    """Refuses every renewal while ``refuse`` is set (as after a takeover)."""

    refuse = False

    async def run(self, operation: Operation[Any]) -> Any:
        if self.refuse and operation.gi_code.co_name == "lease_extend":  # type: ignore[attr-defined]
            operation.close()
            return None
        return await super().run(operation)


async def test_competing_electors_elect_exactly_one_leader() -> None:
    store = MemoryStore()
    electors = [elector(AsyncMemoryStore(store), str(n)) for n in range(4)]

    terms = await asyncio.gather(*(e.campaign() for e in electors))

    leaders = [e for e, term in zip(electors, terms, strict=True) if term is not None]
    assert len(leaders) == 1
    assert [e.signals.elected.is_set() for e in electors].count(True) == 1
    for e, term in zip(electors, terms, strict=True):
        if term is not None:
            await e.resign(term)


async def test_a_resigned_term_lets_a_standby_lead_at_once_without_a_lost_signal() -> None:
    store = MemoryStore()
    first, second = elector(AsyncMemoryStore(store), "a"), elector(AsyncMemoryStore(store), "b")
    term = await first.campaign()
    assert term is not None
    assert await second.campaign() is None

    await first.resign(term)

    taken = await second.campaign()
    assert taken is not None
    assert taken.fence > term.fence
    assert not first.signals.elected.is_set()
    assert not first.signals.lost.is_set()
    await second.resign(taken)


async def test_a_term_whose_renewal_is_refused_ends_with_the_lost_signal() -> None:
    store = Refusing(MemoryStore())
    leader = elector(store, "a")
    term = await leader.campaign()
    assert term is not None
    store.refuse = True

    await asyncio.wait_for(leader.signals.lost.wait(), 5)

    assert term.is_lost
    assert not leader.signals.elected.is_set()
    await leader.resign(term)


async def test_a_slow_successful_renewal_does_not_extend_trust_beyond_its_send_time() -> None:
    clock = FakeClock()

    class Slow(AsyncMemoryStore):
        async def run(self, operation: Operation[Any]) -> Any:
            result = await super().run(operation)
            if operation.gi_code.co_name == "lease_extend":  # type: ignore[attr-defined]
                clock.advance(0.4)  # the answer arrives 400 ms after the request left
            return result

    # A long lease: its keepalive does not renew during the test; the test renews.
    leader = elector(Slow(MemoryStore(clock=clock)), "a", clock, ttl_us=60_000_000)
    term = await leader.campaign()
    assert term is not None
    sent = clock.monotonic_us()

    await term.extend()

    assert term.deadline_us == local_deadline_us(sent, 60_000_000)
    assert term.remaining_us() == local_deadline_us(sent, 60_000_000) - sent - 400_000
    await leader.resign(term)
