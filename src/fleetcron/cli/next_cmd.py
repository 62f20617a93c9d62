"""``fleetcron next CRON``: preview the fire times of a cron expression, DST effects shown.

Needs no store. One line per fire time: the slot in UTC, the local wall time with its
offset and zone abbreviation, and a note where daylight saving changes what happens::

    2025-03-30T01:00:00Z  2025-03-30 03:00:00+02:00 CEST  DST gap 02:00–03:00 on 2025-03-30: ...
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from fleetcron.clock import SYSTEM_CLOCK
from fleetcron.errors import ConfigurationError
from fleetcron.schedules import PreviewEntry, from_datetime, parse_timezone, preview

__all__ = ["DEFAULT_COUNT", "MAX_COUNT", "add_parser", "run"]

DEFAULT_COUNT = 10
MAX_COUNT = 1000

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


def add_parser(
    subparsers: argparse._SubParsersAction[_Parser],
    parents: Sequence[_Parser],
) -> _Parser:
    """Add the ``next`` command to ``subparsers`` and return its parser."""
    parser = subparsers.add_parser(
        "next",
        parents=list(parents),
        help="preview the fire times of a cron expression (DST shown)",
        description="Print the next fire times of CRON, in UTC and local time, with DST notes.",
        usage="fleetcron next CRON [--timezone TZ] [--count N] [--after TIME] [--json]",
    )
    parser.add_argument(
        "cron",
        nargs="+",
        metavar="CRON",
        help="5-field cron expression (quote it, or give the five fields as arguments)",
    )
    parser.add_argument("--timezone", default="UTC", metavar="TZ", help="IANA zone (default UTC)")
    parser.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT,
        metavar="N",
        help=f"how many fire times (default {DEFAULT_COUNT}, at most {MAX_COUNT})",
    )
    parser.add_argument(
        "--after",
        metavar="TIME",
        help="start after this ISO 8601 time (naive = in --timezone; default: now)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _after_us(text: str | None, timezone: str) -> int:
    if text is None:
        return SYSTEM_CLOCK.wall_us()
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(f"--after: {text!r} is not an ISO 8601 date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=parse_timezone(timezone))
    return from_datetime(moment)


def _utc_text(entry: PreviewEntry) -> str:
    return entry.utc.isoformat().removesuffix("+00:00") + "Z"


def _local_text(entry: PreviewEntry) -> str:
    return f"{entry.local.isoformat(sep=' ')} {entry.local.tzname() or ''}".rstrip()


def run(args: argparse.Namespace) -> int:
    """Print the preview for parsed ``next`` arguments; return the exit status."""
    count: int = args.count
    if not 1 <= count <= MAX_COUNT:
        raise ConfigurationError(f"--count must be between 1 and {MAX_COUNT}, got {count}")
    expression = " ".join(args.cron)
    timezone: str = args.timezone
    parse_timezone(timezone)
    try:
        entries = preview(expression, timezone, count, _after_us(args.after, timezone))
    except OverflowError:
        raise ConfigurationError(
            "--after: the fire times run past the calendar's range (years 1 to 9999)"
        ) from None
    if args.json:
        rows = [
            {
                "slot": _utc_text(entry),
                "slot_us": entry.slot_us,
                "local": entry.local.isoformat(),
                "zone": entry.local.tzname(),
                "dst": entry.dst,
                "note": entry.note or None,
            }
            for entry in entries
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))  # noqa: T201
        return 0
    locals_ = [_local_text(entry) for entry in entries]
    width = max((len(text) for text in locals_), default=0)
    for entry, local in zip(entries, locals_, strict=True):
        line = f"{_utc_text(entry)}  {local.ljust(width)}  {entry.note}"
        print(line.rstrip())  # noqa: T201
    return 0
