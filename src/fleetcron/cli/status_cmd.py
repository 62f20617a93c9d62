"""``fleetcron status [--json] [--check] [JOB...]``: every job's health from the store.

Usable from a plain monitor on any host that reaches the store (Nagios, a Kubernetes
probe, a cron line): ``--check`` exits 1 when a selected job is overdue, failing or
stuck, 75 when the store cannot be reached.

A dead man's switch must not pass on a typo. ``status`` reads the store as it is and never
creates one (78: no store there); a job it does not know is exit 2, and so is a namespace
that holds nothing (no job, replica, queue or lease) and, for ``--check``, one with no job
to judge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TypeVar

from fleetcron.cli.elsewhere import elsewhere
from fleetcron.cli.exitcodes import EXIT_UNHEALTHY, EXIT_USAGE
from fleetcron.durations import format_duration
from fleetcron.models import display_holder
from fleetcron.names import NAMESPACE_ENV, resolve_namespace, validate_job_name
from fleetcron.schedules import iso_utc
from fleetcron.status import FINGERPRINT_SHOWN, FleetStatus, iso, read_status, status_json
from fleetcron.stores import open_existing_store, resolve_backend

__all__ = ["add_parser", "run"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


def add_parser(commands: argparse._SubParsersAction[_Parser], parents: Sequence[_Parser]) -> None:
    """Declare ``status``."""
    status = commands.add_parser(
        "status",
        parents=list(parents),
        help="the health of every job: overdue, failing, stuck, running",
        description="Each job's state from the store's ledger; --check for monitors.",
    )
    status.add_argument("jobs", nargs="*", metavar="JOB", help="only these jobs")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a job is overdue, failing or stuck; 2 when there is no job to "
        "judge (75: store unreachable)",
    )


def _ago(moment_us: int | None, now_us: int) -> str:
    if moment_us is None:
        return "-"
    seconds = max(0, now_us - moment_us) // 1_000_000
    return f"{format_duration(seconds * 1_000_000)} ago"


def _aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in rows
    ]


def _table(status: FleetStatus) -> list[str]:
    header = ("JOB", "STATE", "SCHEDULE", "NEXT", "LAST RUN", "LAST SUCCESS", "HOLDER", "AGE")
    rows = [header]
    for health in status.jobs:
        last = health.last_run
        last_text = "-" if last is None else f"{iso(last.slot_us)} {last.state}"
        running = health.running
        rows.append(
            (
                health.job,
                health.state,
                health.schedule,
                iso(health.next_slot_us) or "-",
                last_text,
                _ago(health.last_success_us, status.now_us),
                display_holder(running.holder) if running is not None else "-",
                format_duration(health.lease_age_us // 1_000_000 * 1_000_000)
                if health.lease_age_us is not None
                else "-",
            )
        )
    lines = _aligned(rows)
    lines += [f"{h.job}: {h.state}: {'; '.join(h.reasons)}" for h in status.unhealthy]
    if status.leader is not None:
        lines.append(f"leader: {status.leader.holder_display} (fence {status.leader.fence})")
    return lines


def _replicas(status: FleetStatus) -> list[str]:
    """The ``replicas:`` section: up, and gone (stopped beating) within the retention."""
    if not status.replicas:
        return []
    header = ("REPLICA", "MODE", "STATE", "VERSION", "STARTED", "LAST BEAT", "JOBS")
    rows = [header]
    rows += [
        (
            replica.replica_id,
            replica.mode,
            "up" if replica.alive else "gone",
            replica.version,
            iso_utc(replica.started_us),
            _ago(replica.last_seen_us, replica.now_us),
            replica.jobs_fingerprint[:FINGERPRINT_SHOWN],
        )
        for replica in status.replicas
    ]
    return ["replicas:", *_aligned(rows, "  "), *(f"note: {note}" for note in status.notes)]


def _queues(status: FleetStatus) -> list[str]:
    """The ``queues:`` section: each work queue's items by state, and the oldest wait."""
    if not status.queues:
        return []
    header = ("QUEUE", "READY", "SCHEDULED", "CLAIMED", "DONE", "DEAD", "OLDEST WAITING")
    rows = [header]
    rows += [
        (
            queue.queue,
            str(queue.ready),
            str(queue.scheduled),
            str(queue.claimed),
            str(queue.done),
            str(queue.dead),
            format_duration(queue.oldest_age_us) if queue.oldest_us is not None else "-",
        )
        for queue in status.queues
    ]
    return ["queues:", *_aligned(rows, "  ")]


def _empty(status: FleetStatus) -> bool:
    """Whether the namespace holds nothing at all: what a mistyped namespace reads."""
    return not (status.jobs or status.replicas or status.queues or status.leases)


def run(args: argparse.Namespace) -> int:
    """Print the status; with ``--check``, the exit status says whether all is well.

    Nothing to judge fails like a job the store does not know (exit 2, one line on
    stderr): ``--check`` with no job in the namespace, and any ``status`` of a namespace
    that holds nothing."""
    jobs = [validate_job_name(job) for job in args.jobs]
    explicit = getattr(args, "namespace", None)
    namespace = resolve_namespace(explicit)
    chosen = explicit is not None or bool(os.environ.get(NAMESPACE_ENV))
    store = open_existing_store(resolve_backend(getattr(args, "backend", None)))
    problem = None
    try:
        status = store.run(read_status(store.ops, namespace, jobs or None))
        if status.unknown_jobs:
            listed = ", ".join(status.unknown_jobs)
            problem = f"no job named {listed} in namespace {namespace!r}"
            if not status.jobs and not store.run(
                store.ops.job_page(namespace, "", 1, definitions=False)
            ):
                problem += f", which has no jobs ({elsewhere(store, namespace, chosen)})"
        elif not status.jobs and (args.check or _empty(status)):
            problem = (
                f"no jobs in namespace {namespace!r} for --check to judge"
                if args.check
                else f"namespace {namespace!r} holds nothing: no job, replica, queue or lease"
            )
            problem += f" ({elsewhere(store, namespace, chosen)})"
    finally:
        store.close()
    if problem is not None:
        print(f"fleetcron: error: {problem}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    if args.json:
        print(json.dumps(status_json(status), indent=2))  # noqa: T201
    else:
        lines = (
            _table(status)
            if status.jobs
            else [f"no jobs in namespace {namespace!r} (--namespace chooses another)"]
        )
        print("\n".join(lines + _replicas(status) + _queues(status)))  # noqa: T201
    if args.check and status.unhealthy:
        return EXIT_UNHEALTHY
    return 0
