"""``fleetcron locks [--json]``: every lease row of the namespace and, on PostgreSQL, the
session advisory locks held on their names (lock mode ``advisory``) with their sessions."""

from __future__ import annotations

import json
from collections.abc import Sequence

from fleetcron.durations import format_duration
from fleetcron.models import AdvisoryHold, LeaseRecord, micros_to_datetime
from fleetcron.status import shown_leases
from fleetcron.sync import Fleet

__all__ = ["print_locks"]


def print_locks(fleet: Fleet, as_json: bool) -> None:
    """Print the namespace's leases (a table, or a JSON array of one object per lease)."""
    records = shown_leases(fleet.locks())  # the monitor's alert markers lock nothing
    holds = fleet.advisory_locks([r.name for r in records])
    if as_json:
        print(json.dumps([_lease_json(r, holds) for r in records], indent=2))  # noqa: T201
        return
    if not records:
        print("no leases")  # noqa: T201
        return
    # MODE last: the columns before it are where scripts have read them from.
    header = ("NAME", "STATE", "HOLDER", "FENCE", "HELD FOR", "EXPIRES IN", "MODE")
    table = [header]
    for r in records:
        held = r.held
        table.append(
            (
                r.name,
                "held" if held else "free",
                r.holder_display if held else "-",
                str(r.fence),
                format_duration(r.now_us - r.acquired_us) if held else "-",
                format_duration(r.expires_us - r.now_us) if held else "-",
                r.mode if held else "-",
            )
        )
    _print_table(table)
    if holds:
        print()  # noqa: T201
        print("advisory locks held (PostgreSQL sessions):")  # noqa: T201
        sessions = [("NAME", "PID", "CLIENT", "APPLICATION", "SESSION SINCE", "HELD FOR")]
        sessions += [
            (
                hold.name,
                str(hold.pid),
                hold.client_addr or "-",
                hold.application_name or "-",
                _time(hold.backend_start_us) or "-",
                "-" if hold.held_for_us is None else format_duration(hold.held_for_us),
            )
            for hold in holds
        ]
        _print_table(sessions)


def _lease_json(r: LeaseRecord, holds: Sequence[AdvisoryHold]) -> dict[str, object]:
    return {
        "name": r.name,
        "holder": r.holder_display,
        "fence": r.fence,
        "held": r.held,
        "mode": r.mode if r.held else None,
        "acquired_at": r.acquired_at.isoformat(),
        "expires_at": r.expires_at.isoformat(),
        "held_for_s": round((r.now_us - r.acquired_us) / 1e6, 3) if r.held else None,
        "expires_in_s": round((r.expires_us - r.now_us) / 1e6, 3) if r.held else None,
        "advisory_sessions": [_hold_json(hold) for hold in holds if hold.name == r.name],
    }


def _hold_json(hold: AdvisoryHold) -> dict[str, object]:
    return {
        "pid": hold.pid,
        "client_addr": hold.client_addr,
        "application_name": hold.application_name,
        "session_started_at": _time(hold.backend_start_us),
        "held_since": _time(hold.held_since_us),
        "held_for_s": None if hold.held_for_us is None else round(hold.held_for_us / 1e6, 3),
    }


def _time(micros: int | None) -> str | None:
    return None if micros is None else micros_to_datetime(micros).isoformat()


def _print_table(table: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())  # noqa: T201
