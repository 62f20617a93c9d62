"""``Fleet.cancel`` / ``AsyncFleet.cancel`` on every backend: the request side of a cancel
(the ledger marks and notes the running attempt; its replica then stops it)."""

from __future__ import annotations

import dataclasses

import pytest

from fleetcron import AsyncFleet, Fleet
from fleetcron.cancel_request import default_requester
from fleetcron.errors import ConfigurationError
from fleetcron.models import RunRecord, SlotClaim
from fleetcron.schedules import to_datetime
from fleetcron.stores import SyncStore

MINUTE = 60_000_000
LONG = 60_000_000  # no attempt of these tests expires while they run


def _claim(store: SyncStore, namespace: str, job: str, slot_us: int) -> RunRecord:
    claim = SlotClaim(job=job, slot_us=slot_us, run_id=f"{job}-{slot_us}", exclusive=False)
    [answer] = store.run(store.ops.run_claim(namespace, [claim], "host-a:17:secret", LONG))
    assert answer.run is not None, answer
    return answer.run


def _row(store: SyncStore, namespace: str, job: str, slot_us: int) -> RunRecord:
    row = store.run(store.ops.run_get(namespace, job, slot_us))
    assert row is not None
    return dataclasses.replace(row, now_us=0)


def test_cancel_marks_the_slots_running_attempt_with_who_asked(fleet: Fleet) -> None:
    store, ns = fleet.store, fleet.namespace
    store.run(store.ops.job_register(ns, [("job", "{}", ""), ("other", "{}", "")]))
    now = store.run(store.ops.store_now())
    s1, s2 = now - 2 * MINUTE, now - MINUTE
    first, _second = _claim(store, ns, "job", s1), _claim(store, ns, "job", s2)
    _claim(store, ns, "other", s2)

    assert fleet.cancel("job", slot=to_datetime(s2), by="ops@host-a") == 1
    asked = _row(store, ns, "job", s2)
    assert (asked.state, asked.cancel_requested, asked.error) == (
        "running",
        True,
        "cancelled by ops@host-a",
    )
    assert _row(store, ns, "job", s1) == dataclasses.replace(first, now_us=0)

    assert fleet.cancel("job") == 2
    assert _row(store, ns, "job", s1).error == f"cancelled by {default_requester()}"
    assert "@" in default_requester()
    assert not _row(store, ns, "other", s2).cancel_requested
    assert fleet.cancel("job", slot=to_datetime(now - 3 * MINUTE)) == 0, "no such attempt"


def test_cancel_of_a_job_with_nothing_running_asks_none(fleet: Fleet) -> None:
    store, ns = fleet.store, fleet.namespace
    store.run(store.ops.job_register(ns, [("idle", "{}", "")]))
    assert fleet.cancel("idle", by="ops") == 0
    assert store.run(store.ops.run_list(ns, "idle", 10)) == []


def test_cancel_of_an_unknown_job_is_refused_naming_it(fleet: Fleet) -> None:
    with pytest.raises(ConfigurationError, match=r"no job 'nosuch' in namespace 't-"):
        fleet.cancel("nosuch")


async def test_the_async_fleet_asks_the_same(async_fleet: AsyncFleet) -> None:
    store, ns = async_fleet.store, async_fleet.namespace
    await store.run(store.ops.job_register(ns, [("job", "{}", "")]))
    now = await store.run(store.ops.store_now())
    claim = SlotClaim(job="job", slot_us=now - MINUTE, run_id="r", exclusive=False)
    [answer] = await store.run(store.ops.run_claim(ns, [claim], "host-a:17:secret", LONG))
    assert answer.run is not None

    slot = to_datetime(now - MINUTE)
    assert await async_fleet.cancel("job", slot=slot, by="web:10.0.0.7") == 1
    row = await store.run(store.ops.run_get(ns, "job", now - MINUTE))
    assert row is not None
    assert (row.cancel_requested, row.error) == (True, "cancelled by web:10.0.0.7")
    with pytest.raises(ConfigurationError, match="no job 'nosuch'"):
        await async_fleet.cancel("nosuch")
