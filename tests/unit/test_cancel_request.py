"""What a cancel request accepts: who asked, the slot, the job; anything else is refused
with what is wrong, before the store is touched."""

from __future__ import annotations

import dataclasses
import getpass
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from fleetcron import Fleet
from fleetcron.cancel_request import (
    MAX_REQUESTER_LENGTH,
    cancel_note,
    default_requester,
    requested_slot,
)
from fleetcron.errors import ConfigurationError
from fleetcron.models import SlotClaim
from fleetcron.schedules import from_datetime, parse_instant
from fleetcron.stores.memory import MemoryStore

NS = "cancel"
SLOT = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def test_the_note_names_who_asked() -> None:
    assert cancel_note("ops@host-a") == "cancelled by ops@host-a"
    assert cancel_note("  web:10.0.0.7 ") == "cancelled by web:10.0.0.7"
    assert cancel_note("Jürgen ☃") == "cancelled by Jürgen ☃"
    assert cancel_note("x" * MAX_REQUESTER_LENGTH) == "cancelled by " + "x" * 200


@pytest.mark.parametrize(
    ("by", "said"),
    [
        ("", "it is empty"),
        ("   ", "it is empty"),
        ("ops\nforged line", "one line"),
        ("ops\x1b[31m", "one line"),
        ("ops\u202egnp.exe", "one line"),
        ("ops\u2028forged", "one line"),
        ("ops\udcff", "one line"),
        ("x" * (MAX_REQUESTER_LENGTH + 1), "at most 200 characters"),
        (7, "must be a string, not int"),
    ],
)
def test_a_bad_requester_is_refused_saying_why(by: object, said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        cancel_note(by)


def test_the_default_requester_is_user_at_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_requester() == f"{getpass.getuser()}@{socket.gethostname()}"

    def nobody() -> str:
        raise OSError("no username set in the environment")

    monkeypatch.setattr(getpass, "getuser", nobody)
    assert default_requester() == f"unknown@{socket.gethostname()}"


def test_the_slot_is_an_aware_datetime() -> None:
    assert requested_slot(None) is None
    assert requested_slot(SLOT) == from_datetime(SLOT)
    berlin = SLOT.astimezone(timezone(timedelta(hours=1)))
    assert requested_slot(berlin) == from_datetime(SLOT)
    with pytest.raises(ConfigurationError, match="has no time zone"):
        requested_slot(datetime(2026, 3, 1, 8, 0))
    with pytest.raises(ConfigurationError, match="slot must be a datetime, not str"):
        requested_slot("2026-03-01T08:00:00Z")


def test_an_iso_time_is_read_as_slots_are_written() -> None:
    micros = from_datetime(SLOT)
    assert parse_instant("2026-03-01T08:00:00Z", "--slot") == micros
    assert parse_instant("2026-03-01T08:00:00", "--slot") == micros, "naive is UTC"
    assert parse_instant("2026-03-01T09:00:00+01:00", "--slot") == micros
    assert parse_instant("2026-03-01T08:00:00.000001Z", "--slot") == micros + 1
    for text in ("yesterday", "", "2026-13-01", "2026-03-01T08:00:00 UTC"):
        with pytest.raises(ConfigurationError, match=f"--slot: {text!r} is not an ISO 8601"):
            parse_instant(text, "--slot")


def test_a_refused_request_changes_nothing() -> None:
    store = MemoryStore()
    store.run(store.ops.job_register(NS, [("job", "{}", "")]))
    slot = store.run(store.ops.store_now()) - 60_000_000
    claim = SlotClaim(job="job", slot_us=slot, run_id="r", exclusive=False)
    store.run(store.ops.run_claim(NS, [claim], "h:1:t", 60_000_000))
    before = store.run(store.ops.run_get(NS, "job", slot))
    with Fleet(store, namespace=NS) as fleet:
        refused: list[Callable[[], int]] = [
            lambda: fleet.cancel("job", by="a\nb"),
            lambda: fleet.cancel("job", slot=datetime(2026, 3, 1)),
            lambda: fleet.cancel(" bad name"),
            lambda: fleet.cancel("nosuch"),
        ]
        for attempt in refused:
            with pytest.raises(ConfigurationError):
                attempt()
    after = store.run(store.ops.run_get(NS, "job", slot))
    assert before is not None
    assert after is not None
    assert not after.cancel_requested
    assert dataclasses.replace(after, now_us=0) == dataclasses.replace(before, now_us=0)
