"""The processes a scenario runs: lock contenders and the body of a scheduled job.

Each logs what it did to its own history file (:mod:`fault.history`), one JSON line per
event, flushed at once, so a SIGKILLed worker's history survives up to its last event.

``python -m fault.workers locker …``
    Contends for one lease until ``--duration-s`` has passed: try to take it, and while it
    holds it make ``--writes`` protected writes (each after checking that the lease is
    still valid, as a careful holder does), optionally renewing it halfway, then release.
    It prints ``ready`` once connected and starts at the first line read from stdin, so
    every contender starts together.

``python -m fault.workers jobbody HISTORY PROTECTED WORK_S``
    The command of a scheduled job (``fleetcron run`` starts it with the run's slot and
    fence in its environment): logs ``run_start``, a protected write, signs of life while it
    works for ``WORK_S`` seconds, and ``run_end``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path

from fault.history import HistoryWriter
from fault.protected import ProtectedResource
from fleetcron import Fleet
from fleetcron.errors import FleetcronError, LeaseLost
from fleetcron.lease import Lease

__all__ = ["main"]


def _mono_s() -> float:
    return time.monotonic()


def locker(args: argparse.Namespace) -> int:
    """One contender (see the module docstring)."""
    writer = HistoryWriter(Path(args.history), args.worker)
    resource = ProtectedResource(Path(args.protected))
    name = args.name
    ttl = f"{args.ttl_ms}ms"
    pause_s = args.hold_ms / 1000 / max(args.writes, 1)
    with Fleet(args.url, namespace=args.namespace) as fleet:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        until = _mono_s() + args.duration_s
        while _mono_s() < until:
            writer.log("acquire_invoke", name)
            try:
                lease = fleet.try_lock(name, lock_at_most=ttl, keepalive=args.keepalive)
            except FleetcronError as error:
                writer.log("acquire_error", name, error=str(error))
                time.sleep(args.backoff_ms / 1000)
                continue
            if lease is None:
                writer.log("acquire_refused", name)
                time.sleep(args.backoff_ms / 1000)
                continue
            record = lease.record
            writer.log(
                "acquire_ok",
                name,
                store_us=record.acquired_us,
                fence=lease.fence,
                expires_us=record.expires_us,
                holder=lease.holder,
                deadline_mono_us=lease.deadline_us,
            )
            _hold(writer, resource, lease, name, args, pause_s)
    writer.close()
    return 0


def _hold(
    writer: HistoryWriter,
    resource: ProtectedResource,
    lease: Lease,
    name: str,
    args: argparse.Namespace,
    pause_s: float,
) -> None:
    fence = lease.fence
    seen_expiry = lease.record.expires_us
    for index in range(args.writes):
        if args.extend and index == args.writes // 2:
            writer.log("extend_invoke", name, fence=fence)
            try:
                lease.extend()
            except LeaseLost as error:
                writer.log("extend_lost", name, fence=fence, error=str(error))
                writer.log("stopped", name, fence=fence)
                return
            except FleetcronError as error:
                writer.log("extend_error", name, fence=fence, error=str(error))
            else:
                record = lease.record
                seen_expiry = record.expires_us
                writer.log(
                    "extend_ok",
                    name,
                    fence=fence,
                    store_us=record.now_us,
                    expires_us=record.expires_us,
                    deadline_mono_us=lease.deadline_us,
                )
        if not lease.valid:
            writer.log("stopped", name, fence=fence, reason="lease no longer valid")
            return
        seen_expiry = _log_renewal(writer, lease, seen_expiry)
        writer.log("alive", name, fence=fence)
        accepted = True
        with contextlib.suppress(sqlite3.Error):  # logged as write_error by the resource
            accepted = resource.write(writer, name, fence)
        if not accepted:
            # A newer fence wrote: the lease is someone else's, whatever this process's
            # clock says (the store's clock stepped forward). Never written again.
            writer.log("stopped", name, fence=fence, reason="write rejected as stale")
            return
        time.sleep(pause_s)
    writer.log("release_invoke", name, fence=fence)
    try:
        released = lease.release()
    except FleetcronError as error:
        writer.log("release_error", name, fence=fence, error=str(error))
    else:
        writer.log("release_ok" if released else "release_lost", name, fence=fence)
    writer.log("stopped", name, fence=fence)


def _log_renewal(writer: HistoryWriter, lease: Lease, seen_expiry: int) -> int:
    """Log a renewal the keepalive made since the last look, as an ``extend_ok`` stamped
    now: later than the answer came, which only gives the holder more slack, so the checker
    can still trust every anomaly it finds."""
    record = lease.record
    if record.expires_us != seen_expiry:
        writer.log(
            "extend_ok",
            lease.name,
            fence=lease.fence,
            store_us=record.now_us,
            expires_us=record.expires_us,
            deadline_mono_us=lease.deadline_us,
            keepalive=True,
        )
    return record.expires_us


def jobbody(args: argparse.Namespace) -> int:
    """The command of a scheduled job (see the module docstring)."""
    job = os.environ["FLEETCRON_JOB"]
    fence = int(os.environ["FLEETCRON_FENCE"])
    slot_us = int(datetime.fromisoformat(os.environ["FLEETCRON_SLOT"]).timestamp() * 1_000_000)
    worker = f"{os.environ.get('FAULT_REPLICA', 'replica')}/{os.getpid()}"
    writer = HistoryWriter(Path(args.history), worker)
    resource = ProtectedResource(Path(args.protected))
    writer.log(
        "run_start", job, fence=fence, slot_us=slot_us, run_id=os.environ["FLEETCRON_RUN_ID"]
    )
    accepted = resource.write(writer, job, fence, slot_us=slot_us)
    until = _mono_s() + args.work_s
    while True:
        writer.log("run_alive", job, fence=fence, slot_us=slot_us)
        left = until - _mono_s()
        if left <= 0:
            break
        time.sleep(min(0.05, left))
    writer.log("run_end", job, fence=fence, slot_us=slot_us, outcome="ok" if accepted else "stale")
    writer.close()
    return 0 if accepted else 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fault.workers")
    roles = parser.add_subparsers(dest="role", required=True)
    lock = roles.add_parser("locker")
    lock.add_argument("--url", required=True)
    lock.add_argument("--namespace", required=True)
    lock.add_argument("--name", required=True)
    lock.add_argument("--worker", required=True)
    lock.add_argument("--history", required=True)
    lock.add_argument("--protected", required=True)
    lock.add_argument("--ttl-ms", type=int, default=2000)
    lock.add_argument("--hold-ms", type=int, default=20)
    lock.add_argument("--writes", type=int, default=2)
    lock.add_argument("--duration-s", type=float, default=3.0)
    lock.add_argument("--backoff-ms", type=int, default=5)
    lock.add_argument("--keepalive", action="store_true")
    lock.add_argument("--extend", action="store_true")
    body = roles.add_parser("jobbody")
    body.add_argument("history")
    body.add_argument("protected")
    body.add_argument("work_s", type=float)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one worker role; the exit status is the worker's."""
    args = _parser().parse_args(argv)
    if args.role == "locker":
        return locker(args)
    return jobbody(args)


if __name__ == "__main__":
    sys.exit(main())
