"""``fleetcron cancel JOB [--slot T] [--by WHO] [--json]``: ask a job's running attempt to
stop, on whichever replica runs it (:mod:`fleetcron.cancel_request`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TypeVar

from fleetcron.cancel_request import cancel_note, default_requester
from fleetcron.cli.exitcodes import EXIT_NONE_RUNNING
from fleetcron.names import resolve_namespace, validate_job_name, validate_namespace
from fleetcron.schedules import iso_utc, parse_instant, to_datetime
from fleetcron.stores import open_existing_store, resolve_backend
from fleetcron.sync import Fleet

__all__ = ["add_parser", "run"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

_DESCRIPTION = """\
Ask the running attempts of JOB (with --slot, that slot's only) to stop. The replica
running each stops it within about a second, as on a lost lease: a command gets SIGTERM
to its process group, then SIGKILL after its kill grace; a Python job sees ctx.cancelled
(RunCancelled). The run is recorded `cancelled` with the error "cancelled by WHO".

Exit status: 0 when an attempt was asked, 1 when none was running (nothing to cancel),
2 for an unknown job or a bad --slot or --by."""


def add_parser(subparsers: argparse._SubParsersAction[_Parser], parents: Sequence[_Parser]) -> None:
    """Add ``cancel``."""
    cancel = subparsers.add_parser(
        "cancel",
        parents=list(parents),
        help="stop a job's running attempt, on whichever replica runs it",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cancel.add_argument("job", metavar="JOB")
    cancel.add_argument(
        "--slot",
        metavar="T",
        help="only the attempt of this slot (ISO 8601 as `fleetcron runs` shows it; "
        "without an offset, UTC)",
    )
    cancel.add_argument(
        "--by",
        metavar="WHO",
        help="who asks, kept in the run's outcome (default: USER@HOST of this shell)",
    )
    cancel.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    """``fleetcron cancel``: every argument is checked before the store is opened."""
    job = validate_job_name(args.job)
    slot_us = None if args.slot is None else parse_instant(args.slot, "--slot")
    by = default_requester() if args.by is None else args.by.strip()
    cancel_note(by, "--by")
    explicit: str | None = getattr(args, "namespace", None)
    if explicit is not None:
        validate_namespace(explicit)  # an explicit --namespace '' is an error, not 'default'
    namespace = resolve_namespace(explicit)
    store = open_existing_store(resolve_backend(getattr(args, "backend", None)))
    try:
        with Fleet(store, namespace=namespace) as fleet:
            slot = None if slot_us is None else to_datetime(slot_us)
            asked = fleet.cancel(job, slot=slot, by=by)
    finally:
        store.close()
    shown = None if slot_us is None else iso_utc(slot_us)
    if args.json:
        print(json.dumps({"job": job, "slot": shown, "asked": asked, "by": by}, indent=2))  # noqa: T201
    elif asked:
        at = "" if shown is None else f" (slot {shown})"
        which = "it stops" if asked == 1 else "they stop"
        print(  # noqa: T201
            f"asked {asked} running attempt{'s' if asked > 1 else ''} of {job} to stop{at}; "
            f"{which} within about a second, recorded cancelled by {by}"
        )
    else:
        at = "" if shown is None else f" at slot {shown}"
        print(f"{job} has no running attempt{at} (nothing to cancel)")  # noqa: T201
    return 0 if asked else EXIT_NONE_RUNNING
